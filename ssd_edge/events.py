"""Typed, immutable events: the one stream that the CLI, the TUI, the benchmark
and the Python API all consume. `Engine.generate` yields TokenEvents as tokens
are committed, then exactly one FinishEvent."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# Where a committed token came from.
Provenance = Literal["target", "draft", "prespec", "ngram"]
#   target : emitted by the target itself (plain decoding, or a round's recovery/bonus token)
#   draft  : drafted by the draft model just in time, accepted by the target
#   prespec: drafted ahead of time by SSD pre-speculation (a cache hit), accepted
#   ngram  : proposed by the n-gram lookup drafter, accepted

Speculator = Literal["none", "draft", "prespec", "ngram"]
PrespecOutcome = Literal["hit", "partial", "miss"]
StopReason = Literal["eos", "length", "stop", "context", "cancelled", "error"]

HIT_RATE_HEALTHY = 0.70  # pre-speculation hit rate above this: healthy
HIT_RATE_POOR = 0.50     # below this: poor


def hit_rate_health(rate: float | None) -> Literal["healthy", "fair", "poor", "n/a"]:
    if rate is None:
        return "n/a"
    return "healthy" if rate >= HIT_RATE_HEALTHY else "poor" if rate < HIT_RATE_POOR else "fair"


@dataclass(frozen=True)
class Round:
    """One verification round (in plain decoding: one target step)."""

    index: int
    mode: str                       # the mode that ran this round: ar, sd, lookup, ssd
    speculator: Speculator
    prespec: PrespecOutcome | None  # SSD only: how the pre-speculation cache answered
    drafted: int
    accepted: int
    wall_ms: float                  # the whole round, as the caller saw it
    verify_ms: float                # target decode time
    draft_wait_ms: float            # time the loop waited for a draft


@dataclass(frozen=True)
class LiveStats:
    """A snapshot for gauges; cheap to build every round."""

    tokens: int
    tokens_per_s: float
    acceptance: float | None        # accepted / drafted so far
    hit_rate: float | None          # SSD pre-speculation hits / lookups so far
    draft_util: float               # busy fraction of wall time
    target_util: float
    branch_cells: int               # draft KV cells held by pre-speculation branches
    budget_cells: int
    mode: str                       # the requested mode
    state: str                      # what is running now: ar, sd, lookup, ssd, backup, rolled-back, ...


@dataclass(frozen=True)
class TokenEvent:
    text: str                       # text delta (may be "" while a UTF-8 char or stop string is pending)
    tokens: tuple[int, ...]
    provenance: tuple[Provenance, ...]  # one per token
    round: Round
    live: LiveStats


@dataclass(frozen=True)
class FinishEvent:
    text: str                       # the whole answer
    tokens: tuple[int, ...]
    stop_reason: StopReason
    stats: dict[str, Any] = field(default_factory=dict)
    message: str | None = None      # why, in words, when it is not an ordinary stop
    tail: str = ""                  # text not yet sent in a TokenEvent (a held-back stop-string prefix)
