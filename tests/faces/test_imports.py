"""What a mode imports: `ssd-edge generate --mode ar` (and lookup, sd) loads nothing of
pre-speculation, of the calibration profile or of calibrating, so a plain run neither pays for
them nor depends on them (every mode's rounds go through the one planner). Run in a fresh
interpreter on the fake backend, through the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPECULATION = ("speculation.prespec", "speculation.policy", "planning.profile", "bench.calibrate")

# The real Engine, built by the real CLI, over the fake backend (tests/fakes.py) instead of llama.cpp.
RUN = """
import sys
from fakes import FakeContext, FakeModel
import ssd_edge.pair as E
E.resolve_model = lambda path, models_dir=None: path
E.Model = lambda path, gpu_layers, verbose, **rpc: FakeModel(str(path))
E.Context = lambda model, n_ctx, n_batch, threads, n_seq_max=1, **memory: FakeContext(model, n_ctx, n_batch, n_seq_max)
E.check_same_vocab = lambda target, draft: None
E.check_gguf_file = lambda path: None
from ssd_edge.cli import commands
sys.argv = ["ssd-edge", "generate", "-n", "8", "--json", *sys.argv[1:], "3 9 4"]
try:
    commands.main()
except SystemExit as e:
    assert not e.code, e.code
print(" ".join(sorted(m.removeprefix("ssd_edge.") for m in sys.modules if m.startswith("ssd_edge."))))
"""


def loaded(*flags: str) -> set[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    p = subprocess.run([sys.executable, "-c", RUN, *flags], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr
    assert '"tokens"' in p.stdout  # the generation ran to its JSON
    return set(p.stdout.split("\n")[-2].split())


@pytest.mark.parametrize("flags", [("--mode", "ar"), ("--mode", "lookup"), ("--mode", "sd", "-md", "fake-draft")],
                         ids=lambda f: f[1])
def test_a_mode_without_speculation_imports_none_of_it(flags):
    mods = loaded("-m", "fake-target", *flags)
    assert "engine" in mods and "cli.commands" in mods
    assert not mods & set(SPECULATION), f"{flags[1]} imported {sorted(mods & set(SPECULATION))}"


def test_every_mode_plans_with_the_one_planner_and_the_check_would_see_prespec():
    assert "planning.planner" in loaded("-m", "fake-target", "--mode", "ar")
    mods = loaded("-m", "fake-target", "--mode", "ssd", "-md", "fake-draft")
    assert {"planning.planner", "speculation.policy", "speculation.prespec"} <= mods
