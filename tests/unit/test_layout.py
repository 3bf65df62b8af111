"""The package's plan, read from its imports (ast, every import, lazy ones inside functions too):
every module lives in the folder of its part or is a named top-level leaf; imports go one way,
faces -> measure -> engine -> speculation -> adapter -> leaves; no cycle; no private name
imported across modules. README's "Layout" section is the map of the same tree."""

from __future__ import annotations

import ast
from pathlib import Path


PKG = Path(__file__).resolve().parents[2] / "ssd_edge"

# Top-level modules: typed data and pure maths that import nothing but each other (LEAF), and the
# engine itself, which every part is arranged around.
TOP_LEVEL = {"config", "events", "errors", "metrics", "interface", "paths", "progress",
             "sampling", "coupling", "verify", "engine", "settings"}

# The layer of each part, bottom (0) to top; the most specific prefix wins. A module may import
# its own layer or any below it, never one above.
LEAF, ADAPTER, SPECULATION, ENGINE, MEASURE, FACES = range(6)
LAYER = {
    "ssd_edge": FACES,                      # the package itself: the Python API (Engine, configs, events)
    "ssd_edge.cli": FACES, "ssd_edge.server": FACES,
    "ssd_edge.bench": MEASURE, "ssd_edge.auto.calibrate": MEASURE,
    "ssd_edge.engine": ENGINE,
    "ssd_edge.speculation": SPECULATION, "ssd_edge.auto": SPECULATION,  # planner, profile: the engine asks them
    "ssd_edge.llama": ADAPTER, "ssd_edge.models": ADAPTER,
    "ssd_edge.settings": ADAPTER,  # the flags' table: reads the catalog for the default pair
    **{f"ssd_edge.{m}": LEAF for m in TOP_LEVEL - {"engine", "settings"}},
}
NAMES = ["leaf", "adapter", "speculation", "engine", "measure", "faces"]


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def imports(mod: str) -> list[tuple[str, str | None, int]]:
    """(imported module, name taken from it or None, line) for every ssd_edge import in `mod`.
    `from pkg import sub` counts as importing the module pkg.sub when that is a module."""
    path = MODULES[mod]
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] == "ssd_edge"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "ssd_edge":
                continue
            for a in node.names:
                sub = f"{source}.{a.name}"
                out.append((sub, None, node.lineno) if sub in MODULES else (source, a.name, node.lineno))
    return out


def layer(mod: str) -> int:
    best = max((p for p in LAYER if mod == p or mod.startswith(p + ".")), key=len)
    return LAYER[best]


def test_every_module_is_in_a_part_or_a_named_top_level_module():
    top = {m.split(".")[1] for m in MODULES if m.count(".") == 1 and MODULES[m].name != "__init__.py"}
    assert top <= TOP_LEVEL, f"top-level modules outside the list: {sorted(top - TOP_LEVEL)}"
    for m in MODULES:
        layer(m)  # raises when no part claims it


def up_arrows(edges: dict[str, list[tuple[str, str | None, int]]]) -> list[str]:
    return [f"{m}:{line} ({NAMES[layer(m)]}) imports {t} ({NAMES[layer(t)]})"
            for m, imported in edges.items() for t, _, line in imported if layer(t) > layer(m)]


def test_imports_never_go_up_a_layer():
    wrong = up_arrows({m: imports(m) for m in MODULES})
    assert not wrong, "\n".join(wrong)


def test_leaves_import_only_leaves():
    wrong = [f"{m} imports {t}" for m in MODULES if layer(m) == LEAF
             for t, _, _ in imports(m) if layer(t) != LEAF]
    assert not wrong, wrong


def test_no_private_name_is_imported_across_modules():
    wrong = [f"{m}:{line} imports {name} from {t}" for m in MODULES for t, name, line in imports(m)
             if name and name.startswith("_") and t != m]
    wrong += [f"{m}:{line} imports the private module {t}" for m in MODULES for t, _, line in imports(m)
              if any(p.startswith("_") and not p.startswith("__") for p in t.split("."))]
    assert not wrong, wrong


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in sorted(graph[m]):
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


def test_no_import_cycle():
    """Between modules, counting lazy imports: a cycle hidden inside a function is still a cycle in
    the plan."""
    graph = {m: {t for t, _, _ in imports(m) if t in MODULES and t != m} for m in MODULES}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_see_a_wrong_tree():
    """The checks above pass on the tree; on a fabricated wrong one they do not."""
    assert ("ssd_edge.llama.kvseq", "KVSeq") in {(t, n) for t, n, _ in imports("ssd_edge.speculation.drafters")}
    assert ("ssd_edge.auto.profile", None) in {(t, n) for t, n, _ in imports("ssd_edge.engine")}  # a lazy one
    assert up_arrows({"ssd_edge.engine": [("ssd_edge.cli.commands", "run", 1)],
                      "ssd_edge.llama.kvseq": [("ssd_edge.speculation.drafters", "Draft", 2)],
                      "ssd_edge.auto.profile": [("ssd_edge.auto.calibrate", None, 3)]}) == [
        "ssd_edge.engine:1 (engine) imports ssd_edge.cli.commands (faces)",
        "ssd_edge.llama.kvseq:2 (adapter) imports ssd_edge.speculation.drafters (speculation)",
        "ssd_edge.auto.profile:3 (speculation) imports ssd_edge.auto.calibrate (measure)"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
