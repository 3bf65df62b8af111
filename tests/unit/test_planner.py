"""The round planner (planning/planner.py), its proposers (planning/proposers.py), their acceptance
estimates (planning/acceptance.py) and the cost model (planning/costs.py) with plain numbers: each
proposer wins where it should, in both regimes (a compute-bound CPU, where a verify of n tokens costs
about n steps, and a memory-bound device, where it costs little more than one), drafts grow as long
as the curve pays, costs are learnt from what is timed, the fixed modes are the planner held to their
proposers, and the pre-speculation worker runs only while it earns its keep.

The planner is driven as planning/rounds.py drives it (Bench): every proposer of the mode offers, the
planner decides, and every verified round goes to the planner and each proposer. The proposers are the
real ones; only what has a model behind it stands in: the draft model (ScriptedDrafter: the tokens it
has read, and a draft's length as its stopping rule decides it from scripted probabilities) and SSD's
worker (Prepared: what a lookup finds)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Sequence

import numpy as np
import pytest

from fakes import FakeContext, FakeModel
from ssd_edge.config import EngineConfig, PrespecConfig, SamplingConfig
from ssd_edge.llama.kvseq import KVSeq
from ssd_edge.metrics import Meter
from ssd_edge.planning.acceptance import CONFIDENCE_FADE, DraftAcceptance, NgramAcceptance, match_class
from ssd_edge.planning.costs import CONTENTION_FLOOR, Costs, Curve, Rate, describe_regime
from ssd_edge.planning.planner import MENUS, Planner
from ssd_edge.planning.prepared import IDLE_DOUBLINGS, IDLE_EVERY, IDLE_QUIET, PreparedProposer
from ssd_edge.planning.proposers import EXPLORE_FIRST, EXPLORE_K, EXPLORE_MOST, DraftProposer, NgramProposer, upside
from ssd_edge.planning.rounds import build, ssd_offers
from ssd_edge.speculation.drafters import EMPTY, Draft, NgramDrafter
from ssd_edge.speculation.policy import PrespecPolicy, TreeChoice
from ssd_edge.speculation.prespec import LookupResult
from ssd_edge.speculation.prespec.handoff import Handoff
from ssd_edge.speculation.proposer import PLAIN, Ask, Decision, Verified

# A CPU-like target (FIELD_NOTES, 1.5B at 2 threads, Intel): 4 tokens cost ~1.6 steps.
CPU_CURVE = [105.0, 150.0, 160.0, 170.0, 220.0]
# This AMD machine's Q4_K_M target (FIELD_NOTES, "Two regimes"): n tokens cost about n steps.
STEEP = [36.0 * x for x in (1, 1.7, 2.2, 2.73, 3.4, 4.1, 4.8, 5.4, 5.94, 6.6, 7.3, 8, 8.7, 9.4, 10, 10.7, 11.4)]
# The same target in BF16 (memory-bound): 8 tokens cost 1.8 steps.
FLAT = [100.0 * x for x in (1, 1.37, 1.5, 1.69, 1.72, 1.75, 1.78, 1.8, 1.85, 1.9, 1.95, 2, 2.05, 2.1, 2.15, 2.2, 2.25)]

NO_COPY = [1, 2, 3]  # a history the n-gram lookup finds nothing to copy in
SPECULATOR = {"plain": "none", "draft": "draft", "prepared": "prespec", "ngram": "ngram"}


def quoting(n: int, match: int = 2) -> list[int]:
    """A history whose n-gram lookup (NgramDrafter(2, 4)) copies n tokens (at most its k) after a match
    of `match` tokens (at least 2): a passage of n tokens repeated, n + match long, after a token of
    its own. The latest earlier occurrence of the history's last n-gram ends n tokens before the end,
    and the two agree for `match` tokens back from there."""
    return [1] + [100 + i % n for i in range(match + n)]


def rows(confidence: Sequence[float], vocab: int = 8) -> np.ndarray:
    """The target's logit rows at a round's committed positions, with top-1 probability
    confidence[i] at position i (proposers.top1 reads the first and the last): the rest spread evenly
    over the other tokens of a vocabulary small enough to be read whole (sampling.HEAD)."""
    p = np.array(confidence, dtype=np.float64).reshape(-1, 1)
    assert (p > 1.0 / vocab).all()  # the top token must stay the likeliest
    return np.log(np.hstack([p, np.repeat((1.0 - p) / (vocab - 1), vocab - 1, axis=1)]))


class ScriptedDrafter:
    """The draft model as DraftProposer reads it, with no model behind it: what its KV holds (the
    history it has read), the sampling (greedy), the last draft's timing (None: the draft's costs stay
    the curve's), and propose(), which asks the stopping rule before each token as ModelDrafter.extend
    does, the draft's top probability at token j being confidences[j]."""

    def __init__(self) -> None:
        self.kv = SimpleNamespace(tokens=[])
        self.sampling = SamplingConfig()
        self.timing = None
        self.confidences: list[float] = []

    def propose(self, history, k, cancelled=None, go_on=None, guess=()) -> Draft:
        n = 0
        while n < k:
            take, more = go_on(n, self.confidences[n]) if go_on is not None else (True, True)
            n += take
            if not (take and more):
                break
        return Draft(tuple(range(200, 200 + n)), "draft")


class Prepared:
    """SSD's worker as the proposers call it, with no model: lookup() finds `found` (what the test says
    the worker prepared for this round); a draft drafted now is the worker's drafter's (it owns the
    draft's context where it runs); verifying() keeps the snapshot it is handed (the round it would
    prepare)."""

    def __init__(self, drafter: ScriptedDrafter) -> None:
        self.drafter = drafter
        self.found = LookupResult("none", None)
        self.snapshots: list = []
        self.handoff = Handoff(abort=threading.Event())  # (its timings of tree steps: none here)

    def lookup(self, history, k) -> LookupResult:
        return self.found

    def draft_now(self, history, k, go_on=None, guess=()) -> Draft:
        return self.drafter.propose(history, k, None, go_on, guess)

    def verifying(self, history, draft, snapshot) -> None:
        self.snapshots.append(snapshot)


def found(prepared: int | str | None, done: bool, cap: int) -> LookupResult:
    """What a lookup finds: None nothing prepared, "miss", or a branch of `prepared` tokens (done: one
    --draft-p-min ended, complete though shorter than the cap)."""
    if prepared is None:
        return LookupResult("none", None)
    if prepared == "miss":
        return LookupResult("miss", None)
    status = "hit" if done or prepared >= cap else "partial"
    return LookupResult(status, Draft(tuple(range(300, 300 + prepared)), "prespec"), done)


class Bench:
    """A planner and the proposers of a mode, wired as planning.rounds.build wires them (the worker
    taken to run beside the target in auto), past the prompt's round unless prefilled=False (whose time
    says nothing of a step). plan() and observe() are what Rounds does around the engine's verify."""

    def __init__(self, cap: int = 3, draft_ms: float = 44.0, curve=CPU_CURVE, contention: float | None = None,
                 menu: str = "auto", ngram_cap: int | None = None, k_min: int = 0, draft_prior: float = 0.7,
                 draft: bool = True, ngram: NgramDrafter | None = None, costs: Costs | None = None,
                 prefilled: bool = True) -> None:
        m = MENUS[menu]
        self.cap, self.ngram_cap = cap, ngram_cap or cap
        self.costs = costs or Costs(curve, draft_step_ms=draft_ms, contention=contention)
        self.planner = Planner(m, self.costs, k_min=k_min, span=self.ngram_cap)
        self.history = list(NO_COPY)
        self.drafter = ScriptedDrafter()
        self.worker = Prepared(self.drafter)
        self.policy = PrespecPolicy(PrespecConfig())
        self.ngram = self.draft = self.prepared = None
        if "ngram" in m.kinds:
            self.ngram_acceptance = NgramAcceptance(ngram or NgramDrafter(2, 4), self.ngram_cap)
            self.ngram = NgramProposer(self.ngram_acceptance, self.ngram_cap)
        self.acceptance = DraftAcceptance(cap, draft_prior)
        if draft and "draft" in m.kinds:
            if m.worker != "off":
                self.prepared = PreparedProposer(self.worker, self.policy, self.acceptance, self.costs, cap, k_min,
                                                 m.planned, always=m.worker == "always")
            if self.ngram is not None and menu == "ssd":  # ssd's n-gram backup: after misses, or a long copy
                self.ngram.offered = ssd_offers(self.policy)
            self.draft = DraftProposer(self.drafter, self.acceptance, self.costs, cap, k_min, m.planned,
                                       self.worker if self.prepared is not None else None, self.ngram, self.prepared)
        self.proposers = [p for p in (self.prepared, self.ngram, self.draft) if p is not None]
        if prefilled:
            self.planner.prefilled = True
            if self.prepared is not None:
                self.prepared.prefilled = True

    def plan(self, room: int, remaining: int = 64, *, copy: int = 0, match: int = 2,
             prepared: int | str | None = None, done: bool = False, unread: int = 0,
             history: list[int] | None = None) -> Decision:
        """The round's decision after `history` (else one whose lookup copies `copy` tokens after a match
        of `match`, else the last one): the worker found `prepared`, the draft has `unread` history tokens
        to read before it can draft."""
        h = self.history = history if history is not None else quoting(copy, match) if copy else self.history
        self.drafter.kv.tokens = h[:max(0, len(h) - 1 - unread)]
        self.worker.found = found(prepared, done, self.cap)
        ask = Ask(h, room, remaining)
        offers = [(p.kind, o) for p in self.proposers if (o := p.offer(ask)) is not None]
        if history is None:  # the lookup copies what the test says (where the n-gram is offered)
            copied = next((o.most for kind, o in offers if kind == "ngram"), 0)
            assert copied in (0, min(copy, self.ngram_cap)), (copy, copied)
        self.decision = self.planner.plan(offers, room)
        return self.decision

    def verified(self, d: Decision, accepted: int, verify_ms: float, confidence: Sequence[float] = (),
                 busy: bool = False) -> None:
        """The round planned as d is verified (d.m tokens drafted): the target accepted `accepted` of
        them, decoding in verify_ms (busy: with the worker drafting beside it), its top-1 probability
        confidence[i] at committed position i."""
        draft = Draft(tuple(range(200, 200 + d.m)), SPECULATOR[d.kind])
        v = Verified(d, draft, accepted, list(self.history), rows(confidence), verify_ms, busy)
        self.planner.observe(v)
        for p in self.proposers:
            p.observe(v)

    def observe(self, kind: str, drafted: int, accepted: int, verify_ms: float, confidence: Sequence[float] = (),
                busy: bool = False) -> None:
        """A verified round of `drafted` tokens of `kind`, whatever planned it."""
        self.verified(Decision(kind, drafted, 0.0), accepted, verify_ms, confidence, busy)

    def lookup_passed_over(self) -> None:
        """A round whose lookup found nothing that the round verified (a miss, then a plain step)."""
        self.worker.found = LookupResult("miss", None)
        self.prepared.offer(Ask(self.history, self.cap, 64))
        self.prepared.verifying(self.history, EMPTY, PLAIN)
        self.worker.found = LookupResult("none", None)

    def upside(self) -> float:
        return upside(self.costs, self.cap, self.planner.k_min)

    def report(self) -> dict:
        out = self.planner.report()
        for p in self.proposers:
            out.update(p.report())
        return out


def teach_draft(b: Bench, alpha_hits: float, rounds: int = 40, confidence: float = 0.9) -> None:
    """Verified draft rounds in which each position is accepted with frequency alpha_hits, the
    target's top-1 probability being `confidence` at each committed position."""
    k = b.cap
    for r in range(rounds):
        accepted = 0
        for i in range(k):  # a deterministic pattern with the wanted per-position rate
            if ((r * 7 + i * 3) % 100) / 100 < alpha_hits:
                accepted += 1
            else:
                break
        b.observe("draft", k, accepted, b.costs.target.ms(k + 1), [confidence] * (accepted + 1))


def test_rate_forgets_old_trials():
    r = Rate(0.5, weight=2.0, keep=0.9)
    for _ in range(100):
        r.add(1.0)
    # about the last 1 / (1 - keep) = 10 trials count, beside the prior's 2: (10 + 2 * 0.5) / 12
    assert r.value == pytest.approx(11 / 12, abs=1e-3)
    for _ in range(100):
        r.add(0.0)
    assert r.value == pytest.approx(1 / 12, abs=1e-3)


def test_curves_use_the_profile_scaled_to_what_is_timed():
    c = Curve(CPU_CURVE, 100.0, 0.25)
    assert c.ms(4) == 170.0
    c.add(1, 210.0)  # this machine is twice as slow as the profile today
    assert c.ms(4) == pytest.approx(340.0)
    # beyond the curve: its end plus, per token, the cheapest per-token cost in its upper half (4 tokens
    # at 170 ms), not its last slope (50 ms a token; on the real draft's curve the last slope priced a
    # 400-token catch-up at 6 times what it took)
    assert c.ms(7) == pytest.approx(2 * (220 + 42.5 * 2))


def test_reads_past_the_curve_are_priced_by_what_such_reads_took():
    """A draft's catch-up (the prompt, or what it missed) reads hundreds of tokens; the per-token cost
    past the curve's end is learnt from those reads, and one read teaches every size."""
    c = Curve([20.0 * x for x in (1, 1.3, 1.6, 2.0, 2.6, 3.2, 4.0, 4.6)], 20.0, 0.27)
    assert c.ms(408) == pytest.approx(92.0 + 400 * 52.0 / 5)  # the prior: 5 tokens' 10.4 ms a token
    c.add(208, 92.0 + 200 * 4.0)                               # 200 tokens past the end took 4 ms each
    assert c.ms(408) == pytest.approx(92.0 + 400 * 4.0)
    assert c.ms(20) == pytest.approx(92.0 + 12 * 4.0)
    c.add(408, 10_000.0)                                        # an outlier moves it a bounded step
    assert c.ms(408) < 2 * (92.0 + 400 * 4.0)
    assert c.ms(8) == 92.0                                      # within the curve, nothing changed


def test_curves_without_a_profile_interpolate_the_timed_sizes():
    c = Curve(None, 100.0, 0.25)
    assert c.ms(3) == pytest.approx(150.0)  # the prior line
    c.add(1, 80.0)
    c.add(4, 140.0)
    assert c.ms(2) == pytest.approx(100.0)
    assert c.ms(6) == pytest.approx(140.0 + 80.0 * 0.25 * 2)


def test_one_slow_plain_step_moves_no_price():
    """A plain step timed slow once (the machine was busy for a moment) moves no price: a class's
    factor is the median of its last decodes. A lasting change moves it within a few decodes."""
    b = Bench()
    teach_draft(b, 0.55)  # a draft that does not pay on this curve
    for _ in range(5):
        b.observe("plain", 0, 0, 105.0)
    assert b.plan(3).kind == "plain"
    b.observe("plain", 0, 0, 400.0)
    assert b.costs.step_ms() == pytest.approx(105.0)
    assert b.plan(3).kind == "plain"
    for _ in range(3):
        b.observe("plain", 0, 0, 150.0)
    assert b.costs.step_ms() == pytest.approx(150.0)


# The BF16 stand-in's curve as one calibration timed it (2 threads, 2026-12-03): its step too cheap
BF16_CALIBRATED = [75.0, 117.0, 133.0, 148.0, 161.0, 177.0, 187.0, 192.0, 223.0]


def test_a_step_and_a_batch_are_priced_apart():
    """The bench's prose run on the BF16 stand-in: the generation stepped at 106 ms (the calibration
    said 75) and verified 4 tokens in ~150 ms (it said 148). One factor for both priced the verify
    at 208 ms and auto took plain steps where sd made 1.35x as many tokens a second; the step's
    factor and the batch's are learnt apart, so the draft wins as it did in sd."""
    b = Bench(cap=3, draft_ms=12.0, curve=BF16_CALIBRATED)
    b.costs.target.add(1, 106.0)  # the step earlier generations timed (Engine._step_ms)
    for r in range(12):
        accepted = [1, 3, 0, 2][r % 4]  # ~0.6 per position
        b.observe("draft", 3, accepted, 150.0, [0.6] * (accepted + 1))
        for _ in range(2):
            b.observe("plain", 0, 0, 106.0, [0.6])
    assert b.costs.step_ms() == pytest.approx(106.0)
    assert b.costs.target.ms(4) == pytest.approx(150.0, rel=0.05)  # (two steps since: fading a little)
    assert b.costs.target.ms(8) == pytest.approx(192.0 * 150.0 / 148.0, rel=0.05)  # not timed: the batch's factor
    assert b.plan(3).kind == "draft"


def test_a_class_not_timed_fades_into_the_other():
    """A price nothing re-times (plain steps no longer chosen) must not stay what it was: a class
    not timed fades into the factor of the one that runs; one never timed takes it whole."""
    c = Curve(CPU_CURVE, 100.0, 0.25)
    c.add(1, 1.5 * 105.0)
    assert c.ms(4) == pytest.approx(1.5 * 170.0)  # no batch timed yet: the step's factor
    c.add(4, 170.0)
    assert (c.ms(1), c.ms(4)) == (pytest.approx(1.5 * 105.0, rel=0.02), pytest.approx(170.0))
    for _ in range(int(Curve.FADE) - 1):
        c.add(4, 170.0)
    assert c.ms(1) == pytest.approx(1.25 * 105.0)  # half-way after FADE batches
    for _ in range(int(4 * Curve.FADE)):
        c.add(3, 160.0)
    assert c.ms(1) == pytest.approx(105.0, rel=0.02)


def test_a_predictable_draft_wins_with_the_cheap_batch():
    b = Bench()
    teach_draft(b, 0.95)
    d = b.plan(3)
    assert (d.kind, d.m) == ("draft", 3)
    assert d.rate > 1 / 105.0  # faster than a plain step
    assert d.runner_up is not None


def test_plain_steps_where_the_draft_is_weak():
    b = Bench()
    teach_draft(b, 0.3)
    assert b.plan(3).kind == "plain"


# ---------------------------------------------------------------- the two regimes

def test_a_steep_curve_gets_plain_steps_even_from_a_good_draft():
    """Compute-bound (a verify of 4 costs 2.7 steps): a draft accepted 85% of the time still loses."""
    b = Bench(cap=8, draft_ms=12.0, curve=STEEP)
    teach_draft(b, 0.85)
    assert b.plan(16).kind == "plain"


def test_a_flat_curve_gets_the_draft_model_and_longer_drafts():
    """Memory-bound (8 tokens for 1.8 steps): the same draft pays, and longer than the fixed k of 3."""
    b = Bench(cap=8, draft_ms=30.0, curve=FLAT)
    teach_draft(b, 0.85)
    d = b.plan(16)
    assert d.kind == "draft" and d.m > 3
    assert d.rate > 1.5 / 100.0  # at least 1.5x a plain step, by the planner's own estimate


def plain_rounds_until_draft(b: Bench, limit: int, confidence: float = 0.6) -> int | None:
    """Plain steps (the target `confidence` sure) until the plan drafts; the rounds it took, or None.
    The draft's round is planned, not observed (its decision: b.decision)."""
    for n in range(limit):
        d = b.plan(16, remaining=200)
        if d.kind == "draft":
            return n
        b.verified(d, 0, b.costs.target.ms(1), [confidence])
    return None


def test_one_early_miss_does_not_write_off_a_draft_the_profile_trusts():
    """Memory-bound, a draft the profile measured accepted 3 times in 4: one first round with
    nothing accepted (an answer's opening is its least predictable text) does not turn the plan to
    plain steps; on the stand-in that one miss held auto to plain steps where sd ran 1.3x faster."""
    b = Bench(cap=8, draft_ms=12.0, curve=FLAT, draft_prior=0.76)
    b.observe("draft", 3, 0, b.costs.target.ms(4), [0.6])
    assert plain_rounds_until_draft(b, 1) == 0


def test_a_draft_written_off_early_is_probed_again_where_it_could_pay_much():
    """Memory-bound: bad first rounds (nothing accepted, three times) write the draft off, and the
    target's middling confidence would keep it off. A short probe comes after EXPLORE_FIRST plain
    rounds, each unfollowed probe doubles the wait, and a good probe brings the draft back."""
    b = Bench(cap=8, draft_ms=12.0, curve=FLAT)
    assert b.upside() > 1.5
    for _ in range(3):
        b.observe("draft", 3, 0, b.costs.target.ms(4), [0.6])
    assert plain_rounds_until_draft(b, EXPLORE_FIRST) is None
    waits = []
    for _ in range(3):  # probes that fail: the draft stays off between them, each wait twice the last
        n = plain_rounds_until_draft(b, EXPLORE_MOST + 1)
        assert n is not None and b.planner.log[-1][:2] == ("draft", EXPLORE_K) and b.decision.probe
        waits.append(n)
        b.verified(b.decision, 0, b.costs.target.ms(EXPLORE_K + 1), [0.6])
    assert waits[1] >= 2 * EXPLORE_FIRST - 1 and waits[2] >= 2 * waits[1] - 1
    assert b.draft.probes == 3 and b.report()["probes"] == 3
    for _ in range(3):  # the text turns predictable: a probe accepted whole brings the draft back
        n = plain_rounds_until_draft(b, EXPLORE_MOST + 1)
        b.verified(b.decision, EXPLORE_K, b.costs.target.ms(EXPLORE_K + 1), [0.95] * (EXPLORE_K + 1))
    assert plain_rounds_until_draft(b, 2, confidence=0.95) == 0


def test_no_probe_where_the_draft_must_first_read_more_than_the_answer_can_repay():
    """A probe reads the history the draft has not read first. Where that read outweighs what the rest of
    the answer could gain, even at the upside's pace (an editor's 48-token middle after thousands of prompt
    tokens the draft never read), the draft is not probed; with a long answer ahead, the same read pays."""
    b = Bench(cap=8, draft_ms=12.0, curve=FLAT)
    for _ in range(3):
        b.observe("draft", 3, 0, b.costs.target.ms(4), [0.6])
    read = b.costs.draft.ms(3001) - b.costs.draft.ms(1)
    assert 48 * b.costs.step_ms() * (1 - 1 / b.upside()) < read < 2000 * b.costs.step_ms() * (1 - 1 / b.upside())
    for _ in range(EXPLORE_MOST + 1):
        d = b.plan(16, remaining=48, unread=3000, history=list(range(3100)))
        assert d.kind != "draft"
        b.verified(d, 0, b.costs.target.ms(1), [0.6])
    assert b.draft.probes == 0
    d = b.plan(16, remaining=2000, unread=3000, history=list(range(3100)))
    assert d.kind == "draft" and d.probe


def test_a_compute_bound_target_never_probes_the_draft():
    """Compute-bound (a verify of 4 costs 2.7 steps): even a draft accepted 90% of the time would
    not beat plain steps, so a written-off draft is never probed (each probe would cost a round)."""
    b = Bench(cap=8, draft_ms=12.0, curve=STEEP)
    assert b.upside() < 1.1
    b.observe("draft", 3, 0, b.costs.target.ms(4), [0.6])
    assert plain_rounds_until_draft(b, 300) is None and b.draft.probes == 0


@pytest.mark.parametrize("curve, reads", [(STEEP, False), (FLAT, True)])
def test_the_worker_reads_the_prompt_only_where_a_draft_could_pay(curve, reads):
    """The prompt's round: the worker reads the prompt beside the target where drafts may follow,
    and leaves the target its memory bandwidth where none could beat a plain step."""
    b = Bench(cap=8, ngram_cap=16, draft_ms=12.0, curve=curve, contention=1.05, prefilled=False)
    assert b.prepared.runs(1) is reads


def test_a_long_exact_copy_gets_long_ngram_drafts_where_verifying_is_cheap():
    def copy_bench(curve):
        b = Bench(cap=8, ngram_cap=16, curve=curve, draft=False)
        for rates in b.ngram_acceptance.rates:
            for r in rates:
                for _ in range(20):
                    r.add(1.0 if r is not rates[0] or _ % 10 else 0.0)  # a copy that goes on 95%
        return b

    flat = copy_bench(FLAT).plan(32, copy=16, match=40)
    assert (flat.kind, flat.m) == ("ngram", 16)
    steep = copy_bench(STEEP).plan(32, copy=16, match=40)
    assert steep.kind == "ngram" and steep.m < 16  # it still pays here, but shorter


def test_draft_max_stays_a_hard_cap():
    b = Bench(cap=3, ngram_cap=3, curve=FLAT)
    teach_draft(b, 0.99)
    assert b.plan(16).m <= 3
    assert b.plan(2).m <= 2  # and so does the room left (context, max_tokens)


def test_describe_regime_says_what_the_curve_means():
    assert "compute-bound" in describe_regime(STEEP) and "2.7 steps" in describe_regime(STEEP)
    assert "memory-bound" in describe_regime(FLAT) and "pays" in describe_regime(FLAT)
    assert "not measured" in describe_regime([])


# ---------------------------------------------------------------- the n-gram lookup

def test_ngram_wins_on_a_quoting_answer():
    b = Bench(ngram=NgramDrafter(2, 4))
    teach_draft(b, 0.6)
    quoted = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    history = [1, 2] + quoted + [3] + quoted[:4]
    for n in range(4, 10):  # the answer goes on quoting: every proposal matches
        b.ngram_acceptance.ask(history)
        history.append(quoted[n])
        b.ngram_acceptance.observe(history)
    assert len(b.ngram_acceptance.ask(history)) == 3
    d = b.plan(3, history=history)
    assert (d.kind, d.m) == ("ngram", 3)


def test_ngram_acceptance_is_learnt_per_position():
    """A lookup whose first token is a coin flip but whose copy, once started, goes on (an edit that
    quotes its source): later positions are trusted more than the first."""
    acc = Bench(ngram=NgramDrafter(2, 2)).ngram_acceptance
    copy, other = [3, 4, 5], [9, 8, 6]
    history = [1, 2] + copy
    last = copy
    for r in range(32):
        history += [100 + r, 1, 2]  # a new token before each [1, 2]: every match is 2 tokens long
        assert acc.ask(history).tokens == tuple(last)  # what followed [1, 2] the last time
        assert acc.match == 2
        # the answer repeats its last continuation every other round: the proposal then matches
        # whole, else it fails at its first token
        last = [copy, copy, other, other][r % 4]
        history += last
        acc.observe(history)
    first, second, third = (acc.alpha(i) for i in range(3))
    assert first == pytest.approx(0.5, abs=0.1)
    assert second > 0.9 and third > 0.9
    assert acc.gains(3)[3] == pytest.approx(1 + first + first * second + first * second * third)


def test_ngram_acceptance_is_learnt_per_match_length():
    """Short matches that are coincidences and long ones that are copies: the planner learns the two
    classes apart, so it verifies a long copy's proposal and takes a plain step for a coincidence."""
    b = Bench(draft=False)
    acc = b.ngram_acceptance
    short, long = match_class(2), match_class(40)
    assert short != long
    for _ in range(30):
        for i in range(3):  # a long copy goes on: every position accepted
            acc.rates[long][i].add(1.0)
        acc.rates[short][0].add(0.0)  # a coincidence fails at once
    assert b.plan(3, copy=3, match=40).kind == "ngram"
    assert acc.match == 40 and acc.alpha(0) > 0.9
    assert b.plan(3, copy=3, match=2).kind == "plain"
    assert acc.match == 2 and acc.alpha(0) < 0.1


def test_the_shadow_scores_each_match_class_apart():
    """Through ask/observe: a quoted passage (long matches) scores its own class."""
    acc = Bench(ngram=NgramDrafter(2, 4)).ngram_acceptance
    quoted = list(range(10, 40))
    history = [1, 2] + quoted + [3] + quoted[:10]
    for n in range(10, 25):  # the answer goes on quoting
        prop = acc.ask(history)
        assert prop.tokens and acc.match >= 10
        history.append(quoted[n])
        acc.observe(history)
    long = acc.rates[match_class(acc.match)]
    assert long[0].n > 5 and long[0].value > 0.9
    assert all(r.n == 0 for r in acc.rates[match_class(2)])  # nothing was learnt for short matches


# ---------------------------------------------------------------- prepared branches and the draft's catch-up

def test_a_prepared_branch_beats_drafting_now():
    b = Bench()
    teach_draft(b, 0.9)
    d = b.plan(3, prepared=3)
    assert (d.kind, d.m) == ("prepared", 3)
    # a partial hit is extended only when the rest is worth drafting: at 44 ms a draft step, a third
    # token (verify 170 ms instead of 160, plus the step) does not pay; at 10 ms it does
    assert b.plan(3, prepared=2).m == 2
    cheap = Bench(draft_ms=10.0)
    teach_draft(cheap, 0.9)
    d = cheap.plan(3, prepared=2)
    assert (d.kind, d.m) == ("prepared", 3)
    # ... and a branch that --draft-p-min ended counts as complete: the plan is fixed before its
    # length could say anything about the tokens in it
    d = b.plan(3, prepared=1, done=True)
    assert (d.kind, d.m) == ("prepared", 3)


def test_the_drafts_catch_up_is_an_investment_spread_over_what_is_left():
    b = Bench()
    teach_draft(b, 0.95)
    b.costs.draft.add(200, 1500.0)  # reading 200 tokens it missed takes 1.5 s
    fresh = list(range(1000, 1200))  # a history of 200 tokens, nothing in it to copy
    assert b.plan(3, remaining=200, unread=199, history=fresh).kind == "draft"
    assert b.draft.unread == 199
    assert b.plan(3, remaining=3, unread=199, history=fresh).kind == "plain"


def test_a_stale_draft_estimate_fades_into_the_targets_confidence():
    b = Bench()
    teach_draft(b, 0.2, confidence=0.25)  # prose: the draft is as unsure as the target
    assert b.plan(3).kind == "plain"
    for _ in range(40):  # plain steps on text the target is sure of (code, say)
        b.observe("plain", 0, 0, 105.0, [0.99])
    assert b.acceptance.alpha(0) > 0.8
    assert b.plan(3).kind == "draft"


def test_a_draft_that_did_badly_while_the_target_was_sure_is_tried_again_once_that_is_forgotten():
    """code-binsearch, BF16 stand-in: the answer's opening rejected drafts the target was sure of, so
    the confidence proxy learnt a low calibration (accepted per unit confidence); without the draft
    running nothing re-learns it, and plain steps ran 50 of 58 rounds where sd was 1.4x ar. The
    calibration fades back to 1 over plain rounds (CONFIDENCE_FADE), so a sure target brings the
    draft back; on a stretch the target is unsure of, it stays off."""
    b = Bench(cap=8, draft_ms=15.0, curve=FLAT, draft_prior=0.7)
    teach_draft(b, 0.3, rounds=12, confidence=0.95)
    b.draft.explore_wait = 10**6  # no probes: this is the proxy alone (a draft round resets the wait)
    assert b.acceptance.calibration.value < 0.8 and b.plan(8).kind == "plain"
    unsure = Bench(cap=8, draft_ms=15.0, curve=FLAT, draft_prior=0.7)
    teach_draft(unsure, 0.3, rounds=12, confidence=0.95)
    unsure.draft.explore_wait = 10**6
    for _ in range(int(3 * CONFIDENCE_FADE)):
        b.observe("plain", 0, 0, b.costs.target.ms(1), [0.95])
        unsure.observe("plain", 0, 0, unsure.costs.target.ms(1), [0.3])
    assert b.plan(8).kind == "draft"
    assert unsure.plan(8).kind == "plain"


def test_the_prompts_round_is_a_plain_step_and_its_time_is_not_a_step():
    b = Bench(cap=3, ngram_cap=3, prefilled=False)
    assert b.plan(3, copy=3).kind == "plain"
    b.observe("plain", 0, 0, 5000.0, [0.9])  # the prompt's prefill
    assert b.planner.prefilled and b.costs.step_ms() == pytest.approx(105.0)


def test_no_draft_model_means_plain_or_ngram_only():
    b = Bench(draft=False)
    assert [p.kind for p in b.proposers] == ["ngram"]
    assert b.plan(3).kind == "plain"
    assert b.plan(3).m == 0


def test_report_names_every_estimate():
    b = Bench()
    b.plan(3)
    rep = b.report()
    assert set(rep) >= {"decisions", "draft_alpha", "step_ms", "verify_ms", "draft_step_ms", "rounds", "regime",
                        "contention", "prepared_hit_rate", "upside", "probes", "guessed"}
    assert sum(rep["decisions"].values()) == 1
    (kind, m, rate, ru_kind, ru_m, ru_rate), = rep["rounds"]  # why: the choice and the runner-up, in tok/s
    assert kind in ("plain", "draft") and ru_kind != kind and rate >= ru_rate > 0


def test_draft_min_is_never_planned_below():
    b = Bench(k_min=2, draft=False)
    for rates in b.ngram_acceptance.rates:  # a perfect n-gram record, whatever the match length
        for r in rates:
            for _ in range(10):
                r.add(1.0)
    assert b.plan(3, copy=1).kind == "plain"  # one n-gram token is below --draft-min 2
    d = b.plan(3, copy=3)
    assert d.kind == "ngram" and d.m >= 2


def test_p_accept_is_a_distribution_over_the_outcomes():
    b = Bench()
    teach_draft(b, 0.8)
    pa = b.acceptance.p_accept(3)
    assert len(pa) == 4 and pa.sum() == pytest.approx(1.0) and (pa >= 0).all()
    a0, a1 = b.acceptance.alpha(0), b.acceptance.alpha(1)
    assert pa[0] == pytest.approx(1 - a0) and pa[1] == pytest.approx(a0 * (1 - a1))


# ---------------------------------------------------------------- the fixed modes: their proposers in turn

@pytest.mark.parametrize("mode, offer, expected", [
    ("ar", dict(copy=3), ("plain", 0)),                        # (ar has no proposer: rounds.build)
    ("sd", dict(copy=3), ("draft", 3)),
    ("sd", dict(room=2), ("draft", 2)),                        # the room left caps it
    ("lookup", dict(copy=2), ("ngram", 2)),
    ("lookup", dict(), ("plain", 0)),                          # nothing to copy: a plain step
    ("ssd", dict(prepared=2), ("prepared", 3)),                # a partial hit is extended to k
    ("ssd", dict(copy=3, prepared="miss", rounds=2), ("ngram", 3)),  # the backup, offered after 2 misses
    ("ssd", dict(copy=3, prepared="miss"), ("draft", 3)),      # a miss drafts now (no backup after one)
    ("ssd", dict(copy=3, prepared="miss", match=8), ("ngram", 3)),  # ... but takes a copy that matched 8 back
    ("ssd", dict(copy=3, prepared=2, match=8), ("prepared", 3)),    # a prepared branch still goes first
    ("ssd", dict(), ("draft", 3)),                             # nothing prepared: drafts now
])
def test_a_fixed_mode_is_the_planner_held_to_its_proposers(mode, offer, expected):
    b = Bench(menu=mode)
    teach_draft(b, 0.1)  # whatever the estimates say
    offer = {"room": 3, **offer}
    for _ in range(offer.pop("rounds", 1)):
        d = b.plan(**offer)
    assert (d.kind, d.m) == expected


@pytest.mark.parametrize("mode, kinds, worker", [
    ("ar", [], None), ("lookup", ["ngram"], None), ("sd", ["draft"], None),
    ("ssd", ["prepared", "ngram", "draft"], "always"),
])
def test_each_mode_gets_the_proposers_of_its_menu(mode, kinds, worker):
    """rounds.build wires a mode's proposers in the order a fixed mode tries them, and the worker
    only where the menu has one (the planner ranks whatever it is offered)."""
    cfg = EngineConfig.build(target=dict(path="fake-target"), draft=dict(path="fake-draft"), mode=mode)
    n_seqs = cfg.prespec.fanout_max + 1
    draft_kv = KVSeq(FakeContext(FakeModel("draft"), n_ctx=256, n_seq_max=n_seqs))
    rounds = build(mode, cfg, cfg.sampling, 7, Meter(mode, 3), lambda: False, draft_kv=draft_kv, n_draft_seqs=n_seqs)
    try:
        assert [p.kind for p in rounds.proposers] == kinds
        assert {"plain", *kinds} == MENUS[mode].kinds
        assert (rounds.worker is not None) is (worker is not None)
        assert rounds.prepared is None or (rounds.prepared.always and worker == "always")
    finally:
        rounds.close()


# ---------------------------------------------------------------- the worker earns its keep

def test_the_worker_prepares_only_where_a_prepared_branch_pays_for_its_contention():
    gpu = Bench(contention=1.0)  # a GPU target: the draft beside it costs the verify next to nothing
    teach_draft(gpu, 0.95)
    assert gpu.prepared.pays(verifying=4)
    weak = Bench(contention=1.0)
    teach_draft(weak, 0.2, confidence=0.25)
    assert not weak.prepared.pays()   # prose: a ready branch would save nothing over plain steps
    shared = Bench(contention=1.8)  # cores the two models share: the verify slows by 80%
    teach_draft(shared, 0.95)
    assert not shared.prepared.pays(verifying=4)
    # separate cores, a small slowdown: it pays while the prepared branches are used, not after
    separate = Bench(contention=1.1)
    teach_draft(separate, 0.95)
    assert separate.prepared.pays(verifying=4)
    for _ in range(30):
        separate.lookup_passed_over()
    assert not separate.prepared.pays(verifying=4)


def test_a_contention_below_one_is_a_measuring_error_not_a_free_worker():
    """The profile that measured the target *faster* beside a busy draft (0.73) let the worker run
    every round while the planner took plain steps (auto 0.71x ar). The floor makes it cost."""
    costs = Costs(STEEP, draft_step_ms=12.0, contention=0.73)
    assert costs.contention >= CONTENTION_FLOOR
    b = Bench(cap=8, ngram_cap=16, costs=costs)
    for _ in range(20):  # plain rounds: whatever the worker prepares goes unused
        b.lookup_passed_over()
        b.observe("plain", 0, 0, 36.0, [0.6], busy=True)
    assert not b.prepared.runs(1)


def test_the_worker_rests_when_it_slows_the_target():
    """Busy verifies timed against idle ones of the same size: a worker that costs the verify more
    than a ready branch saves stops, whatever the profile said."""
    b = Bench(contention=1.0, curve=FLAT, cap=8, draft_ms=30.0)
    teach_draft(b, 0.9)
    assert b.prepared.runs(4)
    for _ in range(12):
        b.observe("plain", 0, 0, 100.0)
        b.observe("plain", 0, 0, 250.0, busy=True)
    assert b.costs.contention == pytest.approx(2.2, abs=0.1)  # the prior (2 trials at 1.02) still in it
    assert not b.prepared.runs(4)


def test_a_busy_worker_rests_now_and_then_to_time_an_idle_verify():
    b = Bench(contention=1.1, curve=FLAT, cap=8, draft_ms=30.0)  # a worker that costs the target something
    teach_draft(b, 0.95)
    runs = []
    for _ in range(3 * IDLE_EVERY):
        runs.append(b.prepared.runs(4))
        b.observe("prepared", 3, 3, 169.0, busy=runs[-1])
    assert 2 <= runs.count(False) <= 4  # one idle round in IDLE_EVERY busy ones
    assert 4 in b.costs.idle_ms


def test_a_worker_that_costs_the_target_nothing_rests_ever_more_rarely():
    """Busy verifies as fast as idle ones (a GPU target): each rest after busy verifies confirmed it doubles
    the busy rounds to the next one, up to IDLE_EVERY x 2^IDLE_DOUBLINGS; a worker that slows the target
    keeps resting one round in IDLE_EVERY, and a slowdown found later brings that back."""
    def rests(b: Bench, busy_ms: float, rounds: int) -> int:
        n = 0
        for _ in range(rounds):
            runs = b.prepared.runs(4)
            n += not runs
            b.observe("prepared", 3, 3, busy_ms if runs else 169.0, busy=runs)
        return n

    quiet = Bench(contention=1.0, curve=FLAT, cap=8, draft_ms=30.0)
    teach_draft(quiet, 0.95)
    assert quiet.prepared.idle_backoff == 1  # the profile found the worker quiet: the first rest after 32 busy rounds
    assert rests(quiet, 169.0, 16 * IDLE_EVERY) <= 4  # 256 rounds: rests after 32, 64, 128 ...: not 16
    assert quiet.prepared.idle_backoff == IDLE_DOUBLINGS
    costly = Bench(contention=1.1, curve=FLAT, cap=8, draft_ms=30.0)
    teach_draft(costly, 0.95)
    assert rests(costly, 190.0, 4 * IDLE_EVERY) >= 3 and costly.prepared.idle_backoff == 0  # 1.12x: one in 16
    assert quiet.costs.contention <= IDLE_QUIET
    for _ in range(3 * IDLE_EVERY * 2 ** IDLE_DOUBLINGS):  # the target slows beside the worker
        if not rests(quiet, 260.0, 1) and quiet.prepared.idle_backoff == 0:
            break
    assert quiet.prepared.idle_backoff == 0 and quiet.costs.contention > IDLE_QUIET


def test_a_resting_worker_is_tried_again_as_its_hit_rate_fades_to_the_prior():
    b = Bench(contention=1.1)
    teach_draft(b, 0.95)
    for _ in range(30):  # a stretch where nothing the worker prepared was verified
        b.lookup_passed_over()
    assert not b.prepared.pays(verifying=4)
    for _ in range(40):  # it rests; plain steps meanwhile
        b.observe("plain", 0, 0, CPU_CURVE[0])
    assert b.prepared.hit_rate() == pytest.approx(0.5, abs=0.02)
    assert b.prepared.pays(verifying=4)


def test_contention_is_learnt_from_verifies_timed_with_the_worker_busy_and_idle():
    b = Bench()  # no profile measurement: the prior
    assert b.costs.contention == pytest.approx(1.2)
    for _ in range(20):
        b.observe("plain", 0, 0, 100.0)
        b.observe("plain", 0, 0, 150.0, busy=True)
    assert b.costs.contention == pytest.approx(1.5, abs=0.07)  # the prior (2 trials) is still in it
    # a busy verify counts as an idle one divided by the slowdown known then (which lags a little)
    assert b.costs.step_ms() == pytest.approx(100.0, abs=4.0)


def test_the_worker_drafts_branches_as_deep_as_the_curve_pays():
    flat = Bench(cap=8, curve=FLAT)
    teach_draft(flat, 0.9)
    steep = Bench(cap=8, curve=STEEP)
    teach_draft(steep, 0.9)
    assert flat.prepared.branch_depth() > steep.prepared.branch_depth() >= 1


def test_the_worker_is_handed_the_branch_depth_and_the_outcomes_to_prepare():
    """verifying(): the round that was looked up is scored (used or not), and where the worker runs
    it is handed the acceptance of each outcome of the draft being verified and the depth to draft."""
    b = Bench(cap=8, curve=FLAT, contention=1.0)
    teach_draft(b, 0.9)
    d = b.plan(16, prepared=8)
    assert d.kind == "prepared"
    draft = Draft(tuple(range(d.m)), "prespec")
    b.prepared.verifying(b.history, draft, d)
    (snapshot,) = b.worker.snapshots
    assert snapshot.depth == b.prepared.branch_depth()
    assert list(snapshot.p_accept) == list(b.acceptance.p_accept(d.m))
    assert b.prepared.hits.value > 0.5  # the branch looked up was used


# a GPU's prices (the H200 table: a verify of 9 tokens 4.39 ms; a draft batch of 1..9 rows 0.25-0.44 ms)
GPU_VERIFY = [1.70, 3.42, 3.30, 3.39, 3.57, 3.74, 3.85, 3.96, 4.39]
GPU_DRAFT = [0.25, 0.38, 0.385, 0.39, 0.40, 0.41, 0.415, 0.42, 0.44]


def test_the_tree_is_as_wide_as_the_verify_hides_and_its_short_branches_as_deep():
    """tree_shape: on a GPU's prices every acceptance length's branch grows from the first step, the
    likeliest to the full depth and the others as deep as still ends within the verify; where a batch of
    n rows costs n steps (a CPU) the likeliest alone; a short branch is never shallower than a hit on it
    beats a miss."""
    gpu = Bench(cap=8, curve=GPU_VERIFY, costs=Costs(GPU_VERIFY, GPU_DRAFT, contention=1.0))
    teach_draft(gpu, 0.95)
    width, short = gpu.prepared.tree_shape(9, 8, 9)
    assert width == 9 and short == 8  # 0.25 + 8 x 0.44 = 3.77 ms < 4.39
    gpu.prepared.timed.setup_ms = 0.9  # the worker's host work before its first step, as timed
    width, short = gpu.prepared.tree_shape(9, 8, 9)
    assert width == 9 and 3 <= short < 8  # 1.15 + 8 x 0.44 > 4.39: the short ones stop earlier
    g, verify = gpu.acceptance.gains(8), gpu.costs.target.ms
    assert g[short] / verify(short + 1) > g[8] / (8 * 0.25 + verify(9))  # worth more than a miss
    cpu = Bench(cap=8, curve=CPU_CURVE, costs=Costs(CPU_CURVE, [44.0 * n for n in range(1, 10)], contention=1.0))
    teach_draft(cpu, 0.9)
    assert cpu.prepared.tree_shape(4, 3, 9) == (1, 3)


def test_a_generations_first_tree_is_priced_from_the_timings_earlier_generations_took():
    """The worker's tree timings (TreeTimings) live with the engine's TreeChoice, a mode's, over generations:
    the next generation's first round prices a tree from them. Without them it priced one from the draft's
    curve, where a batch of n rows costs n steps, and grew the likeliest branch alone."""
    costs = Costs(GPU_VERIFY, [0.5 * n for n in range(1, 10)], contention=1.0)
    tree = TreeChoice()

    def generation(choice: TreeChoice | None) -> PreparedProposer:
        return PreparedProposer(Prepared(ScriptedDrafter()), PrespecPolicy(PrespecConfig(), choice),
                                DraftAcceptance(8, 0.95), costs, 8, 0, False, always=True)

    first = generation(tree)
    assert first.tree_shape(9, 8, 9) == (1, 8)  # the curve's price: no tree fits the verify
    for _ in range(4):  # the worker's own steps, as it times them
        first.timed.steps.add(1, 0.30)
        first.timed.steps.add(9, 0.45)
    assert first.tree_shape(9, 8, 9)[0] == 9
    assert generation(tree).tree_shape(9, 8, 9)[0] == 9  # the next generation, at its first round
    assert generation(None).tree_shape(9, 8, 9) == (1, 8)  # (a TreeChoice of its own: timed from nothing)


def test_the_trees_steps_are_priced_from_the_workers_own_timings():
    """Once the worker has timed steps of two sizes, a tree step is priced by the line through them (host
    work included), not by the draft's calibrated curve (whose batches read whole rows)."""
    from ssd_edge.planning.prepared import StepLine

    curve = lambda n: 1.0 * n  # noqa: E731

    def line(steps, keep=64):
        out = StepLine(keep)
        for n, ms in steps:
            out.add(n, ms)
        return out

    assert line([(3, 0.5)] * 4).ms(curve, 3) == [1.0, 2.0, 3.0]  # one size: the curve
    got = line([(1, 0.30), (9, 0.50), (1, 0.30), (9, 0.50)]).ms(curve, 9)
    assert got[0] == pytest.approx(0.30) and got[8] == pytest.approx(0.50) and got[4] == pytest.approx(0.40)
    # the last `keep` steps only: older ones leave the sums (a slower line, forgotten)
    got = line([(1, 3.0), (9, 5.0)] * 5 + [(1, 0.30), (9, 0.50)] * 2, keep=4).ms(curve, 9)
    assert got[0] == pytest.approx(0.30) and got[8] == pytest.approx(0.50)
    b = Bench(cap=8, curve=GPU_VERIFY, costs=Costs(GPU_VERIFY, [0.25] + [3.0] * 8, contention=1.0))
    teach_draft(b, 0.95)
    assert b.prepared.tree_shape(9, 8, 9)[0] == 1  # the curve's 3 ms a batch: no tree fits
    b.worker.handoff.steps.extend([(1, 0.3), (9, 0.5)] * 3)
    assert b.prepared.tree_shape(9, 8, 9)[0] > 1  # as timed, it does


def test_the_verify_a_tree_hides_behind_is_timed_with_the_worker_beside_it():
    b = Bench(cap=8, menu="ssd", curve=GPU_VERIFY, costs=Costs(GPU_VERIFY, GPU_DRAFT, contention=1.0))
    teach_draft(b, 0.95)
    assert b.prepared.tree_shape(9, 8, 9) == (9, 8)
    for _ in range(20):
        b.observe("prepared", 8, 8, 3.0, busy=True)  # verifies of 9 took 3 ms with the worker beside them
    width, short = b.prepared.tree_shape(9, 8, 9)
    assert (width, short) != (9, 8) and 0.25 + short * GPU_DRAFT[width - 1] + (8 - short) * 0.25 <= 3.0 + 1e-9


def test_the_tree_is_grown_where_the_worker_is_quiet_and_timed_where_it_shares_cores():
    """ssd on a GPU's prices: the verify's slowdown beside the worker at most IDLE_QUIET, so the worker
    grows the tree though TreeChoice never timed it; with the same prices but a worker that slows the
    verify (shared cores), the likeliest branch alone until the tree is timed faster."""
    for contention, wide in ((1.02, True), (1.3, False)):
        b = Bench(cap=8, menu="ssd", curve=GPU_VERIFY, costs=Costs(GPU_VERIFY, GPU_DRAFT, contention=contention))
        teach_draft(b, 0.95)
        assert not b.policy.tree.on
        d = b.plan(8)
        b.prepared.verifying(b.history, Draft(tuple(range(d.m)), "draft"), d)
        (snapshot,) = b.worker.snapshots
        assert (snapshot.width > 1) == wide, (contention, snapshot)


def test_fixed_modes_never_run_the_worker_unless_ssd():
    """(sd has no worker at all: test_each_mode_gets_the_proposers_of_its_menu.) ssd's runs every round,
    even where it cannot pay."""
    assert Bench(menu="sd").prepared is None
    assert Bench(menu="ssd", curve=STEEP, contention=3.0).prepared.runs(4)


def test_a_deep_position_rejected_early_does_not_cap_every_later_draft():
    """Memory-bound: the first five drafts are rejected at their second token, so position 1 reads
    low and the plan drafts one token at a time, which never measures position 1 again. Without the
    depth fade the draft stayed at m = 1 for the whole answer (measured on prose, BF16 stand-in:
    draft_alpha [0.67, 0.24, ...], 34 rounds of m = 1); with it, position 1 fades into position 0's
    acceptance, and the drafts grow back."""
    b = Bench(cap=8, draft_ms=36.0, curve=FLAT)
    for _ in range(5):
        b.observe("draft", 4, 1, b.costs.target.ms(5), [0.9, 0.9])  # position 0 accepted, 1 rejected
    assert b.acceptance.alpha(1) < 0.3
    lengths = []
    for _ in range(16):  # now every drafted token is accepted
        d = b.plan(16, remaining=200)
        assert d.kind == "draft"
        lengths.append(d.m)
        b.verified(d, d.m, b.costs.target.ms(d.m + 1), [0.95] * (d.m + 1))
    assert lengths[0] == 1 and max(lengths[-4:]) >= 2, lengths
    assert b.acceptance.alpha(1) > 0.6


def drafted_length(b: Bench, confidences: list[float]) -> int:
    """How many tokens a planned draft runs to when the draft's top probability is confidences[j]
    at token j (DraftProposer.propose: its StopRule, asked as ModelDrafter.extend asks it)."""
    d = b.plan(16)
    assert d.kind == "draft"
    b.drafter.confidences = confidences
    return len(b.draft.propose(b.history, d))


def test_a_confident_draft_runs_to_the_cap_and_an_unsure_one_stops_where_it_stops_paying():
    b = Bench(cap=8, draft_ms=15.0, curve=FLAT)
    teach_draft(b, 0.8)
    assert drafted_length(b, [0.99] * 8) == 8                       # flat curve, sure draft: all of it
    assert drafted_length(b, [0.99, 0.99, 0.2, 0.99, 0.99, 0.99, 0.99, 0.99]) == 2  # stops before the unsure token
    assert drafted_length(b, [0.05] * 8) == 1                       # the plan drafts: at least one token


def test_a_step_up_in_the_verify_curve_does_not_stop_a_confident_draft():
    """The BF16 stand-in's measured curve rises in steps (4 tokens cost 166 ms, 5 the same): the
    fourth token alone costs a step up, which judged by itself stopped code drafts at 2 tokens where
    every one was accepted. Judged with the tokens after it, the draft runs on."""
    stair = [93.0, 123.0, 135.0, 166.0, 166.0, 186.0, 206.0, 234.0, 218.0, 222.0, 239.0, 244.0]
    b = Bench(cap=8, draft_ms=16.0, curve=stair)
    teach_draft(b, 0.95)
    assert drafted_length(b, [0.93] * 8) >= 4


def test_the_stop_rule_follows_the_verify_curve_and_leaves_fixed_modes_and_probes_alone():
    conf = [0.85] * 8
    medium = [100.0 * (1 + 0.4 * i) for i in range(17)]  # each verified token 0.4 of a step: drafts pay, less
    flat, steeper = Bench(cap=8, draft_ms=15.0, curve=FLAT), Bench(cap=8, draft_ms=15.0, curve=medium)
    for b in (flat, steeper):
        teach_draft(b, 0.95)
    # where each verified token costs more, the same draft stops sooner
    assert 1 <= drafted_length(steeper, conf) < drafted_length(flat, conf)
    sd = Bench(cap=3, menu="sd")
    assert sd.draft.stop_rule(sd.plan(16)) is None                       # sd drafts its k, as llama.cpp does
    assert len(sd.draft.propose(sd.history, sd.plan(16))) == 3
    b = Bench(cap=8, curve=FLAT)
    assert b.draft.stop_rule(Decision("draft", 3, 0.0, probe=True)) is None  # a probe (rate 0) drafts its length


def test_k_min_tokens_are_drafted_before_the_rule_may_stop():
    b = Bench(cap=8, draft_ms=15.0, curve=FLAT, k_min=3)
    teach_draft(b, 0.8)
    assert drafted_length(b, [0.01] * 8) == 3


def test_a_draft_reads_an_ngram_copy_as_its_guess_where_that_saves_steps():
    """An n-gram copy the target is likely to take is likely the draft's own next tokens too: read in
    the batch with the draft's first row, each guessed token the draft draws saves it a step. The plan
    asks for the guess only where those steps outweigh the rows it reads."""
    draft_curve = [20.0 + 2.0 * i for i in range(16)]  # a row more in a batch: a tenth of a step

    def guessing(copy_rate: float) -> Bench:
        b = Bench(cap=8, ngram_cap=16, costs=Costs(FLAT, draft_curve))
        teach_draft(b, 0.97)
        for rates in b.ngram_acceptance.rates:
            for r in rates:
                for i in range(20):
                    r.add(1.0 if (i * 37 % 100) / 100 < copy_rate else 0.0)
        return b

    sure = guessing(0.8).plan(16, remaining=200, copy=16)
    assert sure.kind == "draft" and sure.m > 4 and sure.guess == sure.m - 1  # every row the planned draft uses
    assert guessing(0.8).plan(16, remaining=200).guess == 0  # no copy on offer
    assert guessing(0.0).plan(16, remaining=200, copy=16).guess == 0  # a copy that never holds


def test_the_rounds_acceptances_are_what_the_estimate_says_after_every_observation():
    """DraftAcceptance.alpha(i) is worked out once between two observe() calls (a round asks for it in
    its plan, the SSD window and the outcome ranking): after every kind of observation it must still be
    the estimate computed afresh, and it must move when an observation moves the estimate."""
    b = Bench(cap=8, draft_ms=15.0, curve=FLAT)
    acc = b.acceptance
    seen = []
    rounds = [("draft", 8, 8, [0.9] * 9), ("plain", 0, 0, [0.99]), ("draft", 8, 2, [0.5] * 3),
              ("prepared", 8, 5, [0.8] * 6), ("ngram", 4, 1, [0.7] * 2)] * 6
    for kind, drafted, accepted, top1 in rounds:
        before = [acc.alpha(i) for i in range(10)]  # past the cap too: the deepest one measured
        b.plan(8)  # a round's own questions change nothing alpha reads
        assert [acc.alpha(i) for i in range(10)] == before
        b.observe(kind, drafted, accepted, b.costs.target.ms(drafted + 1), top1)
        after = [acc.alpha(i) for i in range(10)]
        assert after == [acc.estimate(i) for i in range(10)]
        seen.append(after)
    assert len({tuple(a) for a in seen}) > 5  # the estimates moved with the rounds
    assert acc.p_accept(8).sum() == pytest.approx(1.0)
