"""Timing decodes on a loaded pair, for calibration (bench/calibrate.py): what one llama_decode of
n tokens costs each model, and how much the target slows while the draft decodes beside it."""

from __future__ import annotations

import statistics
import threading
import time
from typing import Sequence

from .kvseq import KVSeq


class DecodeTimer:
    """Times decodes on the engine's KV sequences, between generations (Engine.decode_timer)."""

    def __init__(self, target: KVSeq, draft: KVSeq | None) -> None:
        self.target, self.draft = target, draft

    def _kv(self, model: str) -> KVSeq:
        kv = self.target if model == "target" else self.draft
        if kv is None:
            raise ValueError("no draft model is loaded")
        return kv

    def decode_ms(self, model: str, prefix: Sequence[int], batch: Sequence[int], reps: int = 1) -> float:
        """Median ms of one decode of `batch` (every row's logits) by `model` after `prefix`, which
        the cache is made to hold first (untimed); the batch is dropped after each repetition."""
        kv = self._kv(model)
        kv.feed(prefix)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            kv.feed([*prefix, *batch], len(batch))
            times.append((time.perf_counter() - t0) * 1e3)
            kv.truncate(len(prefix))
        return statistics.median(times)

    def contention(self, prefix: Sequence[int], batch: Sequence[int], pairs: int = 8) -> tuple[float, float]:
        """(target, draft) slowdown while the other decodes at the same time: target decodes of
        `batch` alternate, one alone and one with the draft stepping beside it on its own thread,
        `pairs` times each, so that a machine growing busier or quieter moves both halves alike; the
        ratio of the two medians. The draft's is its step beside a target decode over one without."""
        target, draft = self.target, self._kv("draft")
        target.feed(prefix)
        draft.feed(prefix)
        run = threading.Event()
        stop = threading.Event()
        steps = [0]
        draft_ms: dict[bool, list[float]] = {False: [], True: []}  # beside the target or not

        def draft_loop() -> None:  # the draft's context and KVSeq are this thread's until it is joined
            while not stop.is_set():
                if not run.wait(0.01):
                    continue
                t0 = time.perf_counter()
                draft.step(batch[0])
                draft_ms[busy[0]].append((time.perf_counter() - t0) * 1e3)
                draft.truncate(len(prefix))
                steps[0] += 1

        busy = [False]
        worker = threading.Thread(target=draft_loop, name="time-draft-beside", daemon=True)
        alone: list[float] = []
        beside: list[float] = []
        worker.start()
        try:
            self.decode_ms("target", prefix, batch)  # warm-up
            for _ in range(pairs):
                run.clear()
                time.sleep(0.002)  # the draft ends its step in flight
                alone.append(self.decode_ms("target", prefix, batch))
                run.set()
                seen = steps[0]
                while steps[0] == seen and worker.is_alive():  # the draft is stepping: time beside it
                    time.sleep(0.0005)
                busy[0] = True
                beside.append(self.decode_ms("target", prefix, batch))
                busy[0] = False
        finally:
            stop.set()
            run.set()
            worker.join()
        # the draft's first step of each pair ran with the target idle (the wait above)
        draft_alone = statistics.median(draft_ms[False])
        draft_beside = statistics.median(draft_ms[True] or draft_ms[False])
        return statistics.median(beside) / statistics.median(alone), draft_beside / draft_alone
