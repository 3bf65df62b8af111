"""The word that wakes SSD's worker (speculation/prespec/handoff.py's Wake, csrc/wake.c): a message is taken
as soon as it is queued and bumped; a verifying message queued without a bump waits for the target's decode
to bump the word as it starts (from C, the interpreter's lock released); a bump that never comes costs
latency, never the message."""

from __future__ import annotations

import threading
import time

import pytest

from native_build import skip_or_fail
from ssd_edge.bench.priced import TABLES
from ssd_edge.bench.priced.backend import PricedContext, PricedModel
from ssd_edge.speculation.prespec import handoff as handoff_mod



@pytest.fixture(autouse=True)
def _native():
    if handoff_mod.wake_bump is None:
        skip_or_fail("the worker's wake")


def handoff() -> handoff_mod.Handoff:
    return handoff_mod.Handoff(abort=threading.Event())


def later(seconds: float, fn) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(seconds), fn()))
    t.start()
    return t


def test_a_posted_message_is_taken_at_once_and_a_quiet_one_at_the_bump(monkeypatch):
    monkeypatch.setattr(handoff_mod, "WAKE_WAIT_S", 30.0)  # no periodic look: only a bump wakes the worker
    h = handoff()
    h.post("lookup", (1,))
    assert h.take() == ("lookup", (1,))
    got = []
    taker = threading.Thread(target=lambda: got.append((h.take(), time.perf_counter())))
    taker.start()
    time.sleep(0.05)
    h.post("verifying", (2,), bump=False)  # queued; the decode about to start bumps
    time.sleep(0.2)
    assert not got  # asleep on the word, though the message is queued
    bumped = time.perf_counter()
    h.wake.bump()  # what the target's decode does as it starts
    taker.join(5)
    assert got and got[0][0] == ("verifying", (2,)) and got[0][1] - bumped < 1.0


def test_a_bump_that_never_comes_costs_latency_not_the_message(monkeypatch):
    monkeypatch.setattr(handoff_mod, "WAKE_WAIT_S", 0.02)
    h = handoff()
    t = later(0.05, lambda: h.post("verifying", (3,), bump=False))
    assert h.take() == ("verifying", (3,))  # found at the next periodic look of the queue
    t.join()


def test_wake_await_times_out_and_sees_a_bump():
    h = handoff()
    seen = h.wake.seen()
    t0 = time.perf_counter()
    assert handoff_mod.wake_await(h.wake.address, seen, 0.0, 0.02) is False and time.perf_counter() - t0 >= 0.019
    t = later(0.02, h.wake.bump)
    assert handoff_mod.wake_await(h.wake.address, seen, 0.001, 5.0) is True and h.wake.seen() == seen + 1
    t.join()


def test_the_priced_target_bumps_the_word_once_as_each_decode_starts():
    ctx = PricedContext(PricedModel(TABLES["h200-1.5b"], "target"))
    wake = handoff().wake
    ctx.wake = wake
    before = wake.seen()
    ctx.decode([1, 2, 3], range(3), [0] * 3, [2])
    ctx.decode([4], [3], [0], [0])
    assert wake.seen() == before + 2
    ctx.wake = None
    ctx.decode([5], [4], [0], [0])
    assert wake.seen() == before + 2
