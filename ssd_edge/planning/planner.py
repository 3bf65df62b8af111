"""The round planner, for every mode: each round, which proposal the target verifies.

On offer each round (whichever exist):

    plain        nothing drafted: one target step
    ngram  m     the first m tokens the n-gram lookup proposes (free to make)
    draft  m     the draft model drafts m tokens now, first reading what it has not read yet (and,
                 where that saves steps, the n-gram copy's first tokens as its guess: drafters.py)
    prepared m   a branch pre-speculated while the target verified the last round (an SSD hit or
                 partial hit), extended by the draft if it holds fewer than m tokens

A mode is a menu (MENUS). `auto` plans over all four; a fixed mode is the planner held to one
proposer at its full length: `ar` plain steps, `lookup` n-gram copies, `sd` drafts, `ssd` prepared
branches with the worker always on (a miss drafts now, or after a streak of misses takes the n-gram
backup, as the SSD policy says). The planned menu scores each option by expected tokens per
millisecond and takes the best:

    rate(m) = (1 + sum_{i=1..m} prod_{j<i} alpha_j) / (verify(m + 1) + drafting ms)

alpha_j is that proposer's live acceptance at draft position j; verify(n) is the target's decode of
n tokens (costs.py: the calibration profile's curve, following what this generation times). m runs
up to the cap: --draft-max when given, else DRAFT_CAP for the draft model and NGRAM_CAP for an
n-gram copy, so drafts grow as long as the verify curve pays for them (long on a GPU, short or none
on a compute-bound CPU). A draft that has fallen behind (plain or n-gram rounds, the prompt) must
first read what it missed; that reading is an investment in every later draft round, so its cost
is spread over the tokens still to come (at most HORIZON).

Evidence arrives even for proposers that did not run: the n-gram lookup is asked every round and
scored against what the target committed; the draft's acceptance is estimated from the target's
own confidence while only plain steps run (calibrated by the rounds where the draft did run).
One bad round early can still write the draft off where it would pay (its acceptance and that
calibration both drop), so where the device could reward a good draft handsomely (upside: a
draft accepted at EXPLORE_ALPHA would beat plain steps by EXPLORE_UPSIDE, on a memory-bound
target) a plain-step stretch is broken by a short probe now and then, the wait doubling after
each probe the plan does not follow. On a compute-bound CPU the upside is below 1.1 and no probe
ever runs.

The pre-speculation worker (speculation/prespec.py) drafts the next round beside the verify: in
`ssd` always (unless the SSD policy rolled it back or cut it), in `auto` only while it earns its
keep (worker_runs): the rounds it prepares must be used, and the time a used branch saves must
beat what the worker costs the verify (costs.Costs.contention, measured against idle rounds).

Lossless without help from here: tokens are drawn with coupled noise (coupling.py), so what the
target commits never depends on what was proposed; the planner only decides how fast.

Pure state and arithmetic on the engine thread: no models, no threads; tested with plain numbers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, Mapping, NamedTuple, Sequence

import numpy as np

from ..speculation.drafters import Draft, GoOn, NgramDrafter
from .costs import Costs, Rate, describe_regime

log = logging.getLogger(__name__)

Kind = Literal["plain", "ngram", "draft", "prepared"]
SERVED = {"plain": "ar", "ngram": "lookup", "draft": "sd", "prepared": "ssd"}  # the mode each kind is

DRAFT_CAP = 8    # most draft-model tokens a round verifies when --draft-max is not given
NGRAM_CAP = 16   # most n-gram tokens likewise (an exact copy costs nothing to draft)
FIXED_K = 3      # the fixed modes' draft length without --draft-max (llama.cpp's default)
PLAIN_MARGIN = 0.03  # a speculative plan must beat a plain step by this much (estimates carry noise)
HORIZON = 128        # most tokens over which the draft's catch-up is spread
HIT_PRIOR = 0.5      # how often a prepared round is used, until measured
IDLE_EVERY = 16      # a worker busy this many rounds rests one, to time an idle verify (contention)
IDLE_FIRST = 4       # ... this many, when no idle verify of that size was ever timed
IDLE_QUIET = 1.05    # a worker slowing the target by at most this (a GPU target) costs it nothing to speak of:
IDLE_DOUBLINGS = 3   # ... each rest after busy verifies that found so doubles the busy rounds to the next, up to 8x
# Probing a written-off draft (see the module docstring): where a draft accepted at EXPLORE_ALPHA
# would beat plain steps by EXPLORE_UPSIDE, EXPLORE_K tokens are drafted after EXPLORE_FIRST plain
# rounds, then after twice as many each time the probe is not followed, up to EXPLORE_MOST.
EXPLORE_ALPHA = 0.9
EXPLORE_UPSIDE = 1.25
EXPLORE_K = 3
EXPLORE_FIRST = 8
EXPLORE_MOST = 64
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


def _deepest_measured(rates: Sequence[Rate], i: int) -> int:
    """Position i, or where i was never reached, the deepest position before it that was (one step
    back per unmeasured position, while the one before is measured)."""
    while i > 0 and rates[i].n == 0 and rates[i - 1].n > 0:
        i -= 1
    return i


def match_class(match: int) -> int:
    """The class of an n-gram match of `match` tokens (an index into MATCH_PRIORS)."""
    return sum(match >= edge for edge in MATCH_CLASSES)


@dataclass(frozen=True)
class Menu:
    """What a mode may propose. planned: choose kind and length by expected rate each round (else
    the mode's one speculative kind at its full length whenever it has tokens). worker: whether
    the pre-speculation worker drafts beside the verify: never, always, or while it pays."""

    kinds: frozenset[str]
    planned: bool
    worker: Literal["off", "always", "earned"]


MENUS = {
    "ar": Menu(frozenset({"plain"}), False, "off"),
    "lookup": Menu(frozenset({"plain", "ngram"}), False, "off"),
    "sd": Menu(frozenset({"plain", "draft"}), False, "off"),
    "ssd": Menu(frozenset({"plain", "draft", "prepared", "ngram"}), False, "always"),
    "auto": Menu(frozenset({"plain", "draft", "prepared", "ngram"}), True, "earned"),
}


def k_text(mode: str, k: int | None) -> str | None:
    """The draft length as `mode` runs it, for the faces: -k when given; else "auto" where the planner
    chooses each round's (mode auto), the fixed modes' FIXED_K (sd, lookup, ssd), and nothing for ar,
    which drafts nothing."""
    if k is not None:
        return str(k)
    if mode == "ar":
        return None
    return "auto" if MENUS[mode].planned else str(FIXED_K)


@dataclass(frozen=True)
class Offer:
    """What can be verified this round. room: most tokens the round may draft (context, max_tokens);
    prepared: tokens a pre-speculated branch holds (None: no branch); a branch the draft stopped
    early (--draft-p-min) counts as complete (prepared_done)."""

    room: int
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
    rate: float                    # expected tokens per ms (0: not planned)
    runner_up: tuple[Kind, int, float] | None = None
    guess: int = 0                 # a draft: how many of the n-gram's tokens it reads as a guess first

    def describe(self) -> str:
        ru = f"; runner-up {self.runner_up[0]} {self.runner_up[1]} at {self.runner_up[2] * 1e3:.1f} tok/s" \
            if self.runner_up else ""
        return f"{self.kind} {self.m} at {self.rate * 1e3:.1f} tok/s expected{ru}"


class Planner:
    """Live estimates and the per-round decision (see the module docstring)."""

    def __init__(self, menu: Menu, costs: Costs | None = None, *, draft_cap: int = DRAFT_CAP,
                 ngram_cap: int = NGRAM_CAP, k_min: int = 0, ngram: NgramDrafter | None = None,
                 draft_prior: float = 0.7) -> None:
        self.menu = menu
        self.costs = costs or Costs()
        self.caps = {"draft": draft_cap, "prepared": draft_cap, "ngram": ngram_cap}
        self.k_min = k_min  # --draft-min: no round verifies fewer drafted tokens (but none)
        # P(accept position i | reached it). The draft's prior (the profile's acceptance) counts as
        # DRAFT_PRIOR_WEIGHT trials; the n-gram's as one, so its first real trials outweigh it at once,
        # per class of match length (how far back the copied passage agrees with the history's end):
        # a long exact copy goes on likelier than a short one.
        self.draft_alpha = [Rate(draft_prior, weight=DRAFT_PRIOR_WEIGHT) for _ in range(draft_cap)]
        self.ngram_alpha = [[Rate(prior, weight=1.0) for _ in range(ngram_cap)] for prior in MATCH_PRIORS]
        self.ngram_match = 0  # the match length of this round's n-gram proposal
        self.confidence = Rate(draft_prior, weight=1.0, keep=0.9)  # target's top-1 prob. of committed tokens
        self.calibration = Rate(1.0, weight=2.0, keep=0.98)       # accepted draft tokens per unit confidence
        self.draft_sureness = Rate(1.0, weight=2.0, keep=0.95)    # P(accepted | reached) / the draft's own top probability
        self._p_tops: list[float] | None = None                    # the draft's top probabilities in the draft go_on runs
        self.rounds_since_draft = 0
        self.draft_rounds = 0                                      # rounds the draft model drafted
        self.draft_reached = [0] * draft_cap                       # ... counted when each position was last reached
        self.explore_wait = EXPLORE_FIRST                          # plain rounds before the next probe
        self.probes = 0
        self.guessed = 0                                           # drafts that read an n-gram copy as their guess
        self.hits = Rate(HIT_PRIOR, weight=2.0, keep=0.95)         # prepared rounds used / looked up
        self.rounds_resting = 0                                    # rounds since the worker last prepared
        self.busy_streak = 0                                       # rounds the worker has drafted in a row
        # doublings of IDLE_EVERY (IDLE_QUIET): one to start with where the profile found the worker quiet
        self.idle_backoff = int(self.costs.contention <= IDLE_QUIET)
        self._compared = 0                                         # busy-vs-idle comparisons at the last rest
        self._draft_alphas: dict[int, float] = {}                  # alpha("draft", i) until the next observe()
        self.prefilled = False                                     # the prompt's round has run
        self.shadow = NgramShadow(ngram, ngram_cap) if ngram is not None and "ngram" in menu.kinds else None
        self.decisions: dict[str, int] = {}
        self.log: list[tuple] = []  # every planned decision: (kind, m, tok/s, runner-up kind, m, tok/s)

    @property
    def wants_confidence(self) -> bool:
        """Whether observe() reads the target's top-1 probabilities (the draft's acceptance proxy)."""
        return self.menu.planned and "draft" in self.menu.kinds

    # ------------------------------------------------------------ estimates
    def alpha(self, kind: Kind, i: int) -> float:
        """P(position i accepted | the ones before were); the draft's, computed once between two
        observe() calls (a round asks for each position several times: its plan, the outcomes the
        worker ranks, the SSD window)."""
        if kind == "ngram":
            return self._alpha(kind, i)
        a = self._draft_alphas.get(i)
        if a is None:
            a = self._draft_alphas[i] = self._alpha(kind, i)
        return a

    def _alpha(self, kind: Kind, i: int) -> float:
        """alpha() as estimated now. A position never yet reached (drafts were
        shorter) takes the estimate of the deepest one measured: acceptance along a draft is flat or
        rising past its first token, and without this a draft could never grow past the lengths
        it started at. Likewise a draft position not reached for a while fades into the estimate of
        the one before it (DEPTH_FADE): one early rejection there must not keep every later draft
        shorter than it, since a short draft never measures it again."""
        rates = self.ngram_alpha[match_class(self.ngram_match)] if kind == "ngram" else self.draft_alpha
        i = _deepest_measured(rates, min(i, len(rates) - 1))
        if kind == "ngram":
            return rates[i].value
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
        return fresh * self._draft_measured(i) + (1.0 - fresh) * proxy

    def _draft_measured(self, i: int) -> float:
        """Draft position i's measured acceptance (i as _deepest_measured gives it), faded into position
        i - 1's by the draft rounds since i was last reached (DEPTH_FADE)."""
        measured = self.draft_alpha[i].value
        if i > 0 and self.draft_rounds > self.draft_reached[i]:
            fresh = 0.5 ** ((self.draft_rounds - self.draft_reached[i]) / DEPTH_FADE)
            before = self._draft_measured(_deepest_measured(self.draft_alpha, i - 1))
            measured = fresh * measured + (1.0 - fresh) * before
        return measured

    def gains(self, kind: Kind, m: int) -> list[float]:
        """[g_0 .. g_m]: g_j = E[tokens committed] when j tokens of `kind` are verified."""
        out, reach = [1.0], 1.0
        for i in range(m):
            reach *= self.alpha(kind, i)
            out.append(out[-1] + reach)
        return out

    def p_accept(self, k: int) -> np.ndarray:
        """P(a of k drafted tokens accepted), a = 0..k (what the worker ranks outcomes by):
        prod_{i<a} alpha_i * (1 - alpha_a), and prod_{i<k} alpha_i for a = k."""
        out, reach = [], 1.0  # (a Python loop: numpy's calls cost more than 9 products)
        for i in range(k):
            al = self.alpha("draft", i)
            out.append(reach * (1.0 - al))
            reach *= al
        out.append(reach)
        return np.array(out)

    def hit_rate(self) -> float:
        """How often a prepared round is used. Measured only while the worker prepares, so while it
        rests it fades back to the prior (as a stale draft alpha does): one bad stretch (prose)
        cannot keep the worker idle once the text turns predictable."""
        fresh = 0.5 ** (self.rounds_resting / 8.0)
        return fresh * self.hits.value + (1.0 - fresh) * HIT_PRIOR

    def upside(self) -> float:
        """How much faster than plain steps a draft accepted at EXPLORE_ALPHA would make tokens here,
        at its best length: above 1.5 where verifying is nearly free, about 1 on a compute-bound CPU."""
        lengths = self._lengths("draft", self.caps["draft"])
        verify, step = self.costs.target.ms, self.costs.draft.ms(1)
        a = EXPLORE_ALPHA
        best = max(((1.0 - a ** (m + 1)) / (1.0 - a) / (verify(m + 1) + m * step) for m in lengths), default=0.0)
        return best * self.costs.step_ms()

    def _probe(self, offer: Offer, kind: Kind) -> int:
        """The length of a probe of the draft this round (0: none; see the module docstring)."""
        if kind != "plain" or not offer.draft or "draft" not in self.menu.kinds:
            return 0
        if self.rounds_since_draft < self.explore_wait or self.upside() < EXPLORE_UPSIDE:
            return 0
        m = min(max(EXPLORE_K, self.k_min), self.caps["draft"], offer.room)
        return m if m >= max(1, self.k_min) else 0

    def _lengths(self, kind: Kind, room: int) -> range:
        return range(max(1, self.k_min), min(self.caps[kind], room) + 1)

    # ------------------------------------------------------------ decisions
    def plan(self, offer: Offer) -> Decision:
        d = self._plan(offer)
        self.decisions[d.kind] = self.decisions.get(d.kind, 0) + 1
        return d

    def _plan(self, offer: Offer) -> Decision:
        kinds = self.menu.kinds
        if not self.menu.planned:  # a fixed mode: its one proposer, as long as it goes
            if "prepared" in kinds and offer.prepared is not None:  # ssd: a hit, or a partial one extended
                return Decision("prepared", min(self.caps["prepared"], offer.room), 0.0)
            # (a draft shorter than --draft-min is not verified: rounds.verifiable, for every mode)
            if "ngram" in kinds and offer.ngram:  # lookup; ssd's backup after a streak of misses
                return Decision("ngram", min(offer.ngram, self.caps["ngram"], offer.room), 0.0)
            if "draft" in kinds and offer.draft:
                return Decision("draft", min(self.caps["draft"], offer.room), 0.0)
            return Decision("plain", 0, 0.0)
        if not self.prefilled:  # the first token as fast as ar; a worker reads the prompt meanwhile
            return Decision("plain", 0, 0.0)
        if not (offer.ngram and "ngram" in kinds) and not (offer.prepared is not None and "prepared" in kinds) \
                and not (offer.draft and "draft" in kinds):  # nothing on offer but a plain step (no probe either)
            rate = 1.0 / self.costs.step_ms()
            self.log.append(("plain", 0, round(rate * 1e3, 2)))
            return Decision("plain", 0, rate)
        verify, draft_step = self.costs.target.ms, self.costs.draft.ms(1)
        scored: list[tuple[float, Kind, int]] = [(1.0 / self.costs.step_ms() * (1.0 + PLAIN_MARGIN), "plain", 0)]
        if "ngram" in kinds and offer.ngram:
            g = self.gains("ngram", offer.ngram)
            scored += [(g[m] / verify(m + 1), "ngram", m) for m in self._lengths("ngram", min(offer.room, offer.ngram))]
        if offer.prepared is not None and "prepared" in kinds:
            ready = self.caps["prepared"] if offer.prepared_done else offer.prepared
            g = self.gains("draft", self.caps["prepared"])
            scored += [(g[m] / (verify(m + 1) + max(0, m - ready) * draft_step), "prepared", m)
                       for m in self._lengths("prepared", offer.room)]
        guesses: dict[int, int] = {}
        if offer.draft and "draft" in kinds:
            g = self.gains("draft", self.caps["draft"])
            read = self.costs.draft.ms(offer.draft_unread + 1)
            catch_up = max(0.0, read - draft_step)
            horizon = max(1, min(offer.remaining, HORIZON))
            # an n-gram copy read as the draft's guess (ModelDrafter.extend): its rows cost a little
            # each in the batch that reads the catch-up, and each row the draft then draws as guessed
            # saves it a step (as often as the target would take the copy: the n-gram's acceptance)
            most = min(offer.ngram, self.caps["draft"] - 1) if "ngram" in kinds else 0
            agree = self.gains("ngram", most)
            guess_ms = [self.costs.draft.ms(offer.draft_unread + 1 + n) - read for n in range(most + 1)]
            for m in self._lengths("draft", offer.room):
                drafting = m * draft_step
                # the guess of the length that saves the most (0: none)
                saved, guess = max(((agree[n] - 1.0) * draft_step - guess_ms[n], n)
                                   for n in range(min(m - 1, most) + 1))
                if guess and saved > 0:
                    drafting -= saved
                    guesses[m] = guess
                scored.append((g[m] / (verify(m + 1) + drafting + catch_up * min(1.0, g[m] / horizon)), "draft", m))
        scored.sort(key=lambda x: -x[0])
        (rate, kind, m), rest = scored[0], scored[1:]
        unmargin = lambda r, k: r / (1.0 + PLAIN_MARGIN) if k == "plain" else r  # noqa: E731
        ru = next(((k2, m2, unmargin(r2, k2)) for r2, k2, m2 in rest if k2 != kind), None)
        if kind in ("draft", "prepared"):
            self.explore_wait = EXPLORE_FIRST  # the plan drafts on its own: probes start over
        probe = self._probe(offer, kind)
        if probe:  # the draft is measured again rather than inferred; the next probe waits longer
            self.probes += 1
            self.explore_wait = min(2 * self.explore_wait, EXPLORE_MOST)
            kind, m, rate, ru = "draft", probe, 0.0, (kind, m, unmargin(rate, kind))
        d = Decision(kind, m, unmargin(rate, kind), ru, guesses.get(m, 0) if kind == "draft" else 0)
        self.guessed += d.guess > 0
        self.log.append((kind, m, round(d.rate * 1e3, 2), *((ru[0], ru[1], round(ru[2] * 1e3, 2)) if ru else ())))
        log.debug("plan: %s", d.describe())
        return d

    def go_on(self, d: Decision) -> GoOn | None:
        """How long a draft drafted now runs, in a planned mode: the plan chose to draft (and an
        estimated length d.m, from per-position averages); the draft's own confidence then says, token
        by token, how far this one is worth going, up to the cap. With token j's row computed, the
        token is drawn while drafting on from it pays: for some length L up to the cap, the tokens
        j..L-1 add more expected tokens per ms (each accepted with the draft's probability at j, on top
        of P(tokens before j accepted)) than the plan's rate, at what they add to the verify and the
        draft steps they take. After drawing it, the draft steps on to token j + 1 while the same
        holds from there. Looking past the next token matters: a verify curve rises in steps (on the BF16
        stand-in here 4 tokens cost what 5 do), and one token's own cost would stop a confident draft
        at each step up. The draft's probabilities are scaled by how they have predicted its
        acceptance so far (draft_sureness, token by token: a draft model can be over- or under-sure).
        Asked before each token is drawn, from what the draft knew then (lossless: the length never
        depends on a token drawn after it). None: the fixed modes and probes draft d.m."""
        self._p_tops = None
        if not self.menu.planned or d.kind != "draft" or d.rate <= 0:
            return None
        verify, step, least, cap = self.costs.target.ms, self.costs.draft.ms(1), max(1, self.k_min), self.caps["draft"]
        sure = self.draft_sureness.value
        reach = 1.0  # P(every token drafted so far is accepted)
        p_tops = self._p_tops = []

        def pays(j: int, p: float, row: bool) -> bool:
            """Whether drafting tokens j.. (each accepted with p; `row`: token j's row is computed, else a
            step computes it) beats the plan's rate for some length up to the cap."""
            gain, now = 0.0, verify(j + 1)
            for n in range(j + 1, cap + 1):  # tokens j..n-1: the verify grows to n + 1, n - 1 - j steps more
                gain += reach * p ** (n - j)
                cost = verify(n + 1) - now + (n - 1 - j + (not row)) * step
                if gain / max(cost, 1e-3) >= d.rate:
                    return True
            return False

        def go_on(j: int, p_top: float) -> tuple[bool, bool]:
            nonlocal reach
            p = min(1.0, p_top * sure)
            if j >= least and not pays(j, p, row=True):
                return False, False
            reach *= p
            p_tops.append(p_top)
            return True, j + 1 < least or pays(j + 1, p, row=False)

        return go_on

    def worker_runs(self, verifying: int) -> bool:
        """Should the worker prepare the next round while the target verifies `verifying` tokens?"""
        runs = self._worker_runs(verifying)
        self.busy_streak = self.busy_streak + 1 if runs else 0
        return runs

    def _worker_runs(self, verifying: int) -> bool:
        if self.menu.worker == "always":
            return True
        if self.menu.worker == "off":
            return False
        if not self.prefilled:  # the draft reads the prompt beside the target's own reading of it, unless
            return self.upside() >= 1.0  # no draft could beat plain steps here (a compute-bound CPU)
        # rest one round now and then: an idle verify of this size prices the worker's cost (soon
        # after it starts when none was ever timed, then every IDLE_EVERY busy rounds; where the
        # worker is found to cost the target nothing, ever more rarely: each rest costs a round
        # without a prepared draft, most of the time such a round is there to save on a GPU)
        if self.costs.contention > IDLE_QUIET:
            self.idle_backoff = 0
        every = IDLE_EVERY << self.idle_backoff
        if verifying not in self.costs.idle_ms and not self.idle_backoff:
            every = IDLE_FIRST
        if self.busy_streak >= every and self.costs.idle_stale(verifying, every):
            if self.costs.compared > self._compared:  # busy verifies were timed against idle ones since
                self.idle_backoff = min(self.idle_backoff + 1, IDLE_DOUBLINGS)  # (quiet: checked above)
                self._compared = self.costs.compared
            return False
        return self.prespec_pays(verifying)

    def prespec_pays(self, verifying: int = 1) -> bool:
        """Preparing costs this verify its slowdown beside the draft: (contention - 1) x its time (on a
        GPU target next to nothing; on cores the two models share, a lot). It pays when the next
        round uses what was prepared (the hit rate) and a ready branch of m tokens then saves time
        against the best way to make as many tokens without one (plain steps, or a draft drafted
        just in time). Otherwise the worker rests and the target verifies alone."""
        lengths = self._lengths("draft", self.caps["draft"])
        if not lengths:
            return False
        verify, step = self.costs.target.ms, self.costs.draft.ms(1)
        g = self.gains("draft", self.caps["draft"])
        alternative = max(1.0 / self.costs.step_ms(), *(g[m] / (verify(m + 1) + m * step) for m in lengths))
        saved = max(g[m] / alternative - verify(m + 1) for m in lengths)
        cost = (self.costs.contention - 1.0) * verify(verifying)
        return self.hit_rate() * saved > cost

    def branch_depth(self) -> int:
        """How many tokens the worker drafts on each branch: in ssd its full draft length (a hit is
        verified whole); planned, the length a ready branch is best verified at (its tokens cost
        nothing by then)."""
        if not self.menu.planned:
            return self.caps["prepared"]
        lengths = self._lengths("prepared", self.caps["prepared"])
        if not lengths:
            return max(1, self.k_min)
        g = self.gains("draft", self.caps["prepared"])
        return max(lengths, key=lambda m: g[m] / self.costs.target.ms(m + 1))

    # ------------------------------------------------------------ observations
    def observe(self, kind: Kind, drafted: int, accepted: int, verify_ms: float,
                committed_top1: Sequence[float] | Mapping[int, float] = (), busy: bool = False) -> None:
        """A verified round: what was proposed, how much was accepted, the target's decode time
        (busy: with the worker drafting beside it), and the target's top-1 probability at the
        committed positions (accepted drafts, then its own) where wants_confidence: at each (a
        sequence), or at some of them (index -> probability: Rounds reads the first and the last)."""
        self._draft_alphas.clear()  # everything alpha() reads of the draft changes here alone
        top1 = committed_top1 if isinstance(committed_top1, Mapping) else dict(enumerate(committed_top1))
        for p in top1.values():
            self.confidence.add(p)
        if self.prefilled:  # the prompt's round: its time says nothing of a step (its acceptance does)
            self.rounds_resting = 0 if busy else self.rounds_resting + 1
            self.costs.observe_target(drafted + 1, verify_ms, busy)
        self.prefilled = True
        if kind in ("draft", "prepared") and drafted:
            self.rounds_since_draft = 0
            self.draft_rounds += 1
            for i in range(min(drafted, len(self.draft_alpha), accepted + 1)):
                self.draft_alpha[i].add(1.0 if i < accepted else 0.0)  # position i was reached; accepted?
                self.draft_reached[i] = self.draft_rounds
            n_reached = min(drafted, accepted + 1)
            reached = [p for i, p in top1.items() if i < n_reached]
            if reached:  # the confidence summed over the reached positions (estimated from those read)
                self.calibration.add(accepted, n_reached * sum(reached) / len(reached))
            if kind == "draft" and self._p_tops:  # each token reached: accepted, against its probability
                for i, p_top in enumerate(self._p_tops[:min(drafted, accepted + 1)]):
                    self.draft_sureness.add(1.0 if i < accepted else 0.0, p_top)
        else:
            self.rounds_since_draft += 1
        if kind == "ngram" and drafted and self.shadow is None:
            rates = self.ngram_alpha[match_class(self.ngram_match)]
            for i in range(min(drafted, accepted + 1, len(rates))):
                rates[i].add(1.0 if i < accepted else 0.0)

    def observe_lookup(self, used: bool) -> None:
        """A round after the worker prepared: was a prepared branch verified? A branch found but not
        worth verifying saved nothing."""
        self.hits.add(1.0 if used else 0.0)
        self.rounds_resting = 0

    def observe_history(self, history: Sequence[int]) -> None:
        """The committed history after a round: scores the n-gram lookup's standing proposals."""
        if self.shadow is not None:
            for s in self.shadow.settle(history):
                rates = self.ngram_alpha[match_class(s.match)]
                rates[min(s.position, len(rates) - 1)].add(1.0 if s.matched else 0.0)

    def ask_ngram(self, history: Sequence[int]) -> Draft:
        """The n-gram lookup's proposal for this round (remembered, to be scored as tokens commit)."""
        if self.shadow is None:
            return Draft((), "ngram")
        draft = self.shadow.ask(history)
        self.ngram_match = draft.match
        return draft

    def observe_draft(self, unread: int, feed_ms: float, steps: int, steps_ms: float) -> None:
        """A just-in-time draft: reading `unread` + 1 tokens took feed_ms, then `steps` single steps."""
        self.costs.draft.add(unread + 1, feed_ms)
        if steps:
            self.costs.draft.add(1, steps_ms / steps)

    def report(self) -> dict:
        verify = [round(self.costs.target.ms(n), 2) for n in range(1, self.caps["ngram"] + 2)]
        return {"decisions": dict(self.decisions),
                "draft_alpha": [round(self.alpha("draft", i), 3) for i in range(self.caps["draft"])],
                "draft_alpha_measured": [round(r.value, 3) if r.n else None for r in self.draft_alpha],
                "ngram_alpha_by_match": {f">={([0] + list(MATCH_CLASSES))[c]}": [round(r.value, 3) for r in rates]
                                         for c, rates in enumerate(self.ngram_alpha)},
                "step_ms": round(self.costs.step_ms(), 2),
                "verify_ms": {n: v for n, v in enumerate(verify, 1)},
                "regime": describe_regime(verify),
                "draft_step_ms": round(self.costs.draft.ms(1), 2),
                "contention": round(self.costs.contention, 3),
                "prepared_hit_rate": round(self.hit_rate(), 3),
                "upside": round(self.upside(), 3),
                "probes": self.probes,
                "guessed": self.guessed,
                "draft_sureness": round(self.draft_sureness.value, 3),
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
