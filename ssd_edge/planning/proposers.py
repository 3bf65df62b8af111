"""The proposers of ssd-edge, each a Proposer (speculation/proposer.py) that prices its own offer:

    NgramProposer     the n-gram lookup's copy (free to make), asked every round and scored as
                      tokens commit (acceptance.NgramAcceptance)
    DraftProposer     the draft model drafting now, first reading what it has not read yet; where
                      it saves steps, reading the n-gram copy's first tokens as its guess (a
                      composite: drafters.ModelDrafter.extend); its length decided token by token by
                      a StopRule in a planned mode
    PreparedProposer  a branch SSD's worker prepared while the target verified the last round (a
                      hit or a partial hit), extended by the draft where it holds fewer tokens than
                      the plan wants; it also decides whether the worker prepares the next round

A verified m-token offer is priced as its expected committed tokens (acceptance.gains) over the
target's verify of m + 1 tokens plus the ms of making the tokens (costs.Costs): the planner ranks
the bids. Everything here runs on the engine thread; the worker thread runs only what a call hands
it (a StopRule: frozen numbers and the rule's own tally).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Sequence

import numpy as np

from ..config import SamplingConfig
from ..llama.kvseq import common_prefix
from ..sampling import head_probs
from ..speculation.drafters import EMPTY, Draft, ModelDrafter
from ..speculation.proposer import Ask, Bid, Decision, Offer, Verified
from .acceptance import DraftAcceptance, NgramAcceptance
from .costs import Costs, Rate, running_mean

HORIZON = 128        # most tokens over which the draft's catch-up is spread
HIT_PRIOR = 0.5      # how often a prepared round is used, until measured
FADE_ROUNDS = 8.0    # resting rounds over which the measured hit rate fades half-way back to HIT_PRIOR
FADE_DOUBLINGS = 3   # ... at most this many times slower, after wake-ups that went unused
IDLE_EVERY = 16      # a worker busy this many rounds rests one, to time an idle verify (contention)
IDLE_FIRST = 4       # ... this many, when no idle verify of that size was ever timed
IDLE_QUIET = 1.05    # a worker slowing the target by at most this (a GPU target) costs it nothing to speak of:
IDLE_DOUBLINGS = 3   # ... each rest after busy verifies that found so doubles the busy rounds to the next, up to 8x
# Probing a written-off draft (planner.py's docstring): where a draft accepted at EXPLORE_ALPHA would
# beat plain steps by EXPLORE_UPSIDE, EXPLORE_K tokens are drafted after EXPLORE_FIRST plain rounds,
# then after twice as many each time the probe is not followed, up to EXPLORE_MOST.
EXPLORE_ALPHA = 0.9
EXPLORE_UPSIDE = 1.25
EXPLORE_K = 3
EXPLORE_FIRST = 8
EXPLORE_MOST = 64


def lengths(cap: int, k_min: int) -> range:
    """The draft lengths a round may verify: --draft-min (at least 1) to the cap."""
    return range(max(1, k_min), cap + 1)


def upside(costs: Costs, cap: int, k_min: int) -> float:
    """How much faster than plain steps a draft accepted at EXPLORE_ALPHA would make tokens here,
    at its best length: above 1.5 where verifying is nearly free, about 1 on a compute-bound CPU."""
    verify, step, a = costs.target.ms, costs.draft.ms(1), EXPLORE_ALPHA
    best = max(((1.0 - a ** (m + 1)) / (1.0 - a) / (verify(m + 1) + m * step) for m in lengths(cap, k_min)),
               default=0.0)
    return best * costs.step_ms()


def top1(rows: np.ndarray, s: SamplingConfig) -> dict[int, float]:
    """The target's probability of its likeliest token at the first and the last of a round's committed
    rows (index -> probability), at the sampling temperature (1 when greedy), over each row's largest
    logits (sampling.head_probs). Two rows, not all: a pass over a row costs 0.05-0.1 ms where it comes
    cold from a GPU's step, most of a round's host time at 8 rows; the draft's confidence proxy is an
    average and its calibration a ratio, which a sample of each round's rows estimates as well."""
    t = s.temperature if s.temperature > 0 else 1.0
    return {i: float(head_probs(rows[i], t).p[0]) for i in sorted({0, len(rows) - 1})} if len(rows) else {}


class NgramProposer:
    kind = "ngram"

    def __init__(self, acceptance: NgramAcceptance, cap: int, planned: bool = True,
                 offered: Callable[[], bool] | None = None) -> None:
        self.acceptance = acceptance
        self.cap = cap
        self.planned = planned  # only a planned menu reads its acceptance: a fixed one only copies
        self.offered = offered  # ssd: the backup is offered only after a streak of misses (the SSD policy)
        self.proposal: Draft = EMPTY  # this round's copy (a composite draft reads it as its guess)

    def offer(self, ask: Ask) -> Offer | None:
        self.proposal = EMPTY
        if self.offered is not None and not self.offered():
            return None
        self.proposal = self.acceptance.ask(ask.history) if self.planned else self.acceptance.copy(ask.history)
        if not self.proposal.tokens:
            return None
        return Offer(min(len(self.proposal), self.cap), self._price)

    def _price(self, ms: range) -> list[Bid]:
        g = self.acceptance.gains(ms[-1]) if ms else []
        return [Bid(m, g[m], 0.0) for m in ms]

    def propose(self, history: list[int], decision: Decision) -> Draft:
        return self.proposal.head(decision.m)

    def observe(self, verified: Verified) -> None:
        if self.planned:
            self.acceptance.observe(verified.history)

    def report(self) -> dict:
        return self.acceptance.report()


class StopRule:
    """How long a draft drafted now runs, in a planned mode: the plan chose to draft (and an
    estimated length, from per-position averages); the draft's own confidence then says, token by
    token, how far this one is worth going, up to the cap. With token j's row computed, the token is
    drawn while drafting on from it pays: for some length L up to the cap, the tokens j..L-1 add more
    expected tokens per ms (each accepted with the draft's probability at j, on top of P(tokens before
    j accepted)) than the plan's rate, at what they add to the verify and the draft steps they take.
    After drawing it, the draft steps on to token j + 1 while the same holds from there. Looking past
    the next token matters: a verify curve rises in steps (on the BF16 stand-in here 4 tokens cost what
    5 do), and one token's own cost would stop a confident draft at each step up. The draft's
    probabilities are scaled by how they have predicted its acceptance so far (`sure`: a draft model
    can be over- or under-sure). Asked before each token is drawn, from what the draft knew then
    (lossless: the length never depends on a token drawn after it).

    Made on the engine thread from frozen numbers; called on the thread that drafts (the worker's,
    where one runs); its tally (p_tops) is read back on the engine thread after the draft is handed
    over."""

    def __init__(self, rate: float, verify_ms: Sequence[float], step_ms: float, least: int, cap: int,
                 sure: float) -> None:
        self.rate, self.verify, self.step, self.least, self.cap, self.sure = rate, verify_ms, step_ms, least, cap, sure
        self.reach = 1.0  # P(every token drafted so far is accepted)
        self.p_tops: list[float] = []  # the draft's top probability at each token drawn

    def pays(self, j: int, p: float, row: bool) -> bool:
        """Whether drafting tokens j.. (each accepted with p; `row`: token j's row is computed, else a
        step computes it) beats the plan's rate for some length up to the cap."""
        verify = self.verify
        gain, now = 0.0, verify[j + 1]
        for n in range(j + 1, self.cap + 1):  # tokens j..n-1: the verify grows to n + 1, n - 1 - j steps more
            gain += self.reach * p ** (n - j)
            cost = verify[n + 1] - now + (n - 1 - j + (not row)) * self.step
            if gain / max(cost, 1e-3) >= self.rate:
                return True
        return False

    def __call__(self, j: int, p_top: float) -> tuple[bool, bool]:
        """(draw token j, then step on to token j + 1)."""
        p = min(1.0, p_top * self.sure)
        if j >= self.least and not self.pays(j, p, row=True):
            return False, False
        self.reach *= p
        self.p_tops.append(p_top)
        return True, j + 1 < self.least or self.pays(j + 1, p, row=False)


class DraftProposer:
    kind = "draft"

    def __init__(self, drafter: ModelDrafter, acceptance: DraftAcceptance, costs: Costs, cap: int, k_min: int,
                 planned: bool, worker: Any = None, ngram: NgramProposer | None = None,
                 prepared: PreparedProposer | None = None, cancelled: Callable[[], bool] | None = None) -> None:
        self.drafter = drafter
        self.acceptance = acceptance
        self.costs = costs
        self.cap, self.k_min, self.planned = cap, k_min, planned
        # what it learns (acceptance, draft costs) is read by a planned menu and the worker's ranking alone
        self.learns = planned or prepared is not None
        self.worker = worker  # where one runs, it drafts (it owns the draft's context)
        self.ngram = ngram  # whose copy a draft may read as its guess
        self.prepared = prepared  # after its hit, the branch holds the history (the draft's KV is the worker's)
        self.cancelled = cancelled
        self.unread = 0  # history tokens the draft must read before it can draft, this round
        self.room = self.remaining = 0
        self.rule: StopRule | None = None  # the last draft's
        self.explore_wait = EXPLORE_FIRST  # plain rounds before the next probe
        self.probes = 0
        self.guessed = 0  # drafts that read an n-gram copy as their guess

    def offer(self, ask: Ask) -> Offer | None:
        hit = self.prepared is not None and self.prepared.hit
        kv = self.drafter.kv if not hit else None
        self.unread = max(0, len(ask.history) - common_prefix(kv.tokens, ask.history) - 1) if kv is not None else 0
        self.room, self.remaining = ask.room, ask.remaining
        return Offer(self.cap, self._price, self._probe if self.planned else None)

    def _probe(self) -> int:
        """The length of a probe of the draft, asked where a plain step wins (0: none; planner.py's docstring)."""
        if self.acceptance.rounds_since_draft < self.explore_wait or \
                upside(self.costs, self.cap, self.k_min) < EXPLORE_UPSIDE:
            return 0
        m = min(max(EXPLORE_K, self.k_min), self.cap, self.room)
        return m if m >= max(1, self.k_min) else 0

    def _price(self, ms: range) -> list[Bid]:
        """Drafting m tokens: m draft steps, and the catch-up read (reading what the draft missed: an
        investment in every later draft round, so spread over the tokens still to come, at most
        HORIZON). An n-gram copy read as the draft's guess: its rows cost a little each in the batch
        that reads the catch-up, and each row the draft then draws as guessed saves it a step (as
        often as the target would take the copy: the n-gram's acceptance)."""
        g = self.acceptance.gains(self.cap)
        step = self.costs.draft.ms(1)
        read = self.costs.draft.ms(self.unread + 1)
        catch_up = max(0.0, read - step)
        horizon = max(1, min(self.remaining, HORIZON))
        copy = self.ngram.proposal if self.ngram is not None else EMPTY
        most = min(len(copy), self.cap - 1)
        agree = self.ngram.acceptance.gains(most) if self.ngram is not None else [1.0]
        guess_ms = [self.costs.draft.ms(self.unread + 1 + n) - read for n in range(most + 1)]
        bids = []
        for m in ms:
            drafting, guess = m * step, 0
            saved, n = max(((agree[n] - 1.0) * step - guess_ms[n], n) for n in range(min(m - 1, most) + 1))
            if n and saved > 0:  # the guess of the length that saves the most (0: none)
                drafting -= saved
                guess = n
            bids.append(Bid(m, g[m], drafting + catch_up * min(1.0, g[m] / horizon), guess))
        return bids

    def stop_rule(self, d: Decision) -> StopRule | None:
        """The planned draft's StopRule; None for the fixed modes and probes, which draft d.m."""
        if not self.planned or d.rate <= 0:
            return None
        verify = self.costs.target.ms
        return StopRule(d.rate, [0.0] + [verify(n) for n in range(1, self.cap + 2)], self.costs.draft.ms(1),
                        max(1, self.k_min), self.cap, self.acceptance.sureness.value)

    def propose(self, history: list[int], decision: Decision) -> Draft:
        rule = self.rule = self.stop_rule(decision)
        m = decision.m if rule is None else min(self.cap, self.room)
        guess = self.ngram.proposal.tokens[:decision.guess] if self.ngram is not None else ()
        self.guessed += decision.guess > 0
        if self.worker is not None:
            return self.worker.draft_now(history, m, rule, guess)
        return self.drafter.propose(history, m, self.cancelled, rule, guess)

    def observe(self, verified: Verified) -> None:
        if not self.learns:
            return
        d = verified.decision
        confidence = top1(verified.rows, self.drafter.sampling) if self.planned else {}
        drafted = len(verified.draft) if d.kind in ("draft", "prepared") else 0
        p_tops = self.rule.p_tops if d.kind == "draft" and self.rule is not None else None
        self.acceptance.observe(drafted, verified.accepted, confidence, p_tops)
        if d.kind == "draft" and self.drafter.timing is not None:
            unread, feed_ms, steps, steps_ms = self.drafter.timing  # reading unread + 1 tokens, then steps
            self.costs.draft.add(unread + 1, feed_ms)
            if steps:
                self.costs.draft.add(1, steps_ms / steps)
        if d.probe:  # the draft is measured again rather than inferred; the next probe waits longer
            self.probes += 1
            self.explore_wait = min(2 * self.explore_wait, EXPLORE_MOST)
        elif d.kind in ("draft", "prepared"):  # the plan drafts on its own: probes start over
            self.explore_wait = EXPLORE_FIRST

    def report(self) -> dict:
        return {**self.acceptance.report(), "upside": round(upside(self.costs, self.cap, self.k_min), 3),
                "probes": self.probes, "guessed": self.guessed}


def tree_step_ms(timed: Sequence[tuple[int, float]], curve: Callable[[int], float], most: int) -> list[float]:
    """ms of a tree's batched step of 1..most branches: a line a + b n through the steps the worker timed
    (host work included: it differs from the draft's calibrated curve, which reads whole rows), once
    two sizes are timed; before that the curve."""
    sizes = {n for n, _ in timed}
    if len(sizes) < 2:
        return [curve(n) for n in range(1, most + 1)]
    n = np.array([x for x, _ in timed], float)
    ms = np.array([y for _, y in timed], float)
    b = max(0.0, float(np.cov(n, ms, bias=True)[0, 1] / max(np.var(n), 1e-9)))
    a = float(ms.mean() - b * n.mean())
    return [max(a + b * k, 1e-3) for k in range(1, most + 1)]


class PreparedProposer:
    kind = "prepared"

    def __init__(self, worker: Any, policy: Any, acceptance: DraftAcceptance, costs: Costs, cap: int, k_min: int,
                 planned: bool, always: bool) -> None:
        self.worker = worker
        self.policy = policy
        self.acceptance = acceptance
        self.costs = costs
        self.cap, self.k_min, self.planned = cap, k_min, planned
        self.always = always  # ssd: the worker prepares every round; auto: while it earns its keep
        self.looked: Any = None  # this round's LookupResult
        self.status: str | None = None  # this round's lookup: hit, partial, miss (None: nothing prepared)
        self.hits = Rate(HIT_PRIOR, weight=2.0, keep=0.95)  # prepared rounds used (as whole ones) / looked up
        self.rounds_resting = 0  # rounds since the worker last prepared
        self.fade_backoff = 0  # doublings of FADE_ROUNDS: woken by the fade, the worker's rounds went unused
        self.resumed = False  # the worker prepares now after a rest
        self.busy = False  # the worker drafts beside the verify now running
        self.busy_streak = 0  # rounds the worker has drafted in a row
        # doublings of IDLE_EVERY (IDLE_QUIET): one to start with where the profile found the worker quiet
        self.idle_backoff = int(costs.contention <= IDLE_QUIET)
        self._compared = 0  # busy-vs-idle comparisons at the last rest
        self.prefilled = False  # the prompt's round has been observed
        self.tree_steps: deque[tuple[int, float]] = deque(maxlen=64)  # the worker's batched steps: (rows, ms)
        self.setup_ms: float | None = None  # the worker's ranking and branch setup before its first step
        self.window_ms: dict[int, float] = {}  # verify size -> its time with the worker busy (what a tree hides in)

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
            width, short = self.tree_shape(len(draft) + 1, depth, self.policy.fanout)
            if not self.policy.tree.on:  # the tree made tokens slower lately: the likeliest branch first
                width, short = 1, depth
            self.worker.verifying(history, draft, self.policy.snapshot(self.acceptance.p_accept(len(draft)), depth,
                                                                       width, short))

    def observe(self, verified: Verified) -> None:
        if self.prefilled:  # (the prompt's round says nothing of resting)
            self.rounds_resting = 0 if verified.busy else self.rounds_resting + 1
            if verified.busy:  # the window a tree grows in: a verify of this size with the worker beside it
                n = len(verified.draft) + 1
                self.window_ms[n] = running_mean(self.window_ms.get(n), verified.verify_ms, 0.2)
        self.prefilled = True

    def runs(self, verifying: int) -> bool:
        """Should the worker prepare the next round while the target verifies `verifying` tokens?"""
        runs = self._runs(verifying)
        self.busy_streak = self.busy_streak + 1 if runs else 0
        return runs

    def _runs(self, verifying: int) -> bool:
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
        alone, the others after it. The worker's own timings (its host work beyond the draft's curve,
        handoff.steps) go into the price."""
        steps = self.worker.handoff.steps  # the worker's timings since
        while steps:
            rows, ms = steps.popleft()
            if rows:  # a batched step of `rows` branches, host work included
                self.tree_steps.append((rows, ms))
            else:  # from the verify's start to the first step, less the read: the message, ranking, setup
                self.setup_ms = running_mean(self.setup_ms, ms, 0.2)
        start = self.costs.draft.ms(1) + (self.setup_ms or 0.0)
        window = self.window_ms.get(verifying) or self.costs.target.ms(verifying) * self.costs.contention
        step = [0.0] + tree_step_ms(self.tree_steps, self.costs.draft.ms, max(1, most))
        verify, g = self.costs.target.ms, self.acceptance.gains(depth)
        miss = g[depth] / (depth * step[1] + verify(depth + 1))  # tokens a ms of a round drafted just in time
        shortest = next((s for s in range(1, depth + 1) if g[s] / verify(s + 1) > miss), depth)
        for n in range(max(1, most), 1, -1):
            for short in range(depth, shortest - 1, -1):
                if start + short * step[n] + (depth - short) * step[1] <= window:
                    return n, short
        return 1, depth

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
