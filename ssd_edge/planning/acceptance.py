"""Acceptance estimates: P(a proposer's draft position i is accepted | the ones before were).

    DraftAcceptance   the draft model's (its drafts now and the branches it prepares): measured in
                      the rounds it drafts, and between them estimated from the target's own
                      confidence, calibrated by the rounds where the draft did run
    NgramAcceptance   the n-gram lookup's, by class of match length; asked every round and scored
                      against what the target committed, so it is known in rounds it did not serve

    gains(alpha, m)   [g_0 .. g_m]: g_j = E[tokens committed] when j drafted tokens are verified
                      (1 + sum_{i=1..j} prod_{k<i} alpha_k: the target's own token, then each
                      drafted one reached and accepted)

Pure state and arithmetic on the engine thread; tested with plain numbers (tests/unit/test_planner.py).
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np

from ..speculation.drafters import Draft, NgramDrafter
from .costs import Rate

# The draft's acceptance prior counts as this many trials: one rejected token at an answer's opening
# (often its least predictable text) must not write off a draft that is right three times in four
# there later (on the stand-in, one early miss held auto to plain steps where sd ran 1.3x faster)
DRAFT_PRIOR_WEIGHT = 3.0
DEPTH_FADE = 4.0     # draft rounds over which a position not reached fades halfway into the one before
CONFIDENCE_FADE = 16.0  # rounds without a draft over which the confidence proxy's calibration fades halfway to 1
# n-gram matches by length (tokens the two passages agree over): shorter than 4, 4-7, 8-15, 16-31,
# 32 and more, and each class's acceptance prior, until measured
MATCH_CLASSES = (4, 8, 16, 32)
MATCH_PRIORS = (0.35, 0.5, 0.65, 0.8, 0.9)


def gains(alpha: Callable[[int], float], m: int) -> list[float]:
    """[g_0 .. g_m]: g_j = E[tokens committed] when j tokens are verified, each accepted with
    alpha(i) once the ones before it were."""
    out, reach = [1.0], 1.0
    for i in range(m):
        reach *= alpha(i)
        out.append(out[-1] + reach)
    return out


def deepest_measured(rates: Sequence[Rate], i: int) -> int:
    """Position i, or where i was never reached, the deepest position before it that was (one step
    back per unmeasured position, while the one before is measured)."""
    while i > 0 and rates[i].n == 0 and rates[i - 1].n > 0:
        i -= 1
    return i


def match_class(match: int) -> int:
    """The class of an n-gram match of `match` tokens (an index into MATCH_PRIORS)."""
    return sum(match >= edge for edge in MATCH_CLASSES)


class DraftAcceptance:
    """The draft model's acceptance by position (the prior: the profile's acceptance, counted as
    DRAFT_PRIOR_WEIGHT trials), and how sure of itself it is."""

    def __init__(self, cap: int, prior: float = 0.7) -> None:
        self.rates = [Rate(prior, weight=DRAFT_PRIOR_WEIGHT) for _ in range(cap)]
        self.confidence = Rate(prior, weight=1.0, keep=0.9)   # target's top-1 prob. of committed tokens
        self.calibration = Rate(1.0, weight=2.0, keep=0.98)   # accepted draft tokens per unit confidence
        self.sureness = Rate(1.0, weight=2.0, keep=0.95)      # P(accepted | reached) / the draft's own top probability
        self.rounds_since_draft = 0
        self.draft_rounds = 0                                  # rounds the draft model drafted
        self.reached = [0] * cap                               # ... counted when each position was last reached
        self._alphas: dict[int, float] = {}                    # alpha(i) until the next observe()

    def alpha(self, i: int) -> float:
        """P(position i accepted | the ones before were), computed once between two observe() calls
        (a round asks for each position several times: its plan, the outcomes the worker ranks, the
        SSD window)."""
        a = self._alphas.get(i)
        if a is None:
            a = self._alphas[i] = self.estimate(i)
        return a

    def gains(self, m: int) -> list[float]:
        return gains(self.alpha, m)

    def mean(self) -> float:
        """The mean acceptance over the positions (the SSD window's acceptance)."""
        return sum(self.alpha(i) for i in range(len(self.rates))) / len(self.rates)

    def p_accept(self, k: int) -> np.ndarray:
        """P(a of k drafted tokens accepted), a = 0..k (what the worker ranks outcomes by):
        prod_{i<a} alpha_i * (1 - alpha_a), and prod_{i<k} alpha_i for a = k."""
        out, reach = [], 1.0  # (a Python loop: numpy's calls cost more than 9 products)
        for i in range(k):
            al = self.alpha(i)
            out.append(reach * (1.0 - al))
            reach *= al
        out.append(reach)
        return np.array(out)

    def estimate(self, i: int) -> float:
        """alpha(i) as estimated now. A position never yet reached (drafts were shorter) takes the
        estimate of the deepest one measured: acceptance along a draft is flat or rising past its
        first token, and without this a draft could never grow past the lengths it started at.
        Likewise a position not reached for a while fades into the estimate of the one before it
        (DEPTH_FADE): one early rejection there must not keep every later draft shorter than it,
        since a short draft never measures it again."""
        rates = self.rates
        i = deepest_measured(rates, min(i, len(rates) - 1))
        # the calibration of that proxy was learnt in the rounds the draft ran, and fades back to 1 while it
        # does not (CONFIDENCE_FADE): a draft that did badly on an answer's opening is tried again once
        # the target grows sure (its code), instead of being held off by those first rounds for good
        fade = 0.5 ** (self.rounds_since_draft / CONFIDENCE_FADE)
        proxy = min(1.0, (1.0 + (self.calibration.value - 1.0) * fade) * self.confidence.value)
        if rates[i].n == 0:  # the draft has not run yet: the target's confidence is all there is
            return proxy
        # Stale measurements fade into the confidence estimate: a draft written off on prose is tried
        # again when the target grows confident (code), without paying for a blind exploration.
        fresh = 0.5 ** (self.rounds_since_draft / 8.0)
        return fresh * self._measured(i) + (1.0 - fresh) * proxy

    def _measured(self, i: int) -> float:
        """Position i's measured acceptance (i as deepest_measured gives it), faded into position
        i - 1's by the draft rounds since i was last reached (DEPTH_FADE)."""
        measured = self.rates[i].value
        if i > 0 and self.draft_rounds > self.reached[i]:
            fresh = 0.5 ** ((self.draft_rounds - self.reached[i]) / DEPTH_FADE)
            before = self._measured(deepest_measured(self.rates, i - 1))
            measured = fresh * measured + (1.0 - fresh) * before
        return measured

    def observe(self, drafted_by_it: int, accepted: int, top1: Mapping[int, float],
                p_tops: Sequence[float] | None = None) -> None:
        """A verified round: drafted_by_it, the tokens the draft model drafted in it (0: another
        proposer's round, or a plain step); the target's top-1 probability at some committed
        positions (index -> probability); p_tops, the draft's own top probability at each token of a
        draft whose length its confidence decided (DraftProposer's stopping rule)."""
        self._alphas.clear()  # everything alpha() reads changes here alone
        for p in top1.values():
            self.confidence.add(p)
        if not drafted_by_it:
            self.rounds_since_draft += 1
            return
        self.rounds_since_draft = 0
        self.draft_rounds += 1
        for i in range(min(drafted_by_it, len(self.rates), accepted + 1)):
            self.rates[i].add(1.0 if i < accepted else 0.0)  # position i was reached; accepted?
            self.reached[i] = self.draft_rounds
        n_reached = min(drafted_by_it, accepted + 1)
        reached = [p for i, p in top1.items() if i < n_reached]
        if reached:  # the confidence summed over the reached positions (estimated from those read)
            self.calibration.add(accepted, n_reached * sum(reached) / len(reached))
        for i, p_top in enumerate((p_tops or ())[:n_reached]):  # each token reached: accepted, against its probability
            self.sureness.add(1.0 if i < accepted else 0.0, p_top)

    def report(self) -> dict:
        return {"draft_alpha": [round(self.alpha(i), 3) for i in range(len(self.rates))],
                "draft_alpha_measured": [round(r.value, 3) if r.n else None for r in self.rates],
                "draft_sureness": round(self.sureness.value, 3)}


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


class NgramAcceptance:
    """The n-gram lookup's acceptance by position, per class of match length (how far back the copied
    passage agrees with the history's end: a long exact copy goes on likelier than a short one). Each
    prior counts as one trial, so the first real trials outweigh it at once."""

    def __init__(self, drafter: NgramDrafter, cap: int) -> None:
        self.rates = [[Rate(prior, weight=1.0) for _ in range(cap)] for prior in MATCH_PRIORS]
        self.match = 0  # the match length of this round's proposal
        self.shadow = NgramShadow(drafter, cap)

    def ask(self, history: Sequence[int]) -> Draft:
        """The lookup's proposal for this round (remembered, to be scored as tokens commit)."""
        draft = self.shadow.ask(history)
        self.match = draft.match
        return draft

    def copy(self, history: Sequence[int]) -> Draft:
        """The lookup's proposal, neither remembered nor scored (a fixed mode reads no acceptance)."""
        return self.shadow.drafter.propose(history, self.shadow.k)

    def alpha(self, i: int) -> float:
        rates = self.rates[match_class(self.match)]
        return rates[deepest_measured(rates, min(i, len(rates) - 1))].value

    def gains(self, m: int) -> list[float]:
        return gains(self.alpha, m)

    def observe(self, history: Sequence[int]) -> None:
        """The committed history after a round: scores the standing proposals."""
        for s in self.shadow.settle(history):
            rates = self.rates[match_class(s.match)]
            rates[min(s.position, len(rates) - 1)].add(1.0 if s.matched else 0.0)

    def report(self) -> dict:
        return {"ngram_alpha_by_match": {f">={([0] + list(MATCH_CLASSES))[c]}": [round(r.value, 3) for r in rates]
                                         for c, rates in enumerate(self.rates)}}
