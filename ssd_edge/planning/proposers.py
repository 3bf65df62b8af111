"""The proposers of ssd-edge, each a Proposer (speculation/proposer.py) that prices its own offer:

    NgramProposer     the n-gram lookup's copy (free to make), asked every round and scored as
                      tokens commit (acceptance.NgramAcceptance)
    DraftProposer     the draft model drafting now, first reading what it has not read yet; where
                      it saves steps, reading the n-gram copy's first tokens as its guess (a
                      composite: drafters.ModelDrafter.extend); its length decided token by token by
                      a StopRule in a planned mode
    PreparedProposer  (prepared.py) a branch SSD's worker prepared while the target verified the
                      last round, extended by the draft where it holds fewer tokens than the plan
                      wants; it also decides whether the worker prepares the next round, and its tree

A verified m-token offer is priced as its expected committed tokens (acceptance.gains) over the
target's verify of m + 1 tokens plus the ms of making the tokens (costs.Costs): the planner ranks
the bids. Everything here runs on the engine thread; the worker thread runs only what a call hands
it (a StopRule: frozen numbers and the rule's own tally).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..config import SamplingConfig
from ..llama.kvseq import common_prefix
from ..sampling import head_probs
from ..speculation.drafters import EMPTY, Draft, ModelDrafter
from ..speculation.proposer import Ask, Bid, Decision, Offer, Verified
from .acceptance import DraftAcceptance, NgramAcceptance
from .costs import Costs

HORIZON = 128        # most tokens over which the draft's catch-up is spread
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


LONG_COPY = 8  # ssd: a copy whose match runs this many tokens back is offered on any miss, not only as the backup


class NgramProposer:
    kind = "ngram"

    def __init__(self, acceptance: NgramAcceptance, cap: int, planned: bool = True,
                 offered: Callable[[Draft], bool] | None = None) -> None:
        self.acceptance = acceptance
        self.cap = cap
        self.planned = planned  # only a planned menu reads its acceptance: a fixed one only copies
        # ssd: whether this round's copy is offered (the SSD policy's backup after a streak of misses, or a
        # copy long enough to beat drafting: the prompt's own text again, as in an editor's middle)
        self.offered = offered
        self.proposal: Draft = EMPTY  # this round's copy (a composite draft reads it as its guess)

    def offer(self, ask: Ask) -> Offer | None:
        self.proposal = EMPTY
        proposal = self.acceptance.ask(ask.history) if self.planned else self.acceptance.copy(ask.history)
        if not proposal.tokens or self.offered is not None and not self.offered(proposal):
            return None
        self.proposal = proposal
        return Offer(min(len(proposal), self.cap), self._price)

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
                 prepared: Any = None, cancelled: Callable[[], bool] | None = None) -> None:
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
        """The length of a probe of the draft, asked where a plain step wins (0: none; planner.py's docstring).
        None where the draft would first have to read more of the history than the rest of the answer could
        repay, were the draft as good as a probe hopes: every token left made at the upside's pace (an
        editor's 48-token middle after a prompt of thousands the draft has not read)."""
        if self.acceptance.rounds_since_draft < self.explore_wait:
            return 0
        gain = upside(self.costs, self.cap, self.k_min)
        if gain < EXPLORE_UPSIDE:
            return 0
        if self._catch_up_ms() > self.remaining * self.costs.step_ms() * (1.0 - 1.0 / gain):
            return 0
        m = min(max(EXPLORE_K, self.k_min), self.cap, self.room)
        return m if m >= max(1, self.k_min) else 0

    def _catch_up_ms(self) -> float:
        """What reading the history the draft has not read costs beyond a draft step (this round's unread)."""
        return max(0.0, self.costs.draft.ms(self.unread + 1) - self.costs.draft.ms(1))

    def _price(self, ms: range) -> list[Bid]:
        """Drafting m tokens: m draft steps, and the catch-up read (reading what the draft missed: an
        investment in every later draft round, so spread over the tokens still to come, at most
        HORIZON). An n-gram copy read as the draft's guess: its rows cost a little each in the batch
        that reads the catch-up, and each row the draft then draws as guessed saves it a step (as
        often as the target would take the copy: the n-gram's acceptance)."""
        g = self.acceptance.gains(self.cap)
        step = self.costs.draft.ms(1)
        read = self.costs.draft.ms(self.unread + 1)
        catch_up = self._catch_up_ms()
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
