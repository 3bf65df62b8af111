"""The one cost model: what a decode costs on this device, for the planner (planner.py).

    Costs.target.ms(n)   a target decode of n tokens: a plain step (n = 1) or a verify of n - 1 drafts
    Costs.draft.ms(n)    a draft decode of n tokens: a step, a catch-up read, a batch of branches
    Costs.contention     target decode time with the pre-speculation worker drafting beside it / alone

Each starts from the device's calibration profile (profile.py, `ssd-edge calibrate`) where there is
one, else from a prior, and follows what the generation times. The shape of the target's curve is
the device's regime: on a compute-bound CPU a verify of 4 tokens costs about 4 steps and only long
n-gram copies pay; where verifying is nearly free (GPUs, Apple silicon, big or high-precision models
on many cores) the draft model pays and long drafts pay more. describe_regime says which, in words.

Pure arithmetic on the engine thread; tested with plain numbers.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Sequence

# Without a profile: a CPU-like prior until timed (a verify of 4 tokens ~1.75 steps, a draft step
# 0.4 of a target step).
TARGET_SLOPE_PRIOR = 0.25
DRAFT_SLOPE_PRIOR = 0.27
DRAFT_STEP_PRIOR = 0.4
CONTENTION_PRIOR = 1.2  # target decode time with the worker busy / alone, until measured
# The least a busy worker is taken to cost a verify: its Python work (candidates, ranking) shares
# the interpreter with the engine thread even where its decodes run on other hardware.
CONTENTION_FLOOR = 1.02


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


class Curve:
    """ms of a decode of n tokens for one model.

    With the device's curve (the profile): the curve times a factor, observed / curve, learnt apart
    for a step (n = 1) and for a batch (n > 1: a verify, a draft's read), each the median of its
    class's last RECENT decodes: one slow decode (the machine busy for a moment) moves no price, a
    lasting change moves it within a few. A step and a batch run different kernels (matrix-vector
    against matrix-matrix), and a calibration's step can be off where its batches are not: on the
    BF16 stand-in here (2 threads) it timed a step at 75 ms and a verify of 4 at 148; a generation
    then stepped at 106 ms and verified 4 at ~150. One factor for both priced that verify at 208 ms,
    and auto took plain steps on prose where drafting 3 tokens made 1.35x as many tokens a second.
    A class not timed for a while fades into the other's factor (half-way in FADE decodes of the
    other; never timed: the other's), so a machine grown busier re-prices both, and a class no
    longer chosen is re-priced by the one that runs instead of keeping a price nothing re-times.

    Beyond the curve (a draft reading the prompt or what it missed, hundreds of tokens): the curve's
    end plus a cost per token past it, which every read timed past the end teaches (a running ratio
    of their extra ms to their extra tokens). Until one is timed, the cheapest per-token cost of any
    batch in the curve's upper half: a long batch costs no more per token than a shorter one (the
    matrix kernels only get fuller), while the last slope of a short, noisy curve priced 400 tokens
    of the 0.5B draft at 9-10 s where they take 1.5 s (2 threads, AMD EPYC).

    Without a curve: a running mean per size timed, and for sizes not yet timed a line through the
    nearest timed ones, beyond them the slope of the two largest (before two are timed, the prior's).
    A reading is clipped to within a factor of 2 of what was measured before, so one outlier moves it
    a bounded step; the first is taken whole (a prior is no measurement: a size priced by it must not
    stay mispriced because it was)."""

    ALPHA = 0.3  # weight of a new reading
    FADE = 16.0  # decodes of the other class over which a class's factor fades half-way into the other's
    RECENT = 5   # decodes of a class whose median is its factor

    def __init__(self, curve: Sequence[float] | None, step_prior: float, slope_prior: float) -> None:
        self.curve = list(curve) if curve else None
        self.step_prior = step_prior    # ms of one token before anything is timed
        self.slope_prior = slope_prior  # extra ms per extra token, as a fraction of one step
        # observed / curve of the last decodes of a step [0] and of a batch [1], and the decode count
        # when each was last timed
        self.recent: tuple[deque[float], deque[float]] = (deque(maxlen=self.RECENT), deque(maxlen=self.RECENT))
        self.medians: list[float | None] = [None, None]
        self.timed_at = [0, 0]
        self.decodes = 0
        self.timed: dict[int, float] = {}  # running mean per size (without a curve)
        self.past_ms = self.past_tokens = 0.0  # reads timed past the curve's end: extra ms, extra tokens (decayed)

    def add(self, n: int, ms: float) -> None:
        if n < 1 or ms <= 0:
            return
        if self.curve and n > len(self.curve):
            if self.past_tokens:  # clip against a measurement, not a prior
                old = self.ms(n)
                ms = min(max(ms, old / 2), old * 2)
            extra = n - len(self.curve)
            keep = 1.0 - self.ALPHA  # per read, whatever its size: the last few reads dominate
            self.past_ms = self.past_ms * keep + max(0.0, ms - self._end())
            self.past_tokens = self.past_tokens * keep + extra
            return
        within = bool(self.curve)
        if (self.recent[0] or self.recent[1]) if within else (n in self.timed):
            old = self.ms(n)
            ms = min(max(ms, old / 2), old * 2)
        if within:
            c = int(n > 1)
            self.decodes += 1
            self.recent[c].append(ms / self.curve[n - 1])
            self.medians[c] = statistics.median(self.recent[c])
            self.timed_at[c] = self.decodes
            return
        self.timed[n] = running_mean(self.timed.get(n), ms, self.ALPHA)

    def _factor(self, n: int) -> float:
        """observed / curve now for a decode of n tokens (1 before anything within the curve is timed)."""
        c = int(n > 1)
        own, other = self.medians[c], self.medians[1 - c]
        if own is None or other is None:
            return own if own is not None else other if other is not None else 1.0
        fresh = 0.5 ** ((self.decodes - self.timed_at[c]) / self.FADE)
        return fresh * own + (1.0 - fresh) * other

    def _end(self) -> float:
        assert self.curve
        return self.curve[-1] * self._factor(len(self.curve))

    def past_rate(self) -> float:
        """ms per token past the curve's end (see the class docstring)."""
        assert self.curve
        if self.past_tokens:
            return self.past_ms / self.past_tokens
        half = len(self.curve) // 2
        cheapest = min(ms / n for n, ms in enumerate(self.curve[half:], half + 1))
        return cheapest * self._factor(len(self.curve))

    def ms(self, n: int) -> float:
        n = max(1, n)
        if self.curve:
            if n <= len(self.curve):
                return self.curve[n - 1] * self._factor(n)
            return self._end() + self.past_rate() * (n - len(self.curve))
        if n in self.timed:
            return self.timed[n]
        if not self.timed:
            return self.step_prior * (1 + self.slope_prior * (n - 1))
        sizes = sorted(self.timed)
        lo = max((m for m in sizes if m < n), default=None)
        hi = min((m for m in sizes if m > n), default=None)
        if lo is not None and hi is not None:
            return self.timed[lo] + (self.timed[hi] - self.timed[lo]) * (n - lo) / (hi - lo)
        one = self.timed.get(1, self.timed[sizes[0]] / (1 + self.slope_prior * (sizes[0] - 1)))
        if lo is None:  # below every timed size: the prior's slope
            return self.timed[hi] - one * self.slope_prior * (hi - n)
        # above: the slope between the two largest sizes timed (a flat curve stays flat, a steep one
        # steep), kept between flat and one step per token; with one size timed, the prior's
        slope = one * self.slope_prior
        if len(sizes) > 1:
            slope = min(max((self.timed[sizes[-1]] - self.timed[sizes[-2]]) / (sizes[-1] - sizes[-2]), 0.0), one)
        return self.timed[lo] + slope * (n - lo)


class Costs:
    """The device's decode costs for one generation: the target's and the draft's curves, and how
    much the pre-speculation worker slows the target (profile.py gives the starting points)."""

    def __init__(self, verify_curve: Sequence[float] | None = None, draft_curve: Sequence[float] | None = None,
                 *, step_ms: float | None = None, draft_step_ms: float | None = None,
                 contention: float | None = None) -> None:
        """step_ms, draft_step_ms: one step of each model where no curve gives it (else priors)."""
        step = step_ms or (verify_curve[0] if verify_curve else 100.0)
        self.target = Curve(verify_curve, step, TARGET_SLOPE_PRIOR)
        draft_step = draft_step_ms or (draft_curve[0] if draft_curve else DRAFT_STEP_PRIOR * step)
        self.draft = Curve(draft_curve, draft_step, DRAFT_SLOPE_PRIOR)
        self._draft_prior_follows = not (draft_step_ms or draft_curve)  # a prior relative to the target's step
        # A measured contention below 1 (the target faster beside a busy draft) is a measuring error
        # (FIELD_NOTES): it is read as the floor, and the generation's own timings correct it.
        self._contention = Rate(max(contention or CONTENTION_PRIOR, CONTENTION_FLOOR), weight=2.0, keep=0.9)
        self.idle_ms: dict[int, float] = {}   # target decodes timed with the worker resting, by size
        self.idle_round: dict[int, int] = {}  # the round each size was last timed idle
        self.rounds = 0
        self.compared = 0                     # busy decodes timed against an idle one (contention samples)

    @property
    def contention(self) -> float:
        return max(self._contention.value, CONTENTION_FLOOR)

    def step_ms(self) -> float:
        return self.target.ms(1)

    def observe_target(self, n: int, ms: float, busy: bool) -> None:
        """A target decode of n tokens took `ms`, with the worker drafting beside it or not. A busy
        decode is compared with an idle one of the same size (the planner rests the worker now and
        then to keep one fresh); the curve learns the idle cost."""
        self.rounds += 1
        if busy:
            if n in self.idle_ms:
                self._contention.add(ms / self.idle_ms[n])
                self.compared += 1
            self.target.add(n, ms / self.contention)
        else:
            self.idle_ms[n] = running_mean(self.idle_ms.get(n), ms, Curve.ALPHA)
            self.idle_round[n] = self.rounds
            self.target.add(n, ms)
        if self._draft_prior_follows:  # the draft's prior (read only until a draft decode is timed)
            self.draft.step_prior = DRAFT_STEP_PRIOR * self.target.ms(1)

    def idle_stale(self, n: int, every: int) -> bool:
        """Whether no idle decode of n tokens was timed in the last `every` rounds."""
        return self.rounds - self.idle_round.get(n, -every) >= every


def describe_regime(verify_ms: Sequence[float]) -> str:
    """What a target's verify curve (ms of a decode of 1, 2, ... tokens) means for speculation here."""
    if len(verify_ms) < 2:
        return "the target's verify cost is not measured yet"
    n = min(4, len(verify_ms))
    steps = verify_ms[n - 1] / verify_ms[0]
    head = f"verifying {n} tokens costs {steps:.1f} steps here"
    if steps <= 1.8:
        return (f"{head}: memory-bound, so speculation pays: the draft model when it is accepted often, "
                "long drafts and n-gram copies more")
    if steps <= 2.3:
        return f"{head}: speculation pays when drafts are accepted often (the draft on predictable text, long copies)"
    return (f"{head}: compute-bound, so only long exact copies (n-gram lookup) pay and auto mostly takes plain "
            "steps; speculation pays where a verify of 4 costs 1-1.5 steps (GPUs, Apple silicon, bigger or "
            "higher-precision models)")
