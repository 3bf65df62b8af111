"""The house's plan, read from the imports of ssd_edge/, tui/ and scripts/ (ast: every import, the lazy
ones inside functions and under TYPE_CHECKING too). It fails on
  - a module that no part claims (a new folder is not silently a face), or a part of the plan that is
    not a folder or a top-level module, or claims nothing;
  - an arrow up the layers: a module imports a part on a higher layer;
  - a forbidden pair: a part importing another part of its own layer where that layer's parts stand
    apart (APART: on the speculation layer, and one face importing another: server -> cli, ssd_edge -> tui),
    but for the arrows in ALLOWED;
  - a loop between parts (folders), and a cycle between modules;
  - a private name (`_x`, or a module `_x`) imported across modules.
Each check is shown failing on a fabricated tree (the tests at the bottom). docs/design.md's "Layout"
section is the map of the same tree."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("ssd_edge", "tui", "scripts")  # the folders read; ssd_edge and tui are packages, scripts are files

# ---------------------------------------------------------------- the plan

LEAF, ADAPTER, SPECULATION, PLANNING, ENGINE, MEASURE, FACES, TOOLS = range(8)
NAMES = ["leaf", "adapter", "speculation", "planning", "engine", "measure", "faces", "tools"]

# The layer of every part, bottom (LEAF) to top. A part is a folder ("x/y/": every module in it) or a
# module at the top of a source folder ("x/y.py"). A module may import its own part, or a part on its own
# layer or below, never one above.
LAYERS = {
    **{f"ssd_edge/{m}.py": LEAF for m in ("config", "events", "errors", "metrics", "memory", "interface", "paths",
                                          "progress", "sampling", "coupling", "verify", "stats_text", "stops")},
    "ssd_edge/csrc/": LEAF,              # compiled (ssd_edge.native): a row's top-k and draws, plain steps, a busy wait
    "ssd_edge/llama/": ADAPTER, "ssd_edge/models/": ADAPTER,
    "ssd_edge/options.py": LEAF,          # the flags' table that cli and server share
    "ssd_edge/settings.py": ADAPTER,      # the flags' layers and their EngineConfig; reads the catalog
    "ssd_edge/infill.py": ADAPTER,        # fill-in-the-middle prompts in a model's own FIM tokens
    "ssd_edge/speculation/": SPECULATION,
    "ssd_edge/structured/": SPECULATION,  # constraints, their tokenizer, a row's shaping, tool calls (llguidance)
    "ssd_edge/planning/": PLANNING,       # costs, planner, rounds, profile: what each round does
    "ssd_edge/engine.py": ENGINE,
    "ssd_edge/pair.py": ENGINE,           # the loaded target and draft, load and release
    "ssd_edge/generation.py": ENGINE,     # one answer's state: history, room, stop text, meter, drawer
    "ssd_edge/bench/": MEASURE,           # drives the engine from above; priced/: a backend that waits a GPU's prices
    "ssd_edge/cli/": FACES, "ssd_edge/server/": FACES, "tui/": FACES,
    "ssd_edge/__init__.py": FACES,        # the Python API: Engine, configs, events
    "scripts/": TOOLS,
}

# On these layers the parts stand apart: none imports another, but for the arrows in ALLOWED.
APART = {SPECULATION, FACES}
ALLOWED = {("ssd_edge/cli/", "ssd_edge/server/")}          # `ssd-edge serve` starts the server

# Known, being moved (issue #21): these arrows (importer, imported module) pass every check until they are
# gone; an entry that no longer matches an import fails, so the list is emptied as they move.
KNOWN: set[tuple[str, str]] = set()


# ---------------------------------------------------------------- reading a tree

@dataclass(frozen=True)
class Import:
    target: str        # the module imported (`from pkg import sub` imports pkg.sub when that is a module)
    name: str | None   # the name taken from it, None for the module itself
    line: int


@dataclass
class Tree:
    paths: dict[str, str]                                   # module name -> path from the root ("ssd_edge/x.py")
    imports: dict[str, list[Import]] = field(default_factory=dict)


# C sources are modules of the tree too, named by their paths (ssd_edge.csrc.rows), but for the file that
# defines an extension module (setup.py: ssd_edge/csrc/*.c build one, ssd_edge.native), named by it: the
# Python that imports ssd_edge.native imports that part.
EXTENSIONS = {"ssd_edge/csrc/module.c": "ssd_edge.native"}


def module_name(rel: Path) -> str:
    if rel.as_posix() in EXTENSIONS:
        return EXTENSIONS[rel.as_posix()]
    parts = rel.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_tree(root: Path, sources: tuple[str, ...] = SOURCES) -> Tree:
    # modules: Python files, and C sources (EXTENSIONS)
    files = sorted(p for s in sources for ext in ("*.py", "*.c") for p in (root / s).rglob(ext)
                   if "__pycache__" not in p.parts)
    tree = Tree({module_name(p.relative_to(root)): p.relative_to(root).as_posix() for p in files})
    packages = {m.split(".")[0] for m, p in tree.paths.items() if p.endswith("__init__.py")}
    for mod, rel in tree.paths.items():
        tree.imports[mod] = imports_of(mod, root / rel, tree.paths, packages) if rel.endswith(".py") else []
    return tree


def imports_of(mod: str, path: Path, modules: dict[str, str], packages: set[str]) -> list[Import]:
    """Every import in `mod` of a module of the tree's packages."""
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]

    def known(name: str) -> str:  # the module itself, or the closest package above it that the tree holds
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [Import(known(a.name), None, node.lineno) for a in node.names
                    if a.name.split(".")[0] in packages and known(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] not in packages:
                continue
            for a in node.names:
                sub = f"{source}.{a.name}"
                out.append(Import(sub, None, node.lineno) if sub in modules else
                           Import(known(source), a.name, node.lineno))
    return out


def part(path: str, layers: dict[str, int]) -> str | None:
    """The part of the plan that claims the module at `path` (the longest key), or None."""
    claims = [k for k in layers if path == k or (k.endswith("/") and path.startswith(k))]
    return max(claims, key=len) if claims else None


def arrows(tree: Tree, known: set[tuple[str, str]]) -> list[tuple[str, Import]]:
    """(importer, import) for every import between two modules, less the known ones."""
    return [(m, i) for m, imps in tree.imports.items() for i in imps
            if i.target != m and (m, i.target) not in known]


# ---------------------------------------------------------------- the checks (each returns what is wrong)

def unclaimed(tree: Tree, layers: dict[str, int]) -> list[str]:
    wrong = [f"{p}: no part of the plan claims it" for p in tree.paths.values() if part(p, layers) is None]
    for key in layers:
        if key.endswith("/"):
            if any(k != key and k.endswith("/") and key.startswith(k) for k in layers):
                wrong.append(f"{key}: a part inside another part")
        elif key.count("/") != 1:
            wrong.append(f"{key}: a part is a folder or a module at the top of a source folder")
        if not any(part(p, layers) == key for p in tree.paths.values()):
            wrong.append(f"{key}: a part of the plan that claims no module")
    return wrong


def up_arrows(tree: Tree, layers: dict[str, int], known: set[tuple[str, str]] = frozenset()) -> list[str]:
    out = []
    for m, i in arrows(tree, known):
        a, b = layers[part(tree.paths[m], layers)], layers[part(tree.paths[i.target], layers)]
        if b > a:
            out.append(f"{m}:{i.line} ({NAMES[a]}) imports {i.target} ({NAMES[b]})")
    return list(dict.fromkeys(out))  # one line per import statement


def forbidden_pairs(tree: Tree, layers: dict[str, int], apart: set[int] = APART,
                    allowed: set[tuple[str, str]] = ALLOWED, known: set[tuple[str, str]] = frozenset()) -> list[str]:
    out = []
    for m, i in arrows(tree, known):
        a, b = part(tree.paths[m], layers), part(tree.paths[i.target], layers)
        if a != b and layers[a] == layers[b] in apart and (a, b) not in allowed:
            out.append(f"{m}:{i.line} imports {i.target}: {a} and {b} stand apart ({NAMES[layers[a]]})")
    return list(dict.fromkeys(out))


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in state and (cycle := visit(t)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def part_loop(tree: Tree, layers: dict[str, int], known: set[tuple[str, str]] = frozenset()) -> list[str]:
    """A loop between parts (folders, top-level modules), each arrow named by one import that makes it."""
    graph: dict[str, set[str]] = {}
    why: dict[tuple[str, str], str] = {}
    for m, i in arrows(tree, known):
        a, b = part(tree.paths[m], layers), part(tree.paths[i.target], layers)
        if a != b:
            graph.setdefault(a, set()).add(b)
            why.setdefault((a, b), f"{m}:{i.line} imports {i.target}")
    cycle = find_cycle(graph)
    return [] if cycle is None else [" -> ".join(cycle) + "; " + "; ".join(why[e] for e in zip(cycle, cycle[1:]))]


def module_cycle(tree: Tree, known: set[tuple[str, str]] = frozenset()) -> list[str]:
    graph: dict[str, set[str]] = {}
    for m, i in arrows(tree, known):
        graph.setdefault(m, set()).add(i.target)
    cycle = find_cycle(graph)
    return [] if cycle is None else ["import cycle: " + " -> ".join(cycle)]


def private_imports(tree: Tree) -> list[str]:
    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    out = []
    for m, imps in tree.imports.items():
        for i in imps:
            if i.target != m and i.name and private(i.name):
                out.append(f"{m}:{i.line} imports {i.name} from {i.target}")
            if any(private(p) for p in i.target.split(".")):
                out.append(f"{m}:{i.line} imports the private module {i.target}")
    return out


def stale_known(tree: Tree, known: set[tuple[str, str]]) -> list[str]:
    seen = {(m, i.target) for m, imps in tree.imports.items() for i in imps}
    return [f"{m} no longer imports {t}: remove it from KNOWN" for m, t in sorted(known - seen)]


# ---------------------------------------------------------------- the tree of this repository

@pytest.fixture(scope="module")
def house() -> Tree:
    return read_tree(ROOT)


def test_every_module_is_claimed_by_a_part(house):
    assert not unclaimed(house, LAYERS), "\n".join(unclaimed(house, LAYERS))


def test_imports_never_go_up_a_layer(house):
    wrong = up_arrows(house, LAYERS, KNOWN)
    assert not wrong, "\n".join(wrong)


def test_parts_that_stand_apart_do_not_import_each_other(house):
    wrong = forbidden_pairs(house, LAYERS, known=KNOWN)
    assert not wrong, "\n".join(wrong)


def test_no_loop_between_parts_and_no_cycle_between_modules(house):
    """Counting lazy imports: a cycle hidden inside a function is still a cycle in the plan."""
    wrong = part_loop(house, LAYERS, KNOWN) + module_cycle(house, KNOWN)
    assert not wrong, "\n".join(wrong)


def test_no_private_name_is_imported_across_modules(house):
    wrong = private_imports(house)
    assert not wrong, "\n".join(wrong)


def test_the_known_list_holds_only_arrows_still_there(house):
    wrong = stale_known(house, KNOWN)
    assert not wrong, "\n".join(wrong)


def test_the_reader_sees_every_kind_of_import(house):
    """The tree is read as it is: a `from` import of a name, a lazy import inside a function, a relative one,
    each of the three source folders, and the compiled extension (EXTENSIONS)."""
    def seen(mod: str) -> set[tuple[str, str | None]]:
        return {(i.target, i.name) for i in house.imports[mod]}
    assert ("ssd_edge.llama.kvseq", "KVSeq") in seen("ssd_edge.speculation.drafters")
    assert ("ssd_edge.engine", "Engine") in seen("tui.loader")      # lazy, inside a function
    assert ("ssd_edge.settings", None) in seen("ssd_edge.cli.app")  # `from .. import settings`
    assert ("ssd_edge.cli.loader", "load_engine") in seen("scripts.bench_serve")
    assert ("ssd_edge.native", "top_ids") in seen("ssd_edge.sampling")    # the extension, built from ssd_edge/csrc/
    assert not [i for m in house.paths if m.startswith("ssd_edge") for i in house.imports[m]
                if i.target.split(".")[0] == "tui"]  # ssd_edge reaches the TUI by its entry point only


# ---------------------------------------------------------------- each check fails on a fabricated tree

def fabricated(root: Path, files: dict[str, str]) -> Tree:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return read_tree(root, ("ssd_edge", "tui"))


BASE = {"ssd_edge/__init__.py": "", "ssd_edge/config.py": "", "ssd_edge/engine.py": "from .config import X\n",
        "ssd_edge/cli/__init__.py": "", "ssd_edge/cli/commands.py": "from ..engine import Engine\n",
        "ssd_edge/server/__init__.py": "", "ssd_edge/server/app.py": "",
        "ssd_edge/speculation/__init__.py": "", "ssd_edge/speculation/drafters.py": "",
        "ssd_edge/auto/__init__.py": "", "ssd_edge/auto/planner.py": "",
        "tui/__init__.py": "", "tui/app.py": "from ssd_edge.engine import Engine\n"}
PLAN = {"ssd_edge/__init__.py": FACES, "ssd_edge/config.py": LEAF, "ssd_edge/engine.py": ENGINE,
        "ssd_edge/cli/": FACES, "ssd_edge/server/": FACES, "ssd_edge/speculation/": SPECULATION,
        "ssd_edge/auto/": SPECULATION, "tui/": FACES}


def all_checks(tree: Tree, layers: dict[str, int], known: set[tuple[str, str]] = frozenset()) -> list[str]:
    return (unclaimed(tree, layers) + up_arrows(tree, layers, known) + forbidden_pairs(tree, layers, known=known)
            + part_loop(tree, layers, known) + module_cycle(tree, known) + private_imports(tree)
            + stale_known(tree, known))


def test_the_fabricated_base_tree_passes(tmp_path):
    assert all_checks(fabricated(tmp_path, BASE), PLAN) == []


def test_a_folder_no_part_claims_fails(tmp_path):
    """The package itself claims only its __init__: a new folder is not silently a face."""
    tree = fabricated(tmp_path, {**BASE, "ssd_edge/newpart/__init__.py": "", "ssd_edge/newpart/x.py": ""})
    assert unclaimed(tree, PLAN) == ["ssd_edge/newpart/__init__.py: no part of the plan claims it",
                                     "ssd_edge/newpart/x.py: no part of the plan claims it"]
    assert unclaimed(tree, {**PLAN, "ssd_edge/newpart/": ADAPTER, "ssd_edge/gone/": LEAF,
                            "ssd_edge/cli/commands.py": FACES, "ssd_edge/cli/sub/": FACES}) == [
        "ssd_edge/gone/: a part of the plan that claims no module",
        "ssd_edge/cli/commands.py: a part is a folder or a module at the top of a source folder",
        "ssd_edge/cli/sub/: a part inside another part",
        "ssd_edge/cli/sub/: a part of the plan that claims no module"]


def test_an_arrow_up_the_layers_fails(tmp_path):
    tree = fabricated(tmp_path, {**BASE, "ssd_edge/config.py": "def f():\n    from .cli import commands\n"})
    assert up_arrows(tree, PLAN) == ["ssd_edge.config:2 (leaf) imports ssd_edge.cli.commands (faces)"]


def test_a_forbidden_pair_within_a_layer_fails(tmp_path):
    tree = fabricated(tmp_path, {
        **BASE, "ssd_edge/server/app.py": "from ..cli.commands import run\n",               # server -> cli
        "ssd_edge/cli/commands.py": "from ..server import app\nimport tui.app\n",           # cli -> server: allowed
        "ssd_edge/speculation/drafters.py": "from ssd_edge.auto.planner import Plan\n"})    # speculation -> auto
    assert forbidden_pairs(tree, PLAN) == [
        "ssd_edge.cli.commands:2 imports tui.app: ssd_edge/cli/ and tui/ stand apart (faces)",
        "ssd_edge.server.app:1 imports ssd_edge.cli.commands: ssd_edge/server/ and ssd_edge/cli/ stand apart (faces)",
        "ssd_edge.speculation.drafters:1 imports ssd_edge.auto.planner: ssd_edge/speculation/ and ssd_edge/auto/ "
        "stand apart (speculation)"]
    assert forbidden_pairs(tree, PLAN, allowed=set()) == [  # without ALLOWED, cli -> server is one too
        "ssd_edge.cli.commands:1 imports ssd_edge.server.app: ssd_edge/cli/ and ssd_edge/server/ stand apart "
        "(faces)", *forbidden_pairs(tree, PLAN)]


def test_a_loop_between_folders_fails_where_modules_have_no_cycle(tmp_path):
    tree = fabricated(tmp_path, {
        **BASE, "ssd_edge/auto/planner.py": "from ..engine import Engine\n",
        "ssd_edge/engine.py": "def plan():\n    from .auto import profile\n", "ssd_edge/auto/profile.py": ""})
    assert module_cycle(tree) == []
    assert part_loop(tree, PLAN) == [
        "ssd_edge/auto/ -> ssd_edge/engine.py -> ssd_edge/auto/; ssd_edge.auto.planner:1 imports ssd_edge.engine; "
        "ssd_edge.engine:2 imports ssd_edge.auto.profile"]


def test_a_cycle_between_modules_fails(tmp_path):
    tree = fabricated(tmp_path, {**BASE, "ssd_edge/auto/planner.py": "from . import profile\n",
                                 "ssd_edge/auto/profile.py": "from .planner import plan\n"})
    assert module_cycle(tree) == ["import cycle: ssd_edge.auto.planner -> ssd_edge.auto.profile -> "
                                  "ssd_edge.auto.planner"]


def test_a_private_name_across_modules_fails(tmp_path):
    tree = fabricated(tmp_path, {**BASE, "ssd_edge/cli/commands.py": "from ..engine import _Text\n",
                                 "ssd_edge/cli/_hidden.py": "", "tui/app.py": "from ssd_edge.cli import _hidden\n"})
    assert private_imports(tree) == ["ssd_edge.cli.commands:1 imports _Text from ssd_edge.engine",
                                     "tui.app:1 imports the private module ssd_edge.cli._hidden"]


def test_a_known_arrow_passes_until_it_is_gone(tmp_path):
    files = {**BASE, "ssd_edge/auto/calibrate.py": "from ..engine import Engine\n",
             "ssd_edge/engine.py": "from .auto import planner\n"}
    known = {("ssd_edge.auto.calibrate", "ssd_edge.engine")}
    tree = fabricated(tmp_path, files)
    assert up_arrows(tree, PLAN) and part_loop(tree, PLAN)  # what the known arrow hides
    assert all_checks(tree, PLAN, known) == []
    tree = fabricated(tmp_path, {**files, "ssd_edge/auto/calibrate.py": ""})  # moved: the entry must go
    assert all_checks(tree, PLAN, known) == [
        "ssd_edge.auto.calibrate no longer imports ssd_edge.engine: remove it from KNOWN"]
