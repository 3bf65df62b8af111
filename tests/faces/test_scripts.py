"""Every tool in scripts/ starts: `--help` in a child process exits 0 with its usage. The scripts
import the package's internals (the engine, the planner, the bench) and nothing else runs them in CI,
so a rename inside the package broke one silently before this test (confidence_vs_acceptance.py
imported a helper the engine no longer had). What each one measures is run where a model is needed:
row_tolerance.py in tests/real/test_backend.py, tui_speed.py in tests/real/test_tui_speed_real.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.py"))


def test_the_scripts_are_found():
    assert len(SCRIPTS) >= 8, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_starts(script):
    p = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: "), p.stdout
