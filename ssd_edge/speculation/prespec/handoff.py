"""The Handoff: all the state that the engine thread and the pre-speculation worker's thread share.

PrespecWorker (worker.py) holds one. Whatever else the worker holds (the draft context and its
KVSeq, the branches, the round's plan) is its own thread's; what crosses between the two threads
is here, each field with one rule for who writes it and how the other reads it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ...errors import DraftSideError
from ...interface import AbortSignal
from ..drafters import Draft
from .outcomes import Branch

try:  # the word's wait and bump (csrc/wake.c); without the compiled module, the worker waits on its queue
    from ...native import wake_await, wake_bump
except ImportError:  # pragma: no cover - the optional extension was not built
    wake_await = wake_bump = None

Base = tuple[list[int], Draft]  # (history C, draft d): the verify a round's branches are prepared for


class Ready(NamedTuple):
    """The round's finished branches, published after each wave."""

    round: int                                  # the engine's round count it belongs to
    base: Base
    branches: dict[tuple[int, int], Branch]     # (a, b) -> a finished branch, never written again


class Ranked(NamedTuple):
    """The outcomes the round's plan ranked, published once, before the first wave."""

    round: int
    base: Base
    outcomes: frozenset[tuple[int, int]]        # any other outcome is a miss with no branch to wait for


class Growing(NamedTuple):
    """Published while branches grow: a branch decode is (about to be) in flight, and the engine may abort it."""

    base: Base
    finishing: frozenset[tuple[int, int]]  # (a, b) of the branches the decode in flight finishes (not aborted)


# The worker sleeps on the word at once. A spin first (2-10 ms) took the first decode after a verify's start from
# ~0.2 to ~0.12-0.16 ms p50 on the priced pair, where no miss was for want of time, and would take a core from a
# CPU target's own decode while the worker waits beside it.
WAKE_SPIN_S = 0.0
WAKE_WAIT_S = 0.05  # the worker looks at its queue at least this often (a bump missed costs latency, never a message)
HANG_S = 60.0  # a call unanswered this long, with no draft decode begun meanwhile: the draft side hangs
WATCH_S = 0.5  # how often the engine, waiting for an answer, looks at the worker's thread


class Wake:
    """The 32-bit word the worker waits on for its next message (csrc/wake.c), the interpreter's lock
    released. A message queued from Python bumps it as it is queued. The verifying message is queued
    without a bump where the target's context bumps it instead (its `wake`), from C as each decode
    starts with the lock released: the worker then wakes to a free lock while the verify has just
    begun, not while the engine still holds the lock for the Python before its decode."""

    def __init__(self) -> None:
        self._word = np.zeros(1, np.uint32)
        self.address = self._word.ctypes.data

    def seen(self) -> int:
        return int(self._word[0])

    def bump(self) -> None:
        wake_bump(self.address)

    def wait(self, seen: int) -> None:
        """Until the word moves from `seen` (a message, or the target's decode began), or WAKE_WAIT_S."""
        wake_await(self.address, seen, WAKE_SPIN_S, WAKE_WAIT_S)


@dataclass
class Handoff:
    """What crosses between the engine thread and the worker thread.

    The queues carry every value the engine hands the worker and back: inbox, the engine's calls
    and notices (verifying, adopt, missed, stop) with their arguments (a PolicySnapshot with
    verifying: the policy itself is the engine thread's); outbox, the worker's answers to the calls
    the engine waits for.

    The publications (ready, ranked, growing) need no lock: the worker replaces each whole, a new
    tuple whose contents are never written again, and the engine reads each with one attribute read
    (atomic under the GIL), then works on what it read. The engine writes a publication only to
    clear one it has used (None). lookup() reads them to answer without waiting for the worker
    (~0.02 ms), which is why no lock is taken there.

    abort is the draft context's abort flag: the engine sets it to stop a branch decode it would
    otherwise wait for (only while `growing` is published); the worker clears it before each message
    it takes.

    wake (None without the compiled module) wakes the worker: post() queues and bumps it, take() is the
    worker's wait (Wake says how the verify's own start wakes it).

    round and looked are the engine thread's alone: the worker learns a round's number from its
    verifying message and stamps its publications with it; the engine reads a publication only for
    the round it counts now, and only at that round's first lookup."""

    abort: AbortSignal
    inbox: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)   # engine -> worker: (kind, args)
    outbox: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)  # worker -> engine: (status, value, decodes)
    ready: Ready | None = None
    ranked: Ranked | None = None
    growing: Growing | None = None
    # the worker's batched branch steps, (rows, wall ms), appended by the worker and taken by the engine's
    # planner (a deque's append and popleft are atomic): what a tree's step costs here, host work included
    steps: deque = field(default_factory=lambda: deque(maxlen=64))
    hung: bool = False  # a call went unanswered (answer()): the worker's thread is not waited for
    round: int = 0   # the engine's count of verifying() calls
    looked: int = 0  # the round the engine last looked up
    wake: Wake | None = field(default_factory=lambda: Wake() if wake_bump is not None else None)

    def post(self, kind: str, args: tuple, bump: bool = True) -> None:
        """A message for the worker (engine thread); bump=False: the target's decode about to start bumps."""
        self.inbox.put((kind, args))
        if bump and self.wake is not None:
            self.wake.bump()

    def answer(self, kind: str, thread: threading.Thread, ctx: object) -> tuple:
        """The worker's answer to a call (engine thread); DraftSideError where its thread has ended, or
        where it began no decode of `ctx` for HANG_S (a decode stuck in the backend, a lost device, a
        deadlock). A decode, however long, may take up to HANG_S: the draft's longest is one batch."""
        seen, since = getattr(ctx, "started", None), time.monotonic()
        while True:
            try:
                return self.outbox.get(timeout=WATCH_S)
            except queue.Empty:
                pass
            if not thread.is_alive():
                raise DraftSideError(f"SSD's draft side stopped during a {kind}")
            started = getattr(ctx, "started", None)
            if started != seen:  # a decode began since: the worker is alive and working
                seen, since = started, time.monotonic()
            elif time.monotonic() - since > HANG_S:
                self.hung = True
                raise DraftSideError(f"SSD's draft side has not answered a {kind} in {HANG_S:g} s, nor begun a "
                                     "draft decode: this generation ends")

    def take(self) -> tuple[str, tuple]:
        """The worker's next message, waited for on the word (on the queue without the compiled module)."""
        wake = self.wake
        if wake is None:
            return self.inbox.get()
        while True:
            seen = wake.seen()  # (read before the queue: a message queued after it moves the word)
            try:
                return self.inbox.get_nowait()
            except queue.Empty:
                wake.wait(seen)
