"""`ssd-edge` as a user runs it: the console script in a subprocess, on the small
real pair (SmolLM2-135M + its first 28 blocks). Output, exit codes, and the
bad inputs that need real weights: a truncated model, a draft with another
vocabulary, a prompt longer than the context, a context that fills mid-answer."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import testpair

pytestmark = pytest.mark.real

SCRIPT = Path(sys.executable).with_name("ssd-edge")


def ssd_edge(*args: str, input: str | bytes | None = None, timeout: float = 300, env: dict | None = None
             ) -> subprocess.CompletedProcess:
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "ssd_edge.cli"]
    return subprocess.run(cmd + list(args), input=input.encode() if isinstance(input, str) else input,
                          capture_output=True, timeout=timeout, env=env or clean_env())


def clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without SSD_EDGE_* settings or a user config file."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SSD_EDGE_") or k in ("SSD_EDGE_HOME", "SSD_EDGE_MODELS")}
    env["XDG_CONFIG_HOME"] = "/nonexistent-ssd-edge-test"
    env.update(extra)
    return env


def pair_args(pair: tuple[Path, Path]) -> list[str]:
    return ["-m", str(pair[0]), "-md", str(pair[1]), "-c", "512"]


def swapped_vocab_gguf(src: Path, dst: Path, layers: int = 2) -> Path:
    """`src` cut to `layers` blocks, with token strings 300..399 swapped in pairs: it loads,
    but its vocabulary is not the target's."""
    def swap(tokens: list) -> list:
        for i in range(300, 400, 2):
            tokens[i], tokens[i + 1] = tokens[i + 1], tokens[i]
        return tokens

    return testpair.rewrite_gguf(src, dst, layers, swap)


def one_error(stderr: bytes) -> str:
    lines = [ln for ln in stderr.decode().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr.decode()
    return lines[0]


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


def test_draft_with_another_vocabulary(small_pair, tmp_path):
    draft = swapped_vocab_gguf(small_pair[0], tmp_path / "other-vocab.gguf")
    p = ssd_edge("generate", "hi", "-m", str(small_pair[0]), "-md", str(draft))
    assert p.returncode == 3
    assert one_error(p.stderr) == (f"error: target {small_pair[0].name} and draft other-vocab.gguf have different "
                                   "vocabularies (token 300: 'om' vs 'il')")


def test_truncated_model_file(small_pair, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(small_pair[0], "rb") as f:
        cut.write_bytes(f.read(small_pair[0].stat().st_size // 2))
    p = ssd_edge("generate", "hi", "-m", str(cut))
    assert p.returncode == 3
    assert one_error(p.stderr) == f"error: llama.cpp could not load {cut} (truncated or corrupt GGUF?)"


def test_prompt_longer_than_the_context(small_pair):
    p = ssd_edge("generate", "word " * 200, *pair_args(small_pair)[:4], "-c", "64")
    assert p.returncode == 5 and p.stdout == b""
    assert one_error(p.stderr) == ("error: the prompt has 201 tokens and does not fit in the context of 64 "
                                   "(raise -c/--ctx-size)")


def test_context_fills_mid_answer(small_pair):
    p = ssd_edge("generate", "1, 2, 3, 4, 5,", "-m", str(small_pair[0]), "--mode", "ar", "-c", "64", "-n", "-1")
    assert p.returncode == 5, p.stderr.decode()
    assert p.stdout.decode().startswith(" 6, 7")  # the answer so far is kept
    err = p.stderr.decode()
    assert "stopped: the context of 64 tokens is full (raise -c/--ctx-size)" in err and "Traceback" not in err


def test_chat_here_doc(small_pair):
    p = ssd_edge("chat", *pair_args(small_pair), "-n", "24", input="What is the capital of France?\n/mode ar\n"
                 "/stats\nAnd of Italy?\n")
    out = p.stdout.decode()
    assert p.returncode == 0, p.stderr.decode()
    assert "you › What is the capital of France?" in out and "you › And of Italy?" in out
    assert "mode ar · k 3 · temp 0" in out and "decode speed" in out
    assert len(re.findall(r"^\d+ tokens · ", out, re.M)) == 2
