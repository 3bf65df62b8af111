"""The round planner (planner.py) with plain numbers: each proposer wins where it should, costs
are learnt from what is timed, and a draft that fell behind is priced as an investment."""

from __future__ import annotations

import pytest

from ssd_edge.auto.planner import Costs, Offer, Planner, Rate
from ssd_edge.speculation.drafters import NgramDrafter

# A CPU-like target (FIELD_NOTES, 1.5B at 2 threads): 4 tokens cost ~1.6 steps.
CPU_CURVE = [105.0, 150.0, 160.0, 170.0, 220.0]


def planner(k: int = 3, draft_ms: float = 44.0, **kw) -> Planner:
    return Planner(k, verify_curve=CPU_CURVE, draft_ms=draft_ms, **kw)


def teach_draft(p: Planner, alpha_hits: float, rounds: int = 40, confidence: float = 0.9) -> None:
    """Verified draft rounds in which each position is accepted with frequency alpha_hits, the
    target's top-1 probability being `confidence` at each committed position."""
    for r in range(rounds):
        accepted = 0
        for i in range(p.k):  # a deterministic pattern with the wanted per-position rate
            if ((r * 7 + i * 3) % 100) / 100 < alpha_hits:
                accepted += 1
            else:
                break
        p.observe("draft", p.k, accepted, CPU_CURVE[p.k], [confidence] * (accepted + 1))


def test_rate_forgets_old_trials():
    r = Rate(0.5, weight=2.0, keep=0.9)
    for _ in range(100):
        r.add(1.0)
    # about the last 1 / (1 - keep) = 10 trials count, beside the prior's 2: (10 + 2 * 0.5) / 12
    assert r.value == pytest.approx(11 / 12, abs=1e-3)
    for _ in range(100):
        r.add(0.0)
    assert r.value == pytest.approx(1 / 12, abs=1e-3)


def test_costs_use_the_curve_scaled_to_what_is_timed():
    c = Costs(CPU_CURVE, 100.0, 0.25)
    assert c.ms(4) == 170.0
    c.add(1, 210.0)  # this machine is twice as slow as the profile today
    assert c.ms(4) == pytest.approx(340.0)
    assert c.ms(7) == pytest.approx(2 * (220 + 50 * 2))  # beyond the curve: its last slope


def test_one_slow_plain_step_does_not_write_plain_steps_off():
    """A plain step timed slow once (the machine was busy) scales the whole curve, not the plain step
    alone: the plan stays plain (with a per-size estimate the draft would win from then on, and
    plain steps, never chosen again, would never be re-timed). Later readings bring it back."""
    p = planner()
    teach_draft(p, 0.55)  # a draft that does not pay on this curve
    for _ in range(5):
        p.observe("plain", 0, 0, 105.0)
    assert p.plan(Offer(3, draft=True)).kind == "plain"
    p.observe("plain", 0, 0, 400.0)  # clipped to 2x the estimate
    assert p.step_ms() == pytest.approx(105.0 * 1.3)
    assert p.plan(Offer(3, draft=True)).kind == "plain"
    for m in (2, 3, 2, 3, 2, 3):  # other sizes timed as the curve says re-price the plain step too
        p.observe("draft", m, 0, CPU_CURVE[m], [0.5])
    assert p.step_ms() == pytest.approx(105.0, rel=0.05)


def test_costs_without_a_curve_interpolate_the_timed_sizes():
    c = Costs(None, 100.0, 0.25)
    assert c.ms(3) == pytest.approx(150.0)  # the prior line
    c.add(1, 80.0)
    c.add(4, 140.0)
    assert c.ms(2) == pytest.approx(100.0)
    assert c.ms(6) == pytest.approx(140.0 + 80.0 * 0.25 * 2)


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
    ngram = NgramDrafter(2, 2)
    p = planner(ngram=ngram)
    copy, other = [3, 4, 5], [9, 8, 6]
    history = [1, 2] + copy
    last = copy
    for r in range(32):
        history += [100 + r, 1, 2]  # a new token before each [1, 2]: every match is 2 tokens long
        assert p.ask_ngram(history) == tuple(last)  # what followed [1, 2] the last time
        assert p.ngram_match == 2
        # the answer repeats its last continuation every other round: the proposal then matches
        # whole, else it fails at its first token
        last = [copy, copy, other, other][r % 4]
        history += last
        p.observe_history(history)
    first, second, third = (p.alpha("ngram", i) for i in range(3))
    assert first == pytest.approx(0.5, abs=0.1)
    assert second > 0.9 and third > 0.9
    assert p.gain("ngram", 3) == pytest.approx(1 + first + first * second + first * second * third)


def test_ngram_acceptance_is_learnt_per_match_length():
    """Short matches that are coincidences and long ones that are copies: the planner learns the two
    classes apart, so it verifies a long copy's proposal and takes a plain step for a coincidence
    (one acceptance for all would do the wrong thing for one of them)."""
    from ssd_edge.auto.planner import match_class

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
    from ssd_edge.auto.planner import match_class

    p = planner(ngram=NgramDrafter(2, 4))
    quoted = list(range(10, 40))
    history = [1, 2] + quoted + [3] + quoted[:10]
    for n in range(10, 25):  # the answer goes on quoting
        prop = p.ask_ngram(history)
        assert prop and p.ngram_match >= 10
        history.append(quoted[n])
        p.observe_history(history)
    long = p.ngram_alpha[match_class(p.ngram_match)]
    assert long[0].n > 5 and long[0].value > 0.9
    assert all(r.n == 0 for r in p.ngram_alpha[match_class(2)])  # nothing was learnt for short matches


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
    p.draft_cost.add(200, 1500.0)  # reading 200 tokens it missed takes 1.5 s
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


def test_no_draft_model_means_plain_or_ngram_only():
    p = Planner(3, verify_curve=CPU_CURVE)
    assert p.plan(Offer(3)).kind == "plain"
    assert p.plan(Offer(3, ngram=0, draft=False, prepared=None)).m == 0


def test_report_names_every_estimate():
    p = planner()
    p.plan(Offer(3, draft=True))
    rep = p.report()
    assert set(rep) >= {"decisions", "draft_alpha", "ngram_alpha", "step_ms", "verify_ms", "draft_step_ms", "rounds"}
    assert sum(rep["decisions"].values()) == 1
    (kind, m, rate, ru_kind, ru_m, ru_rate), = rep["rounds"]  # why: the choice and the runner-up, in tok/s
    assert kind in ("plain", "draft") and ru_kind != kind and rate >= ru_rate > 0


def test_draft_min_is_never_planned_below():
    p = planner(k_min=2)
    for _ in range(10):  # a perfect n-gram record, whatever the match length
        for rates in p.ngram_alpha:
            for r in rates:
                r.add(1.0)
    assert p.plan(Offer(3, ngram=1)).kind == "plain"  # one n-gram token is below --draft-min 2
    d = p.plan(Offer(3, ngram=3))
    assert d.kind == "ngram" and d.m >= 2


def test_the_worker_prepares_only_where_a_prepared_branch_pays_for_its_contention():
    gpu = planner(contention=1.0)  # a GPU target: the draft beside it costs the verify nothing
    teach_draft(gpu, 0.95)
    assert gpu.prespec_pays(3, verifying=4)
    assert not gpu.prespec_pays(0)
    weak = planner(contention=1.0)
    teach_draft(weak, 0.2, confidence=0.25)
    assert not weak.prespec_pays(3)   # prose: a ready branch would save nothing over plain steps
    shared = planner(contention=1.8)  # cores the two models share: the verify slows by 80%
    teach_draft(shared, 0.95)
    assert not shared.prespec_pays(3, verifying=4)
    # separate cores, a small slowdown: it pays while the prepared branches are found, not after
    separate = planner(contention=1.1)
    teach_draft(separate, 0.95)
    assert separate.prespec_pays(3, verifying=4)
    for _ in range(30):
        separate.observe_lookup(False)
    assert not separate.prespec_pays(3, verifying=4)


def test_a_resting_worker_is_tried_again_as_its_hit_rate_fades_to_the_prior():
    p = planner(contention=1.1)
    teach_draft(p, 0.95)
    for _ in range(30):  # a stretch where nothing the worker prepared was verified
        p.observe_lookup(False)
    assert not p.prespec_pays(3, verifying=4)
    for _ in range(40):  # it rests; plain steps meanwhile
        p.observe("plain", 0, 0, CPU_CURVE[0])
    assert p.hit_rate() == pytest.approx(0.5, abs=0.02)
    assert p.prespec_pays(3, verifying=4)


def test_contention_is_learnt_from_verifies_timed_with_the_worker_busy_and_idle():
    p = planner()  # no profile measurement: the prior
    assert p.contention.value == pytest.approx(1.2)
    for _ in range(20):
        p.observe("plain", 0, 0, 100.0)
        p.observe("plain", 0, 0, 150.0, busy=True)
    assert p.contention.value == pytest.approx(1.5, abs=0.07)  # the prior (2 trials) is still in it
    # a busy verify counts as an idle one divided by the slowdown known then (which lags a little)
    assert p.step_ms() == pytest.approx(100.0, abs=4.0)


