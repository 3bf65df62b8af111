"""PreparedProposer: a branch SSD's worker prepared while the target verified the last round (a hit or
a partial hit), extended by the draft where it holds fewer tokens than the plan wants; it also decides
whether the worker prepares the next round, and the shape of the tree it grows (tree_shape). One of the
proposers (proposers.py says how they are priced); it runs on the engine thread.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

from ..speculation.drafters import Draft
from ..speculation.proposer import Ask, Bid, Decision, Offer, Verified
from .acceptance import DraftAcceptance
from .costs import Costs, Rate, running_mean
from .proposers import lengths, upside

HIT_PRIOR = 0.5      # how often a prepared round is used, until measured
FADE_ROUNDS = 8.0    # resting rounds over which the measured hit rate fades half-way back to HIT_PRIOR
FADE_DOUBLINGS = 3   # ... at most this many times slower, after wake-ups that went unused
IDLE_EVERY = 16      # a worker busy this many rounds rests one, to time an idle verify (contention)
IDLE_FIRST = 4       # ... this many, when no idle verify of that size was ever timed
IDLE_QUIET = 1.05    # a worker slowing the target by at most this (a GPU target) costs it nothing to speak of:
IDLE_DOUBLINGS = 3   # ... each rest after busy verifies that found so doubles the busy rounds to the next, up to 8x


class StepLine:
    """ms of a tree's batched step of n branches: a line a + b n through the last `keep` steps the worker
    timed (host work included: it differs from the draft's calibrated curve, which reads whole rows),
    once two sizes are timed; before that the curve. Its sums are kept as steps come and go, so the
    engine thread prices a tree in microseconds before each verify (numpy's cov and var over the
    same 64 points took ~0.25 ms of it)."""

    def __init__(self, keep: int = 64) -> None:
        self.timed: deque[tuple[int, float]] = deque()
        self.keep = keep
        self.sums = [0.0] * 5  # count, sum n, sum ms, sum n^2, sum n ms

    def add(self, n: int, ms: float) -> None:
        self._sum(n, ms, 1.0)
        self.timed.append((n, ms))
        if len(self.timed) > self.keep:
            self._sum(*self.timed.popleft(), -1.0)

    def _sum(self, n: int, ms: float, sign: float) -> None:
        count, sn, sms, snn, snms = self.sums
        self.sums = [count + sign, sn + sign * n, sms + sign * ms, snn + sign * n * n, snms + sign * n * ms]

    def ms(self, curve: Callable[[int], float], most: int) -> list[float]:
        """[ms of a step of 1 .. most branches]."""
        count, sn, sms, snn, snms = self.sums
        var = snn - sn * sn / count if count else 0.0
        if var < 1e-6:  # (one size timed, or none: the line is not determined)
            return [curve(n) for n in range(1, most + 1)]
        b = max(0.0, (snms - sn * sms / count) / var)
        a = (sms - b * sn) / count
        return [max(a + b * k, 1e-3) for k in range(1, most + 1)]


class TreeTimings:
    """What the worker's tree was timed at: its batched steps, its setup before the first, the verifies it
    grew beside (by size). The engine's TreeChoice holds it, a mode's, over generations."""

    def __init__(self) -> None:
        self.steps = StepLine()  # the worker's batched steps: (rows, ms)
        self.setup_ms: float | None = None  # the worker's ranking and branch setup before its first step
        self.window_ms: dict[int, float] = {}  # verify size -> its time with the worker busy (what a tree hides in)


class PreparedProposer:
    kind = "prepared"

    def __init__(self, worker: Any, policy: Any, acceptance: DraftAcceptance, costs: Costs, cap: int, k_min: int,
                 planned: bool, always: bool, prompt_alone: bool = False) -> None:
        self.worker = worker
        self.policy = policy
        self.acceptance = acceptance
        self.costs = costs
        self.cap, self.k_min, self.planned = cap, k_min, planned
        self.always = always  # ssd: the worker prepares every round; auto: while it earns its keep
        # the target reads the prompt alone, with every core of this CPU (threads that follow the machine): the
        # draft reads it after, as the next round drafts, with every core too (engine.py: the prompt's threads)
        self.prompt_alone = prompt_alone
        self.looked: Any = None  # this round's LookupResult
        self.status: str | None = None  # this round's lookup: hit, partial, miss (None: nothing prepared)
        self.hits = Rate(HIT_PRIOR, weight=2.0, keep=0.95)  # prepared rounds used / looked up
        self.rounds_resting = 0  # rounds since the worker last prepared
        self.fade_backoff = 0  # doublings of FADE_ROUNDS: woken by the fade, the worker's rounds went unused
        self.resumed = False  # the worker prepares now after a rest
        self.busy = False  # the worker drafts beside the verify now running
        self.width = 0  # ... that many branches at once (a tree: more than 1)
        self.busy_streak = 0  # rounds the worker has drafted in a row
        # doublings of IDLE_EVERY (IDLE_QUIET): one to start with where the profile found the worker quiet
        self.idle_backoff = int(costs.contention <= IDLE_QUIET)
        self._compared = 0  # busy-vs-idle comparisons at the last rest
        self.prefilled = False  # the prompt's round has been observed
        # the tree's timings, kept over generations with the engine's TreeChoice (without them a generation's
        # first rounds priced a tree by the draft's curve, and grew the likeliest branch alone)
        tree = policy.tree
        if tree.timings is None:
            tree.timings = TreeTimings()
        self.timed: TreeTimings = tree.timings

    @property
    def hit(self) -> bool:
        return self.status in ("hit", "partial")

    def offer(self, ask: Ask) -> Offer | None:
        looked = self.looked = self.worker.lookup(ask.history, min(self.cap, ask.room))
        self.status = looked.status if looked.status != "none" else None
        if self.status is not None:  # the window and rollback follow the hit rate
            self.policy.observe_lookup(looked.status, looked.why)
        if not self.hit:
            return None
        return Offer(self.cap, self._price, finished=looked.finished)

    def _price(self, ms: range) -> list[Bid]:
        """A branch's tokens cost nothing by now; the draft extends a partial one step by step. A finished
        one is priced at the depth it was planned to (the tree's short branches: no more tokens than
        that), never at its length, which --draft-p-min may have cut on what was drawn."""
        g, step = self.acceptance.gains(self.cap), self.costs.draft.ms(1)
        if self.looked.finished:
            ready = min(self.cap, self.looked.depth or self.cap)
            return [Bid(m, g[min(m, ready)], 0.0) for m in ms]
        ready = len(self.looked.draft)
        return [Bid(m, g[m], max(0, m - ready) * step) for m in ms]

    def propose(self, history: list[int], decision: Decision) -> Draft:
        looked = self.looked
        if looked.finished or decision.m <= len(looked.draft):  # a finished branch verifies min(m, its length)
            return looked.draft.head(decision.m)
        return self.worker.extend(history, decision.m)

    def verifying(self, history: list[int], draft: Draft, decision: Decision) -> None:
        """The target starts verifying `draft`: the worker prepares the next round beside it where the
        SSD policy lets it and it is expected to pay. (First: was this round's lookup used? A branch
        found but not worth verifying saved nothing.)"""
        if self.status is not None:  # (counted once: a round with no room to draft looks nothing up)
            used = decision.kind == self.kind
            self.hits.add(1.0 if used else 0.0)
            # a worker woken from rest by the faded prior whose round went unused waits twice as long
            # before the prior wakes it again; one used, the fade is back to its pace
            self.fade_backoff = 0 if used else min(self.fade_backoff + self.resumed, FADE_DOUBLINGS)
            self.rounds_resting = 0
            self.status = None
        self.resumed = False
        resting = self.rounds_resting
        self.busy = self.policy.prespec_enabled and self.runs(len(draft) + 1)
        self.resumed = self.busy and resting > 0 and self.prefilled
        if self.busy:
            depth = self.branch_depth()
            if self.policy.tree.wanted(self.costs.contention <= IDLE_QUIET):
                width, short = self.tree_shape(len(draft) + 1, depth, self.policy.fanout)
            else:  # on shared cores, the tree made tokens no faster lately (TreeChoice): the likeliest alone
                self._take_timings()
                width, short = 1, depth
            self.width = width
            self.worker.verifying(history, draft, self.policy.snapshot(self.acceptance.p_accept(len(draft)), depth,
                                                                       width, short))

    def observe(self, verified: Verified) -> None:
        if self.prefilled:  # (the prompt's round says nothing of resting)
            self.rounds_resting = 0 if verified.busy else self.rounds_resting + 1
            if verified.busy:  # the window a tree grows in: a verify of this size with the worker beside it
                n = len(verified.draft) + 1
                self.timed.window_ms[n] = running_mean(self.timed.window_ms.get(n), verified.verify_ms, 0.2)
        self.prefilled = True

    def runs(self, verifying: int) -> bool:
        """Should the worker prepare the next round while the target verifies `verifying` tokens?"""
        runs = self._runs(verifying)
        self.busy_streak = self.busy_streak + 1 if runs else 0
        return runs

    def _runs(self, verifying: int) -> bool:
        if not self.prefilled and self.prompt_alone:  # (1+1 threads reading a long prompt side by side took
            return False  # twice ar's time to the first token on 2 cores; one after the other, every core each)
        if self.always:
            return True
        if not self.prefilled:  # the draft reads the prompt beside the target's own reading of it, unless
            return upside(self.costs, self.cap, self.k_min) >= 1.0  # no draft could beat plain steps here
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
        return self.pays(verifying)

    def pays(self, verifying: int = 1) -> bool:
        """Preparing costs this verify its slowdown beside the draft: (contention - 1) x its time (on a
        GPU target next to nothing; on cores the two models share, a lot). It pays when the next
        round uses what was prepared (the hit rate) and a ready branch of m tokens then saves time
        against the best way to make as many tokens without one (plain steps, or a draft drafted
        just in time). Otherwise the worker rests and the target verifies alone."""
        ms = lengths(self.cap, self.k_min)
        if not ms:
            return False
        verify, step = self.costs.target.ms, self.costs.draft.ms(1)
        g = self.acceptance.gains(self.cap)
        alternative = max(1.0 / self.costs.step_ms(), *(g[m] / (verify(m + 1) + m * step) for m in ms))
        saved = max(g[m] / alternative - verify(m + 1) for m in ms)
        cost = (self.costs.contention - 1.0) * verify(verifying)
        return self.hit_rate() * saved > cost

    def hit_rate(self) -> float:
        """How often a prepared round is used. Measured only while the worker prepares, so while it
        rests it fades back to the prior (as a stale draft alpha does): one bad stretch (prose)
        cannot keep the worker idle once the text turns predictable. Each wake-up whose round went
        unused halves the pace of the next fade (FADE_DOUBLINGS at most), so a worker that never pays
        is not woken every few rounds."""
        fresh = 0.5 ** (self.rounds_resting / (FADE_ROUNDS * 2 ** self.fade_backoff))
        return fresh * self.hits.value + (1.0 - fresh) * HIT_PRIOR

    def tree_shape(self, verifying: int, depth: int, most: int) -> tuple[int, int]:
        """(width, short): how many branches the worker grows together from the first step, one batched
        draft decode a depth step, and how deep the ones after the likeliest go (it goes `depth`). All of
        it must end within the verify of `verifying` tokens it hides behind (as timed with the worker
        beside it; before that, as the costs price it), after the read of the last draft token and the
        worker's setup. A short branch is worth growing only as deep as a hit on it beats a miss:
        verifying its `short` tokens at once must make tokens faster than drafting `depth` just in time
        and verifying them. The widest tree that fits at such a depth, as deep as it then can go; where
        none fits (a CPU, where a batch of n rows costs about n steps), (1, depth): the likeliest branch
        alone. The worker's own timings (_take_timings: its host work beyond the draft's curve) go into
        the price."""
        self._take_timings()
        start = self.costs.draft.ms(1) + (self.timed.setup_ms or 0.0)
        window = self.timed.window_ms.get(verifying) or self.costs.target.ms(verifying) * self.costs.contention
        step = [0.0] + self.timed.steps.ms(self.costs.draft.ms, max(1, most))
        verify, g = self.costs.target.ms, self.acceptance.gains(depth)
        miss = g[depth] / (depth * step[1] + verify(depth + 1))  # tokens a ms of a round drafted just in time
        shortest = next((s for s in range(1, depth + 1) if g[s] / verify(s + 1) > miss), depth)
        for n in range(max(1, most), 1, -1):
            for short in range(depth, shortest - 1, -1):
                if start + short * step[n] + (depth - short) * step[1] <= window:
                    return n, short
        return 1, depth

    def _take_timings(self) -> None:
        """The worker's timings since the last look (handoff.steps): its batched steps (rows, ms), and the
        time to its first step (rows 0); taken each round the worker prepares, a tree shaped or not."""
        steps = self.worker.handoff.steps
        while steps:
            rows, ms = steps.popleft()
            if rows:  # a batched step of `rows` branches, host work included
                self.timed.steps.add(rows, ms)
            else:  # from the verify's start to the first step, less the read: the message, ranking, setup
                self.timed.setup_ms = running_mean(self.timed.setup_ms, ms, 0.2)

    def branch_depth(self) -> int:
        """How many tokens the worker drafts on each branch: in ssd its full draft length (a hit is
        verified whole); planned, the length a ready branch is best verified at (its tokens cost
        nothing by then)."""
        if not self.planned:
            return self.cap
        ms = lengths(self.cap, self.k_min)
        if not ms:
            return max(1, self.k_min)
        g = self.acceptance.gains(self.cap)
        return max(ms, key=lambda m: g[m] / self.costs.target.ms(m + 1))

    def report(self) -> dict:
        return {"prepared_hit_rate": round(self.hit_rate(), 3)}
