"""Soak: 200 back-to-back generations in one process on the small real pair,
through the same path as `ssd-edge generate` (generation.write_completion: signal handling,
streaming, stats), mixing modes ar/sd/lookup/ssd, greedy and sampled, with
some cancelled mid-way by a real SIGINT and some abandoned by the consumer
(the generator closed early, as when stdout's reader goes away).

After a warm-up, nothing may accumulate: Python threads and OS threads back
to the baseline, open file descriptors back to the baseline, RSS growth below
50 MB."""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading

import psutil
import pytest

from conftest import make_engine
from ssd_edge.cli import generation
from ssd_edge.cli.signals import CancelOnSignal
from ssd_edge.events import FinishEvent

pytestmark = pytest.mark.real

MODES = ("ar", "sd", "lookup", "ssd", "auto")
PROMPTS = ("Once upon a time", "def fibonacci(n):", "The three primary colours are", "1, 2, 3, 4,")
RSS_GROWTH_LIMIT = 50 << 20  # bytes
N_RUNS = 200
N_WARMUP = 20


class Sink:
    """Stdout for generation.write_completion: counts writes, and can press Ctrl-C at the n-th one."""

    peak_threads = 0  # the most Python threads seen while text streamed (the SSD worker included)

    def __init__(self, interrupt_at: int | None = None) -> None:
        self.writes = 0
        self.interrupt_at = interrupt_at

    def write(self, text: str) -> int:
        self.writes += 1
        Sink.peak_threads = max(Sink.peak_threads, threading.active_count())
        # only while a generation runs (CancelOnSignal installed), not at the final flush after it
        if self.writes == self.interrupt_at and isinstance(getattr(signal.getsignal(signal.SIGINT), "__self__", None),
                                                           CancelOnSignal):
            os.kill(os.getpid(), signal.SIGINT)
        return len(text)

    def flush(self) -> None: ...

    def isatty(self) -> bool:
        return False


def one_run(engine, i: int) -> str:
    """Generation i: its kind is fixed by i, so every run of the test does the same work."""
    mode = MODES[i % len(MODES)]
    engine.configure(mode=mode, temperature=0.0 if i % 3 else 0.8, seed=i)
    prompt = PROMPTS[(i // 4) % len(PROMPTS)]
    max_tokens = 8 + i % 9
    kind = ("complete", "sigint", "abandon")[(i // 2) % 3]
    if kind == "abandon":
        events = engine.generate(prompt, max_tokens=max_tokens)
        for n, ev in enumerate(events):
            if n == 2:
                break
        events.close()
        return kind
    real_stdout = sys.stdout
    sys.stdout = Sink(interrupt_at=2 if kind == "sigint" else None)
    try:
        code = generation.write_completion(engine, engine.config, prompt, None, max_tokens, [], False, True)
    finally:
        sys.stdout = real_stdout
    if kind == "complete":
        assert code == 0
        return kind
    assert code in (0, 130)  # 0: the answer ended before its second piece of text
    return "sigint" if code == 130 else "complete"


def usage(proc: psutil.Process) -> tuple[int, int, int, int]:
    gc.collect()
    return threading.active_count(), proc.num_threads(), proc.num_fds(), proc.memory_info().rss


def test_200_generations_leave_nothing_behind(small_pair):
    proc = psutil.Process()
    engine = make_engine(small_pair, mode="ssd")
    try:
        for i in range(N_WARMUP):
            one_run(engine, i)
        py0, os0, fd0, rss0 = usage(proc)
        kinds: dict[str, int] = {}
        for i in range(N_RUNS):
            kind = one_run(engine, N_WARMUP + i)
            kinds[kind] = kinds.get(kind, 0) + 1
        py1, os1, fd1, rss1 = usage(proc)
        print(f"\nsoak: {N_RUNS} runs {kinds}; python threads {py0}->{py1} (peak while streaming {Sink.peak_threads}), "
              f"OS threads {os0}->{os1}, fds {fd0}->{fd1}, RSS {rss0 >> 20}->{rss1 >> 20} MB")
        assert kinds.get("sigint", 0) >= 40 and kinds.get("abandon", 0) >= 60 and kinds["complete"] >= 60
        assert Sink.peak_threads > py0, "the SSD worker thread never ran"
        assert py1 == py0, "python threads left running"
        assert os1 <= os0, "OS threads left running"
        assert fd1 <= fd0, "file descriptors leaked"
        assert rss1 - rss0 < RSS_GROWTH_LIMIT, f"RSS grew by {(rss1 - rss0) >> 20} MB"
        last = [ev for ev in engine.generate("Once upon a time", max_tokens=8) if isinstance(ev, FinishEvent)][0]
        assert last.stop_reason in ("length", "eos") and last.tokens  # still works
    finally:
        engine.close()
