"""`ssd-edge` as a user runs it: the console script in a subprocess, on the small
real pair (SmolLM2-135M + its first 28 blocks): streaming with a stats line,
JSON from a prompt on stdin, a stop string, a chat from a here-doc.

The error paths are tested where they are decided: the engine's checks on real
files in tests/real/test_backend.py and tests/real/test_engine_real.py, the
context filling mid-answer in tests/engine/test_ssd.py, and how each reaches
the user (one line, its exit code) on the scripted engine in
tests/faces/test_cli.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real

SCRIPT = Path(sys.executable).with_name("ssd-edge")


def ssd_edge(*args: str, input: str | bytes | None = None, timeout: float = 300, env: dict | None = None
             ) -> subprocess.CompletedProcess:
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "ssd_edge.cli.commands"]
    return subprocess.run(cmd + list(args), input=input.encode() if isinstance(input, str) else input,
                          capture_output=True, timeout=timeout, env=env or clean_env())


def clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without SSD_EDGE_* settings or a user config file, and without the
    first-use calibration of mode auto (tested on its own below)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SSD_EDGE_") or k in ("SSD_EDGE_HOME", "SSD_EDGE_MODELS")}
    env["XDG_CONFIG_HOME"] = "/nonexistent-ssd-edge-test"
    env["SSD_EDGE_NO_CALIBRATE"] = "1"
    env.update(extra)
    return env


def pair_args(pair: tuple[Path, Path]) -> list[str]:
    return ["-m", str(pair[0]), "-md", str(pair[1]), "-c", "512"]


def test_generate_streams_text_and_stats(small_pair):
    p = ssd_edge("generate", "The capital of France is", *pair_args(small_pair), "-n", "16", "--mode", "sd")
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.strip()
    assert re.search(r"^\d+ tokens · [\d.]+ tok/s · first token [\d.]+ s · acceptance [\d.]+ · mode sd",
                     p.stderr.decode(), re.M), p.stderr.decode()


def test_generate_json_with_chat_template_from_stdin(small_pair):
    p = ssd_edge("generate", "--chat", "--json", "-q", *pair_args(small_pair), "-n", "24", "--mode", "ssd",
                 input="Write a haiku about the sea.\n")
    assert p.returncode == 0, p.stderr.decode()
    assert p.stderr == b""
    data = json.loads(p.stdout)
    assert data["stop_reason"] in ("eos", "length") and data["mode"] == "ssd"
    assert 0 < len(data["tokens"]) == data["stats"]["tokens"] <= 24
    assert data["prompt_tokens"] > 10  # the chat template wraps the 7 words of the message
    assert data["stats"]["prespec"]["lookups"] > 0 and data["text"].strip()


def test_generate_stop_string(small_pair):
    p = ssd_edge("generate", "1, 2, 3, 4, 5,", *pair_args(small_pair), "-n", "40", "--mode", "ar", "--stop", " 9")
    assert p.returncode == 0, p.stderr.decode()
    text = p.stdout.decode()
    assert text.startswith(" 6") and " 9" not in text and text.rstrip().endswith("8,")


def test_chat_here_doc(small_pair):
    p = ssd_edge("chat", *pair_args(small_pair), "-n", "24", input="What is the capital of France?\n/mode ar\n"
                 "/stats\nAnd of Italy?\n")
    out = p.stdout.decode()
    assert p.returncode == 0, p.stderr.decode()
    assert "you › What is the capital of France?" in out and "you › And of Italy?" in out
    assert "mode ar · temp 0" in out and "decode speed" in out
    assert len(re.findall(r"^\d+ tokens · ", out, re.M)) == 2


def test_auto_calibrates_a_pair_on_first_use_only(small_pair, tmp_path):
    env = clean_env(SSD_EDGE_HOME=str(tmp_path), SSD_EDGE_NO_CALIBRATE="0")
    args = ("generate", "def add(a, b):", *pair_args(small_pair), "-n", "8")
    skipped = ssd_edge(*args, "--no-calibrate", env=env)
    assert skipped.returncode == 0, skipped.stderr.decode()
    assert "first use" not in skipped.stderr.decode() and not (tmp_path / "profiles").exists()
    first = ssd_edge(*args, env=env)  # mode auto is the default
    assert first.returncode == 0, first.stderr.decode()
    assert "first use of" in first.stderr.decode() and re.search(r"calibrated in \d+ s", first.stderr.decode())
    profiles = list((tmp_path / "profiles").glob("*.json"))
    assert len(profiles) == 1 and json.loads(profiles[0].read_text())["costs"]
    again = ssd_edge(*args, env=env)
    assert again.returncode == 0 and "first use" not in again.stderr.decode()
    assert again.stdout == first.stdout == skipped.stdout  # greedy: the profile changes speed, not text
