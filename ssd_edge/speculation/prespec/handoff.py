"""The Handoff: all the state that the engine thread and the pre-speculation worker's thread share.

PrespecWorker (worker.py) holds one. Whatever else the worker holds (the draft context and its
KVSeq, the branches, the round's plan) is its own thread's; what crosses between the two threads
is here, each field with one rule for who writes it and how the other reads it.
"""

from __future__ import annotations

import queue
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from ...interface import AbortSignal
from ..drafters import Draft
from .outcomes import Branch

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
    round: int = 0   # the engine's count of verifying() calls
    looked: int = 0  # the round the engine last looked up
