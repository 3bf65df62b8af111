"""Typed, immutable events: the one stream that the CLI, the TUI, the benchmark
and the Python API all consume. `Engine.generate` yields TokenEvents as tokens
are committed, then exactly one FinishEvent, whose Stats the meter
(metrics.Meter.stats) builds once and every face reads."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal, Mapping

# Where a committed token came from.
Provenance = Literal["target", "draft", "prespec", "ngram", "grammar"]
#   target : emitted by the target itself (plain decoding, or a round's recovery/bonus token)
#   draft  : drafted by the draft model just in time, accepted by the target
#   prespec: drafted ahead of time by SSD pre-speculation (a cache hit), accepted
#   ngram  : proposed by the n-gram lookup drafter, accepted
#   grammar: forced by the answer's grammar (structured output: its only continuation), proposed without a
#            model, accepted
# (a proposer of another kind names its drafts, and so its accepted tokens, by its own name: Proposer.kind)

Speculator = Literal["none", "draft", "prespec", "ngram"]
# the mode each speculator's rounds are: no draft is ar's plain step, a draft sd's, a pre-speculated
# branch ssd's, an n-gram copy lookup's (what mode auto ran, in the faces' words)
SPECULATOR_MODE = {"none": "ar", "draft": "sd", "prespec": "ssd", "ngram": "lookup"}
PrespecOutcome = Literal["hit", "partial", "miss"]
StopReason = Literal["eos", "length", "stop", "context", "cancelled", "error"]

HIT_RATE_HEALTHY = 0.70  # pre-speculation hit rate above this: healthy
HIT_RATE_POOR = 0.50     # below this: poor
# Why a pre-speculation lookup found no branch for the round's outcome (a accepted, then token b):
MISS_REASONS = {
    "not-ready": "the outcome was ranked, but its branch was not begun when the verify ended",
    "wrong-token": "a branch for that accepted count was prepared, with another next token",
    "wrong-count": "no branch for that accepted count was ranked",
    "none-ranked": "no outcome ranked above the confidence floor within the budget",
    "off-path": "the round did not end as a verify of the draft the worker looked at",
}


Health = Literal["healthy", "fair", "poor", "n/a"]


def hit_rate_health(rate: float | None) -> Health:
    if rate is None:
        return "n/a"
    return "healthy" if rate >= HIT_RATE_HEALTHY else "poor" if rate < HIT_RATE_POOR else "fair"


@dataclass(frozen=True)
class TokenLogprob:
    """A committed token's log-probability under the target at temperature 1, before the logit bias,
    penalties, a grammar's mask and the sampling filters (OpenAI's logprobs), and the row's `top`
    likeliest tokens with theirs, likeliest first (as many as the request asked for)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Round:
    """One round as data: what was proposed, what the target made of it, and how long each part took.
    A verify round commits its accepted draft tokens and then the target's own; a plain round
    (nothing drafted) is one target step, or in mode ar after the prompt the `steps` steps of one C
    call (engine.py), one token each."""

    index: int
    mode: str                       # the mode that ran this round: ar, sd, lookup, ssd
    speculator: Speculator
    prespec: PrespecOutcome | None  # SSD only: how the pre-speculation cache answered
    drafted: int
    accepted: int
    wall_ms: float                  # the whole round, as the caller saw it (all its steps)
    verify_ms: float                # target decode time (all its steps)
    draft_wait_ms: float            # time the loop waited for a draft
    tokens: tuple[int, ...] = ()    # what the round added to the history: accepted draft tokens, the target's
    provenance: tuple[Provenance, ...] = ()  # one per token
    steps: int = 1                  # target steps it stands for (a plain run made in one C call: several)
    beside: int = 0                 # branches the pre-speculation worker grew beside its verify (0: none; >1: a tree)
    threads: tuple[int, int | None] | None = None  # the (target, draft) threads it ran at, where the engine set them


@dataclass(frozen=True)
class ThreadSplit:
    """Rounds a generation ran at one (target, draft) thread split, and its plain steps' speed there."""

    target: int
    draft: int | None
    rounds: int
    steps: int                      # plain target steps after the prompt's (the ones timed)
    ms_per_step: float | None       # their mean decode time


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
    threads: tuple[int, int | None] | None = None  # the (target, draft) threads the last round ran at


@dataclass(frozen=True)
class TokenEvent:
    """What one round committed (in mode ar after the prompt, a plain run: the steps of one C call,
    about a tenth of a second of them)."""

    text: str                       # text delta (may be "" while a UTF-8 char or stop string is pending)
    tokens: tuple[int, ...]         # the round's tokens the answer keeps
    provenance: tuple[Provenance, ...]  # one per token
    round: Round
    live: LiveStats
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per kept token, where the generation asked for them

    @property
    def rounds(self) -> int:
        """The target steps this event's tokens come from (Round.steps: several for a plain run)."""
        return self.round.steps

    @property
    def wall_ms(self) -> float:
        """The wall time of the round this event carries."""
        return self.round.wall_ms


def _frozen(m: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(m))


@dataclass(frozen=True)
class PrespecStats:
    """SSD pre-speculation over one generation (zeros and None where no lookup ran)."""

    lookups: int
    hits: int
    partial_hits: int
    misses: int
    hit_rate: float | None              # hits / lookups
    partial_rate: float | None          # partial hits / lookups
    health: Health                      # hit_rate against HIT_RATE_HEALTHY / HIT_RATE_POOR
    latency_ms_hit_p50: float | None    # per token, in rounds whose lookup hit
    latency_ms_hit_p95: float | None
    latency_ms_miss_p50: float | None   # per token, in rounds whose lookup missed or hit partly
    latency_ms_miss_p95: float | None
    prepared_tokens: int                # draft tokens made ahead of time
    used_tokens: int                    # of those, handed to the target
    waste: float | None                 # 1 - used / prepared
    branch_cells_peak: int              # draft KV cells the branches held at most
    budget_cells: int
    branch_bytes_peak: int              # the same in bytes (0 when the cell size is unknown)
    budget_bytes: int
    # misses by why (MISS_REASONS): not-ready, wrong-token, wrong-count, none-ranked, off-path
    miss_reasons: Mapping[str, int] = field(default_factory=dict)
    # by the verified round's accepted count a (0..k): (lookups, hits); which acceptance lengths the
    # prepared branches serve
    hits_by_accepted: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    complete_at_lookup: float | None = None  # branches complete (drafted to depth) at a lookup, on average
    first_decode_ms_p50: float | None = None  # ms from a verify's start to the worker's first decode beside it
    first_decode_ms_p90: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "miss_reasons", _frozen(self.miss_reasons))
        object.__setattr__(self, "hits_by_accepted", _frozen(self.hits_by_accepted))

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["miss_reasons"] = dict(self.miss_reasons)
        out["hits_by_accepted"] = {str(a): list(nh) for a, nh in self.hits_by_accepted.items()}
        return out


@dataclass(frozen=True)
class AutoStats:
    """Mode auto's planner over one generation."""

    decisions: Mapping[str, int]   # rounds by the proposer chosen: plain, ngram, draft, prepared (a round with
    #                                no room to draft, the last before max_tokens or a full context, is not chosen)
    concurrent: bool               # whether the pre-speculation worker ran beside the target
    planner: Mapping[str, Any]     # the rest of the planner's report: its estimates and its round log
    #                                (diagnostics, shaped by planner.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "decisions", _frozen(self.decisions))
        object.__setattr__(self, "planner", _frozen(self.planner))

    @classmethod
    def of(cls, report: Mapping[str, Any]) -> AutoStats:
        """From the strategy's report: the planner's figures plus "concurrent"."""
        rest = dict(report)
        return cls(rest.pop("decisions", {}), bool(rest.pop("concurrent", False)), rest)

    def to_dict(self) -> dict[str, Any]:
        return {"decisions": dict(self.decisions), **self.planner, "concurrent": self.concurrent}


@dataclass(frozen=True)
class Stats:
    """One generation's measurements (FinishEvent.stats), built once by metrics.Meter.stats.
    to_dict() is the JSON form that `generate --json`, bench.json and the server's
    `speculation` object carry."""

    mode: str                           # the requested mode
    prompt_tokens: int
    tokens: int                         # tokens generated
    rounds: int
    wall_s: float
    ttft_s: float | None                # time to the first round's tokens (the prompt's prefill)
    tokens_per_s: float                 # decode speed, the one definition: metrics.decode_rate
    end_to_end_tokens_per_s: float      # tokens / wall_s
    drafted: int
    accepted: int
    acceptance_rate: float | None       # accepted / drafted
    mean_accepted_len: float | None     # accepted tokens per round that drafted
    per_position_acceptance: tuple[float, ...]  # [i]: rounds accepting draft position i / rounds drafting it
    draft_busy_s: float
    target_busy_s: float
    draft_util: float                   # busy fraction of wall time
    target_util: float
    latency_ms_p50: float | None        # per token (a round's wall time over its tokens)
    latency_ms_p95: float | None
    prespec: PrespecStats
    speculators: Mapping[str, int]      # rounds by who proposed: none, draft, prespec, ngram
    seed: int | None = None             # a sampled generation's seed (replays it in any mode); None: greedy
    auto: AutoStats | None = None       # mode auto only
    first_round_tokens: int = 0         # tokens the first round emitted (it carries the prompt's prefill)
    draft_load_s: float | None = None   # the draft model was loaded for this generation first, in this long
    memory: Mapping[str, int] | None = None  # bytes by part at the end (memory.MemoryUse.to_dict)
    devices: Mapping[str, str] | None = None  # role -> where its layers ran (ModelInfo.device; "... via RPC")
    # The host's share: time on the generating thread inside decodes (llama_decode; a call it waited
    # on the pre-speculation worker for counts too), the logit rows those decodes returned (decoded
    # positions: every verified and every drafted one), and the rest of the wall time per position
    # (Python, sampling, planning, copying rows: what a GPU's fast steps expose)
    in_decode_s: float = 0.0
    positions: int = 0
    host_ms_per_position: float | None = None
    native: str | None = None           # the path that read rows and drew tokens: "c" (ssd_edge.native), "numpy"
    forced: int = 0                     # tokens the answer's grammar forced, proposed without a model (structured output)
    # the host's share split by what the worker did beside each round's verify (metrics.WORKER_BESIDE:
    # alone, branch, tree): (host seconds, positions) where such rounds ran; what a tree costs the engine
    # thread (the interpreter lock the two share) shows as tree's ms per position above alone's
    host_by_worker: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    # the thread splits the generation's rounds ran at, in the order first used (planning/threads.py:
    # the target's threads follow live timings where the user gave none)
    threads: tuple[ThreadSplit, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "speculators", _frozen(self.speculators))
        object.__setattr__(self, "host_by_worker", _frozen(self.host_by_worker))
        object.__setattr__(self, "per_position_acceptance", tuple(self.per_position_acceptance))
        if self.memory is not None:
            object.__setattr__(self, "memory", _frozen(self.memory))
        if self.devices is not None:
            object.__setattr__(self, "devices", _frozen(self.devices))

    @property
    def decode_s(self) -> float:
        """The time after the first round: what tokens_per_s divides by (0 before any round)."""
        return max(self.wall_s - self.ttft_s, 0.0) if self.ttft_s is not None else 0.0

    @property
    def decoded(self) -> bool:
        """Whether tokens came after the first round: only then is tokens_per_s a decode speed
        (otherwise metrics.decode_rate gives the end-to-end rate, and faces show "—")."""
        return self.tokens > self.first_round_tokens and self.decode_s > 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: one key per field, nested prespec and auto; "auto" only in mode auto."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(per_position_acceptance=list(self.per_position_acceptance), prespec=self.prespec.to_dict(),
                   speculators=dict(self.speculators), memory=dict(self.memory) if self.memory is not None else None,
                   devices=dict(self.devices) if self.devices is not None else None,
                   host_by_worker={w: list(sp) for w, sp in self.host_by_worker.items()},
                   threads=[asdict(t) for t in self.threads])
        if self.auto is None:
            del out["auto"]
        else:
            out["auto"] = self.auto.to_dict()
        return out


@dataclass(frozen=True)
class Prefilled:
    """A prompt read into the target's cache with nothing generated (Pair.prefill: an editor's warm-up)."""

    prompt_tokens: int
    cached: int            # of them the cache held already (kept, not read again)
    prompt_s: float        # seconds reading the rest
    cancelled: bool = False  # stopped between batches: the cache holds the batches read so far


@dataclass(frozen=True)
class FinishEvent:
    text: str                       # the whole answer
    tokens: tuple[int, ...]
    stop_reason: StopReason
    stats: Stats
    message: str | None = None      # why, in words, when it is not an ordinary stop
    tail: str = ""                  # text not yet sent in a TokenEvent (a held-back stop-string prefix)
    logprobs: tuple[TokenLogprob, ...] | None = None  # the whole answer's, where the generation asked for them
    stop_word: str | None = None    # the stop string that ended it (stop_reason "stop"; None: a stop rule did)
