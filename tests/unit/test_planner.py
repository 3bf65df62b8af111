"""The round planner (planning/planner.py) and its cost model (planning/costs.py) with plain
numbers: each proposer wins where it should, in both regimes (a compute-bound CPU, where a verify
of n tokens costs about n steps, and a memory-bound device, where it costs little more than one),
drafts grow as long as the curve pays, costs are learnt from what is timed, the fixed modes are
the planner held to one proposer, and the pre-speculation worker runs only while it earns its keep."""

from __future__ import annotations

import pytest

from ssd_edge.planning.costs import CONTENTION_FLOOR, Costs, Curve, Rate, describe_regime
from ssd_edge.planning.planner import (EXPLORE_FIRST, EXPLORE_K, EXPLORE_MOST, IDLE_DOUBLINGS, IDLE_EVERY, IDLE_QUIET, MENUS,
                                      Offer, Planner, match_class)
from ssd_edge.speculation.drafters import NgramDrafter

# A CPU-like target (FIELD_NOTES, 1.5B at 2 threads, Intel): 4 tokens cost ~1.6 steps.
CPU_CURVE = [105.0, 150.0, 160.0, 170.0, 220.0]
# This AMD machine's Q4_K_M target (FIELD_NOTES, "Two regimes"): n tokens cost about n steps.
STEEP = [36.0 * x for x in (1, 1.7, 2.2, 2.73, 3.4, 4.1, 4.8, 5.4, 5.94, 6.6, 7.3, 8, 8.7, 9.4, 10, 10.7, 11.4)]
# The same target in BF16 (memory-bound): 8 tokens cost 1.8 steps.
FLAT = [100.0 * x for x in (1, 1.37, 1.5, 1.69, 1.72, 1.75, 1.78, 1.8, 1.85, 1.9, 1.95, 2, 2.05, 2.1, 2.15, 2.2, 2.25)]


def planner(cap: int = 3, draft_ms: float = 44.0, curve=CPU_CURVE, contention: float | None = None,
            menu: str = "auto", ngram_cap: int | None = None, **kw) -> Planner:
    """A planner past the prompt's round (whose time says nothing of a step)."""
    p = Planner(MENUS[menu], Costs(curve, draft_step_ms=draft_ms, contention=contention), draft_cap=cap,
                ngram_cap=ngram_cap or cap, **kw)
    p.prefilled = True
    return p


def teach_draft(p: Planner, alpha_hits: float, rounds: int = 40, confidence: float = 0.9) -> None:
    """Verified draft rounds in which each position is accepted with frequency alpha_hits, the
    target's top-1 probability being `confidence` at each committed position."""
    k = p.caps["draft"]
    for r in range(rounds):
        accepted = 0
        for i in range(k):  # a deterministic pattern with the wanted per-position rate
            if ((r * 7 + i * 3) % 100) / 100 < alpha_hits:
                accepted += 1
            else:
                break
        p.observe("draft", k, accepted, p.costs.target.ms(k + 1), [confidence] * (accepted + 1))


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
    p = planner()
    teach_draft(p, 0.55)  # a draft that does not pay on this curve
    for _ in range(5):
        p.observe("plain", 0, 0, 105.0)
    assert p.plan(Offer(3, draft=True)).kind == "plain"
    p.observe("plain", 0, 0, 400.0)
    assert p.costs.step_ms() == pytest.approx(105.0)
    assert p.plan(Offer(3, draft=True)).kind == "plain"
    for _ in range(3):
        p.observe("plain", 0, 0, 150.0)
    assert p.costs.step_ms() == pytest.approx(150.0)


# The BF16 stand-in's curve as one calibration timed it (2 threads, 2026-12-03): its step too cheap
BF16_CALIBRATED = [75.0, 117.0, 133.0, 148.0, 161.0, 177.0, 187.0, 192.0, 223.0]


def test_a_step_and_a_batch_are_priced_apart():
    """The bench's prose run on the BF16 stand-in: the generation stepped at 106 ms (the calibration
    said 75) and verified 4 tokens in ~150 ms (it said 148). One factor for both priced the verify
    at 208 ms and auto took plain steps where sd made 1.35x as many tokens a second; the step's
    factor and the batch's are learnt apart, so the draft wins as it did in sd."""
    p = planner(cap=3, draft_ms=12.0, curve=BF16_CALIBRATED)
    p.costs.target.add(1, 106.0)  # the step earlier generations timed (Engine._step_ms)
    for r in range(12):
        accepted = [1, 3, 0, 2][r % 4]  # ~0.6 per position
        p.observe("draft", 3, accepted, 150.0, [0.6] * (accepted + 1))
        for _ in range(2):
            p.observe("plain", 0, 0, 106.0, [0.6])
    assert p.costs.step_ms() == pytest.approx(106.0)
    assert p.costs.target.ms(4) == pytest.approx(150.0, rel=0.05)  # (two steps since: fading a little)
    assert p.costs.target.ms(8) == pytest.approx(192.0 * 150.0 / 148.0, rel=0.05)  # not timed: the batch's factor
    assert p.plan(Offer(3, draft=True)).kind == "draft"


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
    p = planner()
    teach_draft(p, 0.95)
    d = p.plan(Offer(3, draft=True))
    assert (d.kind, d.m) == ("draft", 3)
    assert d.rate > 1 / 105.0  # faster than a plain step
    assert d.runner_up is not None


def test_plain_steps_where_the_draft_is_weak():
    p = planner()
    teach_draft(p, 0.3)
    assert p.plan(Offer(3, draft=True)).kind == "plain"


# ---------------------------------------------------------------- the two regimes

def test_a_steep_curve_gets_plain_steps_even_from_a_good_draft():
    """Compute-bound (a verify of 4 costs 2.7 steps): a draft accepted 85% of the time still loses."""
    p = planner(cap=8, draft_ms=12.0, curve=STEEP)
    teach_draft(p, 0.85)
    assert p.plan(Offer(16, draft=True)).kind == "plain"


def test_a_flat_curve_gets_the_draft_model_and_longer_drafts():
    """Memory-bound (8 tokens for 1.8 steps): the same draft pays, and longer than the fixed k of 3."""
    p = planner(cap=8, draft_ms=30.0, curve=FLAT)
    teach_draft(p, 0.85)
    d = p.plan(Offer(16, draft=True))
    assert d.kind == "draft" and d.m > 3
    assert d.rate > 1.5 / 100.0  # at least 1.5x a plain step, by the planner's own estimate


def plain_rounds_until_draft(p: Planner, limit: int, confidence: float = 0.6) -> int | None:
    """Plain steps (the target `confidence` sure) until the plan drafts; the rounds it took, or None."""
    for n in range(limit):
        d = p.plan(Offer(16, remaining=200, draft=True))
        if d.kind == "draft":
            return n
        p.observe("plain", 0, 0, p.costs.target.ms(1), [confidence])
    return None


def test_one_early_miss_does_not_write_off_a_draft_the_profile_trusts():
    """Memory-bound, a draft the profile measured accepted 3 times in 4: one first round with
    nothing accepted (an answer's opening is its least predictable text) does not turn the plan to
    plain steps; on the stand-in that one miss held auto to plain steps where sd ran 1.3x faster."""
    p = planner(cap=8, draft_ms=12.0, curve=FLAT, draft_prior=0.76)
    p.observe("draft", 3, 0, p.costs.target.ms(4), [0.6])
    assert plain_rounds_until_draft(p, 1) == 0


def test_a_draft_written_off_early_is_probed_again_where_it_could_pay_much():
    """Memory-bound: bad first rounds (nothing accepted, three times) write the draft off, and the
    target's middling confidence would keep it off. A short probe comes after EXPLORE_FIRST plain
    rounds, each unfollowed probe doubles the wait, and a good probe brings the draft back."""
    p = planner(cap=8, draft_ms=12.0, curve=FLAT)
    assert p.upside() > 1.5
    for _ in range(3):
        p.observe("draft", 3, 0, p.costs.target.ms(4), [0.6])
    assert plain_rounds_until_draft(p, EXPLORE_FIRST) is None
    waits = []
    for _ in range(3):  # probes that fail: the draft stays off between them, each wait twice the last
        n = plain_rounds_until_draft(p, EXPLORE_MOST + 1)
        assert n is not None and p.log[-1][:2] == ("draft", EXPLORE_K)
        waits.append(n)
        p.observe("draft", EXPLORE_K, 0, p.costs.target.ms(EXPLORE_K + 1), [0.6])
    assert waits[1] >= 2 * EXPLORE_FIRST - 1 and waits[2] >= 2 * waits[1] - 1
    assert p.probes == 3 and p.report()["probes"] == 3
    for _ in range(3):  # the text turns predictable: a probe accepted whole brings the draft back
        n = plain_rounds_until_draft(p, EXPLORE_MOST + 1)
        p.observe("draft", EXPLORE_K, EXPLORE_K, p.costs.target.ms(EXPLORE_K + 1), [0.95] * (EXPLORE_K + 1))
    assert plain_rounds_until_draft(p, 2, confidence=0.95) == 0


def test_a_compute_bound_target_never_probes_the_draft():
    """Compute-bound (a verify of 4 costs 2.7 steps): even a draft accepted 90% of the time would
    not beat plain steps, so a written-off draft is never probed (each probe would cost a round)."""
    p = planner(cap=8, draft_ms=12.0, curve=STEEP)
    assert p.upside() < 1.1
    p.observe("draft", 3, 0, p.costs.target.ms(4), [0.6])
    assert plain_rounds_until_draft(p, 300) is None and p.probes == 0


@pytest.mark.parametrize("curve, reads", [(STEEP, False), (FLAT, True)])
def test_the_worker_reads_the_prompt_only_where_a_draft_could_pay(curve, reads):
    """The prompt's round: the worker reads the prompt beside the target where drafts may follow,
    and leaves the target its memory bandwidth where none could beat a plain step."""
    p = Planner(MENUS["auto"], Costs(curve, draft_step_ms=12.0, contention=1.05), draft_cap=8, ngram_cap=16)
    assert p.worker_runs(1) is reads


def test_a_long_exact_copy_gets_long_ngram_drafts_where_verifying_is_cheap():
    def copy_planner(curve):
        p = planner(cap=8, ngram_cap=16, curve=curve)
        for rates in p.ngram_alpha:
            for r in rates:
                for _ in range(20):
                    r.add(1.0 if r is not rates[0] or _ % 10 else 0.0)  # a copy that goes on 95%
        p.ngram_match = 40
        return p

    flat = copy_planner(FLAT).plan(Offer(32, ngram=16))
    assert (flat.kind, flat.m) == ("ngram", 16)
    steep = copy_planner(STEEP).plan(Offer(32, ngram=16))
    assert steep.kind == "ngram" and steep.m < 16  # it still pays here, but shorter


def test_draft_max_stays_a_hard_cap():
    p = planner(cap=3, ngram_cap=3, curve=FLAT)
    teach_draft(p, 0.99)
    assert p.plan(Offer(16, draft=True)).m <= 3
    assert p.plan(Offer(2, draft=True)).m <= 2  # and so does the room left (context, max_tokens)


def test_describe_regime_says_what_the_curve_means():
    assert "compute-bound" in describe_regime(STEEP) and "2.7 steps" in describe_regime(STEEP)
    assert "memory-bound" in describe_regime(FLAT) and "pays" in describe_regime(FLAT)
    assert "not measured" in describe_regime([])


# ---------------------------------------------------------------- the n-gram lookup

def test_ngram_wins_on_a_quoting_answer():
    ngram = NgramDrafter(2, 4)
    p = planner(ngram=ngram)
    teach_draft(p, 0.6)
    quoted = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    history = [1, 2] + quoted + [3] + quoted[:4]
    for n in range(4, 10):  # the answer goes on quoting: every proposal matches
        p.ask_ngram(history)
        history.append(quoted[n])
        p.observe_history(history)
    prop = p.ask_ngram(history)
    assert len(prop) == 3
    d = p.plan(Offer(3, ngram=len(prop), draft=True))
    assert (d.kind, d.m) == ("ngram", 3)


def test_ngram_acceptance_is_learnt_per_position():
    """A lookup whose first token is a coin flip but whose copy, once started, goes on (an edit that
    quotes its source): later positions are trusted more than the first."""
    p = planner(ngram=NgramDrafter(2, 2))
    copy, other = [3, 4, 5], [9, 8, 6]
    history = [1, 2] + copy
    last = copy
    for r in range(32):
        history += [100 + r, 1, 2]  # a new token before each [1, 2]: every match is 2 tokens long
        assert p.ask_ngram(history).tokens == tuple(last)  # what followed [1, 2] the last time
        assert p.ngram_match == 2
        # the answer repeats its last continuation every other round: the proposal then matches
        # whole, else it fails at its first token
        last = [copy, copy, other, other][r % 4]
        history += last
        p.observe_history(history)
    first, second, third = (p.alpha("ngram", i) for i in range(3))
    assert first == pytest.approx(0.5, abs=0.1)
    assert second > 0.9 and third > 0.9
    assert p.gains("ngram", 3)[3] == pytest.approx(1 + first + first * second + first * second * third)


def test_ngram_acceptance_is_learnt_per_match_length():
    """Short matches that are coincidences and long ones that are copies: the planner learns the two
    classes apart, so it verifies a long copy's proposal and takes a plain step for a coincidence."""
    p = planner(ngram=NgramDrafter(2, 4))
    short, long = match_class(2), match_class(40)
    assert short != long
    for _ in range(30):
        for i in range(3):  # a long copy goes on: every position accepted
            p.ngram_alpha[long][i].add(1.0)
        p.ngram_alpha[short][0].add(0.0)  # a coincidence fails at once
    p.ngram_match = 40
    assert p.alpha("ngram", 0) > 0.9
    assert p.plan(Offer(3, ngram=3)).kind == "ngram"
    p.ngram_match = 2
    assert p.alpha("ngram", 0) < 0.1
    assert p.plan(Offer(3, ngram=3)).kind == "plain"


def test_the_shadow_scores_each_match_class_apart():
    """Through ask/observe_history: a quoted passage (long matches) scores its own class."""
    p = planner(ngram=NgramDrafter(2, 4))
    quoted = list(range(10, 40))
    history = [1, 2] + quoted + [3] + quoted[:10]
    for n in range(10, 25):  # the answer goes on quoting
        prop = p.ask_ngram(history)
        assert prop.tokens and p.ngram_match >= 10
        history.append(quoted[n])
        p.observe_history(history)
    long = p.ngram_alpha[match_class(p.ngram_match)]
    assert long[0].n > 5 and long[0].value > 0.9
    assert all(r.n == 0 for r in p.ngram_alpha[match_class(2)])  # nothing was learnt for short matches


# ---------------------------------------------------------------- prepared branches and the draft's catch-up

def test_a_prepared_branch_beats_drafting_now():
    p = planner()
    teach_draft(p, 0.9)
    d = p.plan(Offer(3, draft=True, prepared=3))
    assert (d.kind, d.m) == ("prepared", 3)
    # a partial hit is extended only when the rest is worth drafting: at 44 ms a draft step, a third
    # token (verify 170 ms instead of 160, plus the step) does not pay; at 10 ms it does
    assert p.plan(Offer(3, draft=True, prepared=2)).m == 2
    cheap = planner(draft_ms=10.0)
    teach_draft(cheap, 0.9)
    d = cheap.plan(Offer(3, draft=True, prepared=2))
    assert (d.kind, d.m) == ("prepared", 3)
    # ... and a branch that --draft-p-min ended counts as complete: the plan is fixed before its
    # length could say anything about the tokens in it
    d = p.plan(Offer(3, draft=True, prepared=1, prepared_done=True))
    assert (d.kind, d.m) == ("prepared", 3)


def test_the_drafts_catch_up_is_an_investment_spread_over_what_is_left():
    p = planner()
    teach_draft(p, 0.95)
    p.costs.draft.add(200, 1500.0)  # reading 200 tokens it missed takes 1.5 s
    assert p.plan(Offer(3, remaining=200, draft=True, draft_unread=199)).kind == "draft"
    assert p.plan(Offer(3, remaining=3, draft=True, draft_unread=199)).kind == "plain"


def test_a_stale_draft_estimate_fades_into_the_targets_confidence():
    p = planner()
    teach_draft(p, 0.2, confidence=0.25)  # prose: the draft is as unsure as the target
    assert p.plan(Offer(3, draft=True)).kind == "plain"
    for _ in range(40):  # plain steps on text the target is sure of (code, say)
        p.observe("plain", 0, 0, 105.0, [0.99])
    assert p.alpha("draft", 0) > 0.8
    assert p.plan(Offer(3, draft=True)).kind == "draft"


def test_a_draft_that_did_badly_while_the_target_was_sure_is_tried_again_once_that_is_forgotten():
    """code-binsearch, BF16 stand-in: the answer's opening rejected drafts the target was sure of, so
    the confidence proxy learnt a low calibration (accepted per unit confidence); without the draft
    running nothing re-learns it, and plain steps ran 50 of 58 rounds where sd was 1.4x ar. The
    calibration fades back to 1 over plain rounds (CONFIDENCE_FADE), so a sure target brings the
    draft back; on a stretch the target is unsure of, it stays off."""
    from ssd_edge.planning.planner import CONFIDENCE_FADE

    p = planner(cap=8, draft_ms=15.0, curve=FLAT, draft_prior=0.7)
    p.explore_wait = 10**6  # no probes: this is the proxy alone
    teach_draft(p, 0.3, rounds=12, confidence=0.95)
    assert p.calibration.value < 0.8 and p.plan(Offer(8, draft=True)).kind == "plain"
    unsure = planner(cap=8, draft_ms=15.0, curve=FLAT, draft_prior=0.7)
    unsure.explore_wait = 10**6
    teach_draft(unsure, 0.3, rounds=12, confidence=0.95)
    for _ in range(int(3 * CONFIDENCE_FADE)):
        p.observe("plain", 0, 0, p.costs.target.ms(1), [0.95])
        unsure.observe("plain", 0, 0, unsure.costs.target.ms(1), [0.3])
    assert p.plan(Offer(8, draft=True)).kind == "draft"
    assert unsure.plan(Offer(8, draft=True)).kind == "plain"


def test_the_prompts_round_is_a_plain_step_and_its_time_is_not_a_step():
    p = Planner(MENUS["auto"], Costs(CPU_CURVE, draft_step_ms=44.0), draft_cap=3, ngram_cap=3)
    assert p.plan(Offer(3, draft=True, ngram=3)).kind == "plain"
    p.observe("plain", 0, 0, 5000.0, [0.9])  # the prompt's prefill
    assert p.prefilled and p.costs.step_ms() == pytest.approx(105.0)


def test_no_draft_model_means_plain_or_ngram_only():
    p = planner()
    assert p.plan(Offer(3)).kind == "plain"
    assert p.plan(Offer(3, ngram=0, draft=False, prepared=None)).m == 0


def test_report_names_every_estimate():
    p = planner()
    p.plan(Offer(3, draft=True))
    rep = p.report()
    assert set(rep) >= {"decisions", "draft_alpha", "step_ms", "verify_ms", "draft_step_ms", "rounds", "regime",
                        "contention", "prepared_hit_rate", "upside", "probes", "guessed"}
    assert sum(rep["decisions"].values()) == 1
    (kind, m, rate, ru_kind, ru_m, ru_rate), = rep["rounds"]  # why: the choice and the runner-up, in tok/s
    assert kind in ("plain", "draft") and ru_kind != kind and rate >= ru_rate > 0


def test_draft_min_is_never_planned_below():
    p = planner(k_min=2)
    for rates in p.ngram_alpha:  # a perfect n-gram record, whatever the match length
        for r in rates:
            for _ in range(10):
                r.add(1.0)
    assert p.plan(Offer(3, ngram=1)).kind == "plain"  # one n-gram token is below --draft-min 2
    d = p.plan(Offer(3, ngram=3))
    assert d.kind == "ngram" and d.m >= 2


def test_p_accept_is_a_distribution_over_the_outcomes():
    p = planner()
    teach_draft(p, 0.8)
    pa = p.p_accept(3)
    assert len(pa) == 4 and pa.sum() == pytest.approx(1.0) and (pa >= 0).all()
    a0, a1 = p.alpha("draft", 0), p.alpha("draft", 1)
    assert pa[0] == pytest.approx(1 - a0) and pa[1] == pytest.approx(a0 * (1 - a1))


# ---------------------------------------------------------------- the fixed modes: one proposer each

@pytest.mark.parametrize("mode, offer, expected", [
    ("ar", Offer(3, ngram=3, draft=True), ("plain", 0)),
    ("sd", Offer(3, ngram=3, draft=True), ("draft", 3)),
    ("sd", Offer(2, draft=True), ("draft", 2)),                       # the room left caps it
    ("lookup", Offer(3, ngram=2, draft=True), ("ngram", 2)),
    ("lookup", Offer(3, ngram=0, draft=True), ("plain", 0)),          # nothing to copy: a plain step
    ("ssd", Offer(3, draft=True, prepared=2), ("prepared", 3)),       # a partial hit is extended to k
    ("ssd", Offer(3, ngram=3, draft=True), ("ngram", 3)),             # the backup (offered after misses)
    ("ssd", Offer(3, draft=True), ("draft", 3)),                      # a miss drafts now
])
def test_a_fixed_mode_is_the_planner_held_to_one_proposer(mode, offer, expected):
    p = planner(menu=mode)
    teach_draft(p, 0.1)  # whatever the estimates say
    d = p.plan(offer)
    assert (d.kind, d.m) == expected


# ---------------------------------------------------------------- the worker earns its keep

def test_the_worker_prepares_only_where_a_prepared_branch_pays_for_its_contention():
    gpu = planner(contention=1.0)  # a GPU target: the draft beside it costs the verify next to nothing
    teach_draft(gpu, 0.95)
    assert gpu.prespec_pays(verifying=4)
    weak = planner(contention=1.0)
    teach_draft(weak, 0.2, confidence=0.25)
    assert not weak.prespec_pays()   # prose: a ready branch would save nothing over plain steps
    shared = planner(contention=1.8)  # cores the two models share: the verify slows by 80%
    teach_draft(shared, 0.95)
    assert not shared.prespec_pays(verifying=4)
    # separate cores, a small slowdown: it pays while the prepared branches are used, not after
    separate = planner(contention=1.1)
    teach_draft(separate, 0.95)
    assert separate.prespec_pays(verifying=4)
    for _ in range(30):
        separate.observe_lookup(False)
    assert not separate.prespec_pays(verifying=4)


def test_a_contention_below_one_is_a_measuring_error_not_a_free_worker():
    """The profile that measured the target *faster* beside a busy draft (0.73) let the worker run
    every round while the planner took plain steps (auto 0.71x ar). The floor makes it cost."""
    costs = Costs(STEEP, draft_step_ms=12.0, contention=0.73)
    assert costs.contention >= CONTENTION_FLOOR
    p = Planner(MENUS["auto"], costs, draft_cap=8, ngram_cap=16)
    p.prefilled = True
    for _ in range(20):  # plain rounds: whatever the worker prepares goes unused
        p.observe("plain", 0, 0, 36.0, [0.6], busy=True)
        p.observe_lookup(False)
    assert not p.worker_runs(1)


def test_the_worker_rests_when_it_slows_the_target():
    """Busy verifies timed against idle ones of the same size: a worker that costs the verify more
    than a ready branch saves stops, whatever the profile said."""
    p = planner(contention=1.0, curve=FLAT, cap=8, draft_ms=30.0)
    teach_draft(p, 0.9)
    assert p.worker_runs(4)
    for _ in range(12):
        p.observe("plain", 0, 0, 100.0)
        p.observe("plain", 0, 0, 250.0, busy=True)
    assert p.costs.contention == pytest.approx(2.2, abs=0.1)  # the prior (2 trials at 1.02) still in it
    assert not p.worker_runs(4)


def test_a_busy_worker_rests_now_and_then_to_time_an_idle_verify():
    p = planner(contention=1.1, curve=FLAT, cap=8, draft_ms=30.0)  # a worker that costs the target something
    teach_draft(p, 0.95)
    runs = []
    for _ in range(3 * IDLE_EVERY):
        runs.append(p.worker_runs(4))
        p.observe("prepared", 3, 3, 169.0, busy=runs[-1])
    assert 2 <= runs.count(False) <= 4  # one idle round in IDLE_EVERY busy ones
    assert 4 in p.costs.idle_ms


def test_a_worker_that_costs_the_target_nothing_rests_ever_more_rarely():
    """Busy verifies as fast as idle ones (a GPU target): each rest after busy verifies confirmed it doubles
    the busy rounds to the next one, up to IDLE_EVERY x 2^IDLE_DOUBLINGS; a worker that slows the target
    keeps resting one round in IDLE_EVERY, and a slowdown found later brings that back."""
    def rests(p: Planner, busy_ms: float, rounds: int) -> int:
        n = 0
        for _ in range(rounds):
            runs = p.worker_runs(4)
            n += not runs
            p.observe("prepared", 3, 3, busy_ms if runs else 169.0, busy=runs)
        return n

    quiet = planner(contention=1.0, curve=FLAT, cap=8, draft_ms=30.0)
    teach_draft(quiet, 0.95)
    assert quiet.idle_backoff == 1  # the profile found the worker quiet: the first rest after 32 busy rounds
    assert rests(quiet, 169.0, 16 * IDLE_EVERY) <= 4  # 256 rounds: rests after 32, 64, 128 ...: not 16
    assert quiet.idle_backoff == IDLE_DOUBLINGS
    costly = planner(contention=1.1, curve=FLAT, cap=8, draft_ms=30.0)
    teach_draft(costly, 0.95)
    assert rests(costly, 190.0, 4 * IDLE_EVERY) >= 3 and costly.idle_backoff == 0  # 1.12x: one in 16
    assert quiet.costs.contention <= IDLE_QUIET
    for _ in range(3 * IDLE_EVERY * 2 ** IDLE_DOUBLINGS):  # the target slows beside the worker
        if not rests(quiet, 260.0, 1) and quiet.idle_backoff == 0:
            break
    assert quiet.idle_backoff == 0 and quiet.costs.contention > IDLE_QUIET


def test_a_resting_worker_is_tried_again_as_its_hit_rate_fades_to_the_prior():
    p = planner(contention=1.1)
    teach_draft(p, 0.95)
    for _ in range(30):  # a stretch where nothing the worker prepared was verified
        p.observe_lookup(False)
    assert not p.prespec_pays(verifying=4)
    for _ in range(40):  # it rests; plain steps meanwhile
        p.observe("plain", 0, 0, CPU_CURVE[0])
    assert p.hit_rate() == pytest.approx(0.5, abs=0.02)
    assert p.prespec_pays(verifying=4)


def test_contention_is_learnt_from_verifies_timed_with_the_worker_busy_and_idle():
    p = planner()  # no profile measurement: the prior
    assert p.costs.contention == pytest.approx(1.2)
    for _ in range(20):
        p.observe("plain", 0, 0, 100.0)
        p.observe("plain", 0, 0, 150.0, busy=True)
    assert p.costs.contention == pytest.approx(1.5, abs=0.07)  # the prior (2 trials) is still in it
    # a busy verify counts as an idle one divided by the slowdown known then (which lags a little)
    assert p.costs.step_ms() == pytest.approx(100.0, abs=4.0)


def test_the_worker_drafts_branches_as_deep_as_the_curve_pays():
    flat = planner(cap=8, curve=FLAT)
    teach_draft(flat, 0.9)
    steep = planner(cap=8, curve=STEEP)
    teach_draft(steep, 0.9)
    assert flat.branch_depth() > steep.branch_depth() >= 1


def test_fixed_modes_never_run_the_worker_unless_ssd():
    assert not planner(menu="sd").worker_runs(4)
    assert planner(menu="ssd", curve=STEEP, contention=3.0).worker_runs(4)


def test_a_deep_position_rejected_early_does_not_cap_every_later_draft():
    """Memory-bound: the first five drafts are rejected at their second token, so position 1 reads
    low and the plan drafts one token at a time, which never measures position 1 again. Without the
    depth fade the draft stayed at m = 1 for the whole answer (measured on prose, BF16 stand-in:
    draft_alpha [0.67, 0.24, ...], 34 rounds of m = 1); with it, position 1 fades into position 0's
    acceptance, and the drafts grow back."""
    p = planner(cap=8, draft_ms=36.0, curve=FLAT)
    for _ in range(5):
        p.observe("draft", 4, 1, p.costs.target.ms(5), [0.9, 0.9])  # position 0 accepted, 1 rejected
    assert p.alpha("draft", 1) < 0.3
    lengths = []
    for _ in range(16):  # now every drafted token is accepted
        d = p.plan(Offer(16, remaining=200, draft=True))
        assert d.kind == "draft"
        lengths.append(d.m)
        p.observe("draft", d.m, d.m, p.costs.target.ms(d.m + 1), [0.95] * (d.m + 1))
    assert lengths[0] == 1 and max(lengths[-4:]) >= 2, lengths
    assert p.alpha("draft", 1) > 0.6


def drafted_length(p: Planner, confidences: list[float], cap: int) -> int:
    """How many tokens a planned draft runs to when the draft's top probability is confidences[j]
    at token j (Planner.go_on, asked as ModelDrafter.extend asks it)."""
    d = p.plan(Offer(room=16, draft=True))
    assert d.kind == "draft"
    go_on = p.go_on(d)
    n = 0
    while n < cap:
        take, more = go_on(n, confidences[n])
        n += take
        if not (take and more):
            break
    return n


def test_a_confident_draft_runs_to_the_cap_and_an_unsure_one_stops_where_it_stops_paying():
    p = planner(cap=8, draft_ms=15.0, curve=FLAT)
    teach_draft(p, 0.8)
    assert drafted_length(p, [0.99] * 8, 8) == 8                       # flat curve, sure draft: all of it
    assert drafted_length(p, [0.99, 0.99, 0.2, 0.99, 0.99, 0.99, 0.99, 0.99], 8) == 2  # stops before the unsure token
    assert drafted_length(p, [0.05] * 8, 8) == 1                       # the plan drafts: at least one token


def test_a_step_up_in_the_verify_curve_does_not_stop_a_confident_draft():
    """The BF16 stand-in's measured curve rises in steps (4 tokens cost 166 ms, 5 the same): the
    fourth token alone costs a step up, which judged by itself stopped code drafts at 2 tokens where
    every one was accepted. Judged with the tokens after it, the draft runs on."""
    stair = [93.0, 123.0, 135.0, 166.0, 166.0, 186.0, 206.0, 234.0, 218.0, 222.0, 239.0, 244.0]
    p = planner(cap=8, draft_ms=16.0, curve=stair)
    teach_draft(p, 0.95)
    assert drafted_length(p, [0.93] * 8, 8) >= 4


def test_go_on_follows_the_verify_curve_and_leaves_fixed_modes_and_probes_alone():
    conf = [0.85] * 8
    medium = [100.0 * (1 + 0.4 * i) for i in range(17)]  # each verified token 0.4 of a step: drafts pay, less
    flat, steeper = planner(cap=8, draft_ms=15.0, curve=FLAT), planner(cap=8, draft_ms=15.0, curve=medium)
    for p in (flat, steeper):
        teach_draft(p, 0.95)
    # where each verified token costs more, the same draft stops sooner
    assert 1 <= drafted_length(steeper, conf, 8) < drafted_length(flat, conf, 8)
    sd = planner(cap=3, menu="sd")
    assert sd.go_on(sd.plan(Offer(room=16, draft=True))) is None       # sd drafts its k, as llama.cpp does
    p = planner(cap=8, curve=FLAT)
    from ssd_edge.planning.planner import Decision
    assert p.go_on(Decision("draft", 3, 0.0)) is None                  # a probe (rate 0) drafts its length


def test_k_min_tokens_are_drafted_before_the_rule_may_stop():
    p = planner(cap=8, draft_ms=15.0, curve=FLAT, k_min=3)
    teach_draft(p, 0.8)
    assert drafted_length(p, [0.01] * 8, 8) == 3


def test_a_draft_reads_an_ngram_copy_as_its_guess_where_that_saves_steps():
    """An n-gram copy the target is likely to take is likely the draft's own next tokens too: read in
    the batch with the draft's first row, each guessed token the draft draws saves it a step. The plan
    asks for the guess only where those steps outweigh the rows it reads."""
    draft_curve = [20.0 + 2.0 * i for i in range(16)]  # a row more in a batch: a tenth of a step

    def guessing(copy_rate: float) -> Planner:
        p = Planner(MENUS["auto"], Costs(FLAT, draft_curve), draft_cap=8, ngram_cap=16)
        p.prefilled = True
        teach_draft(p, 0.97)
        for rates in p.ngram_alpha:
            for r in rates:
                for i in range(20):
                    r.add(1.0 if (i * 37 % 100) / 100 < copy_rate else 0.0)
        return p

    sure = guessing(0.8).plan(Offer(16, remaining=200, ngram=16, draft=True))
    assert sure.kind == "draft" and sure.m > 4 and sure.guess == sure.m - 1  # every row the planned draft uses
    assert guessing(0.8).plan(Offer(16, remaining=200, draft=True)).guess == 0  # no copy on offer
    assert guessing(0.0).plan(Offer(16, remaining=200, ngram=16, draft=True)).guess == 0  # a copy that never holds


def test_the_rounds_acceptances_are_what_the_estimate_says_after_every_observation():
    """alpha('draft', i) is worked out once between two observe() calls (a round asks for it in its
    plan, the SSD window and the outcome ranking): after every kind of observation it must still be
    the estimate computed afresh, and it must move when an observation moves the estimate."""
    p = planner(cap=8, draft_ms=15.0, curve=FLAT)
    seen = []
    rounds = [("draft", 8, 8, [0.9] * 9), ("plain", 0, 0, [0.99]), ("draft", 8, 2, [0.5] * 3),
              ("prepared", 8, 5, [0.8] * 6), ("ngram", 4, 1, [0.7] * 2)] * 6
    for kind, drafted, accepted, top1 in rounds:
        before = [p.alpha("draft", i) for i in range(10)]  # past the cap too: the deepest one measured
        p.plan(Offer(8, draft=True))  # a round's own questions change nothing alpha reads
        assert [p.alpha("draft", i) for i in range(10)] == before
        p.observe(kind, drafted, accepted, p.costs.target.ms(drafted + 1), top1)
        after = [p.alpha("draft", i) for i in range(10)]
        assert after == [p._alpha("draft", i) for i in range(10)]
        seen.append(after)
    assert len({tuple(a) for a in seen}) > 5  # the estimates moved with the rounds
    assert p.p_accept(8).sum() == pytest.approx(1.0)
