"""The round planner behind mode `auto`: every round, which proposal the target verifies.

On offer each round (whichever exist):

    plain        nothing drafted: one target step
    ngram  m     the first m tokens the n-gram lookup proposes (free to make)
    draft  m     the draft model drafts m tokens now, first reading what it has not read yet
    prepared m   a branch pre-speculated while the target verified the last round (an SSD hit or
                 partial hit), extended by the draft if it holds fewer than m tokens

Each is scored by expected tokens per millisecond and the best is taken:

    rate(m) = (1 + sum_{i=1..m} prod_{j<i} alpha_j) / (verify(m + 1) + drafting ms)

A draft that has fallen behind (plain or n-gram rounds, the prompt) must first read what it
missed. That reading is an investment in every later draft round, so its cost is spread over the
tokens still to come (at most HORIZON) rather than charged to one round.

alpha_j is that proposer's live acceptance at draft position j; verify(n) is the target's decode of
n tokens (the calibration profile's curve, scaled to what this generation measures; without a
profile, what this generation measures). Decisions are cheap and the next round corrects them, so a
proposer that stops paying (prose after code) loses the next round, not the whole answer.

Evidence arrives even for proposers that did not run: the n-gram lookup is asked every round and
scored against what the target committed; the draft's acceptance is estimated from the target's own
confidence while only plain steps run (calibrated by the rounds where the draft did run), so a
draft that was written off is tried again when the text turns predictable.

Lossless without help from here: tokens are drawn with coupled noise (coupling.py), so what the
target commits never depends on what was proposed; the planner only decides how fast.

Pure state and arithmetic on the engine thread: no models, no threads; tested with plain numbers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, NamedTuple, Sequence

import numpy as np

from ..speculation.drafters import Draft, NgramDrafter

log = logging.getLogger(__name__)

Kind = Literal["plain", "ngram", "draft", "prepared"]
PLAIN_MARGIN = 0.03  # a speculative plan must beat a plain step by this much (estimates carry noise)
HORIZON = 128        # most tokens over which the draft's catch-up is spread
HIT_PRIOR = 0.5        # how often a prepared round is verified, until measured
CONTENTION_PRIOR = 1.2  # target decode time with the worker drafting beside it / alone, until measured
# n-gram matches by length (tokens the two passages agree over): shorter than 4, 4-7, 8-15, 16-31,
# 32 and more, and each class's acceptance prior, until measured
MATCH_CLASSES = (4, 8, 16, 32)
MATCH_PRIORS = (0.35, 0.5, 0.65, 0.8, 0.9)


def match_class(match: int) -> int:
    """The class of an n-gram match of `match` tokens (an index into MATCH_PRIORS)."""
    return sum(match >= edge for edge in MATCH_CLASSES)


class Rate:
    """A success rate from trials with forgetting: (s + w * prior) / (n + w), s and n decayed by
    `keep` per trial, so the last ~1 / (1 - keep) trials dominate."""

    def __init__(self, prior: float, weight: float = 2.0, keep: float = 0.95) -> None:
        self.prior, self.weight, self.keep = prior, weight, keep
        self.s = self.n = 0.0

    def add(self, successes: float, trials: float = 1.0) -> None:
        if trials <= 0:
            return
        decay = self.keep ** trials
        self.s = self.s * decay + successes
        self.n = self.n * decay + trials

    @property
    def value(self) -> float:
        return (self.s + self.weight * self.prior) / (self.n + self.weight)


def running_mean(old: float | None, new: float, alpha: float) -> float:
    """An exponential running mean: the first reading as is, then `alpha` of each new one."""
    return new if old is None else old + alpha * (new - old)


class Costs:
    """ms of a decode of n tokens for one model.

    With the device's curve (the calibration profile): the curve times one scale, a running mean of
    observed / curve over every decode timed within the curve, whatever its size. So a size that stopped being
    chosen (plain steps, after one slow step on a busy machine) is still re-priced by the others,
    and cannot stay written off on one stale reading. Without a curve: a running mean per size, and
    for sizes not yet timed a line through the timed ones (or the prior). Each reading is clipped to
    within a factor of 2 of the current estimate, so one outlier moves it by a bounded step."""

    ALPHA = 0.3  # weight of a new reading

    def __init__(self, curve: Sequence[float] | None, step_prior: float, slope_prior: float) -> None:
        self.curve = list(curve) if curve else None
        self.step_prior = step_prior    # ms of one token before anything is timed
        self.slope_prior = slope_prior  # extra ms per extra token, as a fraction of one step
        self.scale: float | None = None  # observed / curve (with a curve; None until a size within it is timed)
        self.timed: dict[int, float] = {}  # running mean per size (without a curve, or beyond it)

    def add(self, n: int, ms: float) -> None:
        if n < 1 or ms <= 0:
            return
        old = self.ms(n)
        ms = min(max(ms, old / 2), old * 2)
        if self.curve and n <= len(self.curve):
            ratio = ms / self._curve_at(n)
            self.scale = ratio if self.scale is None else self.scale + self.ALPHA * (ratio - self.scale)
            return
        self.timed[n] = running_mean(self.timed.get(n), ms, self.ALPHA)

    def _curve_at(self, n: int) -> float:
        assert self.curve
        if n <= len(self.curve):
            return self.curve[n - 1]
        tail = self.curve[-1] - self.curve[-2] if len(self.curve) > 1 else self.curve[-1]
        return self.curve[-1] + tail * (n - len(self.curve))

    def ms(self, n: int) -> float:
        n = max(1, n)
        scale = 1.0 if self.scale is None else self.scale
        if self.curve and n <= len(self.curve):
            return self._curve_at(n) * scale
        if n in self.timed:  # (beyond the curve: a long catch-up read, priced as it was timed)
            return self.timed[n]
        if self.curve:
            return self._curve_at(n) * scale
        if not self.timed:
            return self.step_prior * (1 + self.slope_prior * (n - 1))
        sizes = sorted(self.timed)
        lo = max((m for m in sizes if m < n), default=None)
        hi = min((m for m in sizes if m > n), default=None)
        if lo is not None and hi is not None:
            return self.timed[lo] + (self.timed[hi] - self.timed[lo]) * (n - lo) / (hi - lo)
        one = self.timed.get(1, self.timed[sizes[0]] / (1 + self.slope_prior * (sizes[0] - 1)))
        near = lo if lo is not None else hi
        return self.timed[near] + one * self.slope_prior * (n - near)


@dataclass(frozen=True)
class Offer:
    """What can be verified this round. prepared: tokens a pre-speculated branch holds (None: no
    branch); a branch the draft stopped early (--draft-p-min) counts as complete (prepared_done)."""

    k: int
    remaining: int = 64            # tokens the generation may still make (the horizon of an investment)
    ngram: int = 0
    draft: bool = False
    draft_unread: int = 0          # history tokens the draft must read before it can draft
    prepared: int | None = None
    prepared_done: bool = False


@dataclass(frozen=True)
class Decision:
    kind: Kind
    m: int
    rate: float                    # expected tokens per ms
    runner_up: tuple[Kind, int, float] | None = None

    def describe(self) -> str:
        ru = f"; runner-up {self.runner_up[0]} {self.runner_up[1]} at {self.runner_up[2] * 1e3:.1f} tok/s" \
            if self.runner_up else ""
        return f"{self.kind} {self.m} at {self.rate * 1e3:.1f} tok/s expected{ru}"


class Planner:
    """Live estimates and the per-round decision (see the module docstring)."""

    def __init__(self, k: int, *, k_min: int = 0, verify_curve: Sequence[float] | None = None,
                 draft_curve: Sequence[float] | None = None,
                 step_ms: float | None = None, draft_ms: float | None = None, ngram: NgramDrafter | None = None,
                 draft_prior: float = 0.7, contention: float | None = None) -> None:
        self.k = k
        self.k_min = k_min  # --draft-min: no round verifies fewer drafted tokens (but none)
        step = step_ms or (verify_curve[0] if verify_curve else 100.0)
        # Without a profile: a CPU-like prior (4 tokens cost ~1.7 steps, FIELD_NOTES) until timed.
        self.target = Costs(verify_curve, step, 0.25)
        self.draft_cost = Costs(draft_curve, draft_ms or (draft_curve[0] if draft_curve else 0.4 * step), 0.27)
        # Each prior counts as one trial: the first real trials outweigh it at once.
        self.draft_alpha = [Rate(draft_prior, weight=1.0) for _ in range(k)]  # P(accept position i | reached it)
        # P(accept position i | reached it), per position and per class of match length (how far
        # back the copied passage agrees with the history's end: drafters.NgramDrafter): a long
        # exact copy (an edit that quotes its source) is likelier to go on, the further it has
        # matched, than a two-token coincidence.
        self.ngram_alpha = [[Rate(prior, weight=1.0) for _ in range(k)] for prior in MATCH_PRIORS]
        self.ngram_match = 0  # the match length of this round's n-gram proposal
        self.confidence = Rate(draft_prior, weight=1.0, keep=0.9)  # target's top-1 prob. of committed tokens
        self.calibration = Rate(1.0, weight=2.0, keep=0.98)       # accepted draft tokens per unit confidence
        self.rounds_since_draft = 0
        # Where a pre-speculation worker runs beside the target: how much slower the target decodes
        # while the worker drafts (the profile's measurement at this thread split, then the ratio of
        # verifies timed with the worker busy to the idle cost of the same size), and how often the
        # next round finds its outcome prepared.
        self.contention = Rate(contention or CONTENTION_PRIOR, weight=2.0, keep=0.9)
        self.hits = Rate(HIT_PRIOR, weight=2.0, keep=0.95)
        self.rounds_resting = 0  # rounds since the worker last prepared one
        self.idle_ms: dict[int, float] = {}  # verifies timed with the worker resting, by size
        self.shadow = NgramShadow(ngram, k) if ngram is not None else None
        self.decisions: dict[str, int] = {}
        # every decision: (kind, m, expected tok/s, runner-up kind, its m, its expected tok/s)
        self.log: list[tuple] = []

    # ------------------------------------------------------------ estimates
    def alpha(self, kind: Kind, i: int) -> float:
        if kind == "ngram":
            return self.ngram_alpha[match_class(self.ngram_match)][min(i, self.k - 1)].value
        measured = self.draft_alpha[min(i, self.k - 1)]
        proxy = min(1.0, self.calibration.value * self.confidence.value)
        if measured.n == 0:  # the draft has not run yet: the target's confidence is all there is
            return proxy
        # Stale measurements fade into the confidence estimate: a draft written off on prose is tried
        # again when the target grows confident (code), without paying for a blind exploration.
        fresh = 0.5 ** (self.rounds_since_draft / 8.0)
        return fresh * measured.value + (1.0 - fresh) * proxy

    def gain(self, kind: Kind, m: int) -> float:
        """E[tokens committed] when m tokens of `kind` are verified: 1 + sum_i P(first i accepted)."""
        reach, total = 1.0, 1.0
        for i in range(m):
            reach *= self.alpha(kind, i)
            total += reach
        return total

    def step_ms(self) -> float:
        return self.target.ms(1)

    # ------------------------------------------------------------ decision
    def plan(self, offer: Offer) -> Decision:
        k = offer.k
        scored: list[tuple[float, Kind, int]] = [(1.0 / self.step_ms() * (1.0 + PLAIN_MARGIN), "plain", 0)]
        for m in range(max(1, self.k_min), k + 1):
            verify = self.target.ms(m + 1)
            if m <= offer.ngram:
                scored.append((self.gain("ngram", m) / verify, "ngram", m))
            if offer.prepared is not None:
                ready = k if offer.prepared_done else offer.prepared
                extra = 0.0 if m <= ready else (m - ready) * self.draft_cost.ms(1)
                scored.append((self.gain("draft", m) / (verify + extra), "prepared", m))
            if offer.draft:
                g, step = self.gain("draft", m), self.draft_cost.ms(1)
                catch_up = max(0.0, self.draft_cost.ms(offer.draft_unread + 1) - step)
                horizon = max(1, min(offer.remaining, HORIZON))
                scored.append((g / (verify + m * step + catch_up * min(1.0, g / horizon)), "draft", m))
        scored.sort(key=lambda x: -x[0])
        (rate, kind, m), rest = scored[0], scored[1:]
        if kind == "plain":
            rate /= 1.0 + PLAIN_MARGIN
        ru = next(((k2, m2, r2 / (1.0 + PLAIN_MARGIN) if k2 == "plain" else r2)
                   for r2, k2, m2 in rest if k2 != kind), None)
        d = Decision(kind, m, rate, ru)
        self.decisions[kind] = self.decisions.get(kind, 0) + 1
        self.log.append((kind, m, round(rate * 1e3, 2), *((ru[0], ru[1], round(ru[2] * 1e3, 2)) if ru else ())))
        log.debug("plan: %s", d.describe())
        return d

    def prespec_pays(self, k: int, verifying: int = 1) -> bool:
        """Should the worker prepare the next round while the target verifies `verifying` tokens?

        Preparing costs this verify its slowdown beside the draft: (contention - 1) x its time (on a
        GPU target next to nothing; on cores the two models share, a lot). It pays when the next
        round finds its outcome prepared (the hit rate) and a ready branch of m tokens then saves
        time against the best way to make as many tokens without one (plain steps, or a draft
        drafted just in time). Otherwise the worker rests and the target verifies alone."""
        if k < max(1, self.k_min):
            return False
        step = self.draft_cost.ms(1)
        alternative = max(1.0 / self.step_ms(), *(self.gain("draft", m) / (self.target.ms(m + 1) + m * step)
                                                    for m in range(max(1, self.k_min), k + 1)))
        saved = max(self.gain("draft", m) / alternative - self.target.ms(m + 1)
                    for m in range(max(1, self.k_min), k + 1))
        cost = (self.contention.value - 1.0) * self.target.ms(verifying)
        return self.hit_rate() * saved > cost

    def hit_rate(self) -> float:
        """How often a prepared round is verified. It is measured only while the worker prepares, so
        once resting it fades back to the prior (as a stale draft alpha does): one bad stretch
        (prose) cannot keep the worker idle when the text turns predictable."""
        fresh = 0.5 ** (self.rounds_resting / 8.0)
        return fresh * self.hits.value + (1.0 - fresh) * HIT_PRIOR

    # ------------------------------------------------------------ observations
    def observe(self, kind: Kind, drafted: int, accepted: int, verify_ms: float,
                committed_top1: Sequence[float] = (), busy: bool = False) -> None:
        """A verified round: what was proposed, how much was accepted, the target's decode time
        (busy: with the worker drafting beside it), and the target's top-1 probability at each
        committed position (accepted drafts, then its own)."""
        n = drafted + 1
        self.rounds_resting = 0 if busy else self.rounds_resting + 1
        if busy:  # compared with an idle verify of the same size where one was timed
            if n in self.idle_ms:
                self.contention.add(verify_ms / self.idle_ms[n])
            self.target.add(n, verify_ms / self.contention.value)
        else:
            self.idle_ms[n] = running_mean(self.idle_ms.get(n), verify_ms, Costs.ALPHA)
            self.target.add(n, verify_ms)
        if kind in ("draft", "prepared") and drafted:
            self.rounds_since_draft = 0
            for i in range(min(drafted, self.k)):
                if i > accepted:
                    break
                self.draft_alpha[i].add(1.0 if i < accepted else 0.0)
            reached = list(committed_top1[:min(drafted, accepted + 1)])
            if reached:
                self.calibration.add(accepted, sum(reached))
        else:
            self.rounds_since_draft += 1
        if kind == "ngram" and drafted and self.shadow is None:
            rates = self.ngram_alpha[match_class(self.ngram_match)]
            for i in range(min(drafted, accepted + 1, self.k)):
                rates[i].add(1.0 if i < accepted else 0.0)
        for p in committed_top1:
            self.confidence.add(p)

    def observe_lookup(self, prepared: bool) -> None:
        """A round after the worker prepared: was a prepared branch verified (a hit, or a partial hit
        worth extending)? A branch found but not worth verifying saved nothing."""
        self.hits.add(1.0 if prepared else 0.0)
        self.rounds_resting = 0

    def observe_prefill(self, committed_top1: Sequence[float]) -> None:
        """The prompt's round: its time says nothing of a step, its token's confidence does count."""
        for p in committed_top1:
            self.confidence.add(p)

    def observe_history(self, history: Sequence[int]) -> None:
        """The committed history after a round: scores the n-gram lookup's standing proposals."""
        if self.shadow is not None:
            for s in self.shadow.settle(history):
                self.ngram_alpha[match_class(s.match)][min(s.position, self.k - 1)].add(1.0 if s.matched else 0.0)

    def ask_ngram(self, history: Sequence[int]) -> tuple[int, ...]:
        """The n-gram lookup's proposal for this round (remembered, to be scored as tokens commit)."""
        if self.shadow is None:
            return ()
        draft = self.shadow.ask(history)
        self.ngram_match = draft.match
        return draft.tokens

    def observe_draft(self, unread: int, feed_ms: float, steps: int, steps_ms: float) -> None:
        """A just-in-time draft: reading `unread` + 1 tokens took feed_ms, then `steps` single steps."""
        self.draft_cost.add(unread + 1, feed_ms)
        if steps:
            self.draft_cost.add(1, steps_ms / steps)

    def report(self) -> dict:
        return {"decisions": dict(self.decisions),
                "draft_alpha": [round(self.alpha("draft", i), 3) for i in range(self.k)],  # as the planner sees it
                "draft_alpha_measured": [round(r.value, 3) if r.n else None for r in self.draft_alpha],
                "ngram_alpha": [round(self.alpha("ngram", i), 3) for i in range(self.k)],  # this round's class
                "ngram_alpha_by_match": {f">={([0] + list(MATCH_CLASSES))[c]}": [round(r.value, 3) for r in rates]
                                         for c, rates in enumerate(self.ngram_alpha)},
                "step_ms": round(self.step_ms(), 2),
                "verify_ms": {n: round(self.target.ms(n), 2) for n in range(1, self.k + 2)},
                "draft_step_ms": round(self.draft_cost.ms(1), 2),
                "contention": round(self.contention.value, 3),
                "prepared_hit_rate": round(self.hit_rate(), 3),
                "rounds": [list(x) for x in self.log]}


class Settled(NamedTuple):
    """One proposed n-gram token decided by the committed history."""

    position: int   # in its proposal (0: the first drafted token)
    matched: bool   # the target committed it
    match: int      # the proposal's match length (drafters.NgramDrafter)


class NgramShadow:
    """Asks the n-gram drafter at every round start and scores each proposed token as the committed
    tokens decide it, so prompt lookup's acceptance is known even in rounds it did not serve."""

    def __init__(self, drafter: NgramDrafter, k: int) -> None:
        self.drafter = drafter
        self.k = k
        self.pending: list[tuple[int, Draft, int]] = []  # (history length when asked, proposal, decided)

    def ask(self, history: Sequence[int]) -> Draft:
        prop = self.drafter.propose(history, self.k)
        if prop.tokens and not any(start == len(history) for start, _, _ in self.pending):
            self.pending.append((len(history), prop, 0))
        return prop

    def settle(self, history: Sequence[int]) -> list[Settled]:
        """The proposed tokens decided since the last call, in order. A proposal's tokens after its
        first mismatch are never reached, so not scored."""
        out: list[Settled] = []
        keep = []
        for start, prop, seen in self.pending:
            known = min(len(history) - start, len(prop))
            ended = False
            while seen < known:
                if history[start + seen] != prop.tokens[seen]:
                    out.append(Settled(seen, False, prop.match))
                    ended = True
                    break
                out.append(Settled(seen, True, prop.match))
                seen += 1
            if not ended and seen < len(prop):
                keep.append((start, prop, seen))
        self.pending = keep
        return out
