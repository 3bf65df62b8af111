"""Shared fixtures, the layers and their options.

Layers (folders):
  unit          pure math and files: sampling, verify, n-gram, planner, cost model, catalog
  engine        the engine and SSD on the fake backend (tests/fakes.py)
  faces         CLI, chat, TUI (Pilot), bench and calibrate wiring, on the scripted engine
  real          the small real pair (SmolLM2-135M and a truncated draft of it)
  default_pair  the default Qwen2.5-Coder 1.5B/0.5B pair (1.6 GB, pulled on first use)

A plain `pytest` runs unit, engine and faces: nothing there loads a model or
needs llama-cpp-python. `--real` adds the small pair, `--default-pair` the
Qwen pair, `--full` both with the long lossless protocol (every prompt, every
mode, 128 tokens). A test is in the real or default_pair layer by its folder,
or by its `real` / `default_pair` marker where a file of a fast folder still
holds one. The time each layer took is printed at the end.

`--no-silent-skip` (scripts/test.sh passes it, so CI runs with it): every skipped test is
listed at the end, and a skip not named in SKIP_ALLOWED (with its reason) fails the run.
A layer left out on purpose (no --real) is not a silent skip and is not listed.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import testpair  # noqa: E402

LAYERS = ("unit", "engine", "faces", "real", "default_pair")
NEEDS = {"real": "--real", "default_pair": "--default-pair"}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ssd-edge layers")
    group.addoption("--real", action="store_true", help="also run the real layer (the small real pair)")
    group.addoption("--default-pair", action="store_true",
                    help="also run the default_pair layer (the Qwen pair, pulled on first use)")
    group.addoption("--full", action="store_true",
                    help="the release check: --real --default-pair, and the lossless tests run every prompt "
                         "in every mode at 128 tokens")
    group.addoption("--no-silent-skip", action="store_true",
                    help="list every skip at the end and fail the run on one not in SKIP_ALLOWED (CI)")


def _layer(item: pytest.Item) -> str:
    """default_pair or real by marker first (a mixed file in a fast folder), then by folder."""
    if item.get_closest_marker("default_pair"):
        return "default_pair"
    if item.get_closest_marker("real"):
        return "real"
    try:
        folder = Path(item.path).relative_to(HERE).parts[0]
    except ValueError:
        return "other"
    return folder if folder in LAYERS else "other"


def _enabled(config: pytest.Config, layer: str) -> bool:
    full = config.getoption("full")
    if layer == "real":
        return full or config.getoption("real")
    if layer == "default_pair":
        return full or config.getoption("default_pair")
    return True


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(LayerClock(), LayerClock.name)
    if config.getoption("no_silent_skip"):
        config.pluginmanager.register(SkipGate(), SkipGate.name)


# Skips CI accepts: test node id (without parameters) -> why the skip is legitimate. Keep it short;
# a test that cannot run in CI is a test CI does not have.
SKIP_ALLOWED: dict[str, str] = {
    "tests/real/test_bench_structured_real.py::test_llama_server_runs_as_the_structured_peer":
        "llama-server is llama.cpp's own build (scripts/build_llama_tools.sh, ~20 minutes on 2 cores), not "
        "the project's; the bench runs without it",
}
LAYER_SKIP = "the {layer} layer runs with "  # the prefix of a layer's own skip reason (not a silent skip)


class SkipGate:
    """--no-silent-skip: lists every skip in the summary; one outside SKIP_ALLOWED fails the session."""

    name = "ssd-edge-skip-gate"

    def __init__(self) -> None:
        self.skips: list[tuple[str, str, bool]] = []  # (node id, reason, allowed)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.skipped or getattr(report, "wasxfail", None) is not None:
            return
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        if any(reason.startswith(LAYER_SKIP.format(layer=layer)) for layer in NEEDS):
            return  # a layer not asked for (a plain `pytest` with the option)
        self.skips.append((report.nodeid, reason, report.nodeid.split("[")[0] in SKIP_ALLOWED))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if any(not allowed for _, _, allowed in self.skips) and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        tr = terminalreporter
        tr.write_sep("-", f"skips ({len(self.skips)}; --no-silent-skip)")
        if not self.skips:
            tr.write_line("none")
        for nodeid, reason, allowed in self.skips:
            why = f"allowed: {SKIP_ALLOWED[nodeid.split('[')[0]]}" if allowed else "NOT ALLOWED: fails the run"
            tr.write_line(f"{nodeid}: {reason} ({why})", red=not allowed)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a module may leave out some of its parametrized cases: its `case_runs(item, config)` says which run
    # (deselected, not skipped: the others are not run on purpose)
    left_out = [item for item in items if not getattr(item.module, "case_runs", lambda *_: True)(item, config)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]
    clock = config.pluginmanager.get_plugin(LayerClock.name)
    items.sort(key=lambda item: LAYERS.index(_layer(item)) if _layer(item) in LAYERS else len(LAYERS))  # fast first
    for item in items:
        layer = _layer(item)
        clock.layer_of[item.nodeid] = layer
        if layer in NEEDS and not item.get_closest_marker(layer):
            item.add_marker(getattr(pytest.mark, layer))  # so `-m "not real"` selects by folder too
        if not _enabled(config, layer):
            item.add_marker(pytest.mark.skip(reason=LAYER_SKIP.format(layer=layer) + NEEDS[layer]))


class LayerClock:
    """Sums the time of each layer's tests (setup + call + teardown, so a module fixture counts
    where it runs) and prints it in the terminal summary."""

    name = "ssd-edge-layer-clock"

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.layer_of: dict[str, str] = {}  # test node id -> layer
        self.seconds: dict[str, float] = defaultdict(float)
        self.outcomes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        layer = self.layer_of.get(report.nodeid, "other")
        self.seconds[layer] += report.duration
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.outcomes[layer][report.outcome] += 1

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.seconds:
            return
        tr = terminalreporter
        tr.write_sep("-", "time per layer")
        for layer in (*LAYERS, "other"):
            if layer in self.seconds:
                tally = ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.outcomes[layer].items()))
                tr.write_line(f"{layer:14s}{self.seconds[layer]:8.1f} s   {tally}")
        tr.write_line(f"{'all layers':14s}{sum(self.seconds.values()):8.1f} s   "
                      f"(session {time.perf_counter() - self.start:.1f} s with collection)")


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def small_pair() -> tuple[Path, Path]:
    """(target, draft) GGUF paths of the cheap real test pair."""
    return testpair.ensure_pair()


@pytest.fixture(scope="session")
def default_pair() -> tuple[Path, Path]:
    """(target, draft) GGUF paths of the default Qwen pair, pulled (and verified) if needed."""
    from ssd_edge.models import catalog

    cat = catalog.load_catalog()
    target, _ = catalog.pull(cat.get(cat.default_target))
    draft, _ = catalog.pull(cat.get(cat.default_draft))
    return target, draft


def make_engine(pair: tuple[Path, Path], profiles: bool = False, **overrides):
    """An Engine on a pair, one thread per model unless told otherwise. It reads no calibration
    profile unless `profiles`: one in the user's cache (test_calibrate_real writes the small pair's)
    would decide what auto and ssd's planner run, and on this machine it says a draft that costs
    more than a target step never pays, so the tests of the draft paths would see plain steps only."""
    from ssd_edge.config import EngineConfig
    from ssd_edge.engine import Engine

    target, draft = pair
    cfg = dict(target=dict(path=str(target), threads=1), draft=dict(path=str(draft), threads=1),
               n_ctx=1024, mode="ar")
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return Engine(EngineConfig.build(**cfg), profiles=profiles)


@pytest.fixture(scope="session")
def small_engine(small_pair):
    """One Engine on the small pair for the whole session (load once; tests set mode per call)."""
    eng = make_engine(small_pair)
    eng.load_draft()  # (made in mode ar, it would load the draft at the first drafting mode: not test-order dependent)
    yield eng
    eng.close()
