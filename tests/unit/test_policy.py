"""SSD's policy, pure and offline: outcome ranking under the window, budget and
confidence floor; the prespec policy (backup switch, rollback, SLA cut, window);
fixed ssd's round planning (plan_round) on a CPU cost curve. SSD running in the engine on the fake
backend is in tests/engine/test_ssd.py; mode auto's planner in tests/unit/test_planner.py."""

from __future__ import annotations

import numpy as np
import pytest

from ssd_edge.config import PrespecConfig
from ssd_edge.speculation.drafters import Candidates
from ssd_edge.speculation.policy import PrespecPolicy
from ssd_edge.speculation.prespec import rank_outcomes


def cands(*pairs: tuple[int, float]) -> Candidates:
    ids, ps = zip(*pairs)
    return Candidates(np.array(ids), np.array(ps, dtype=float))


# ---------------------------------------------------------------- ranking

def test_rank_excludes_the_rejected_draft_token_and_orders_by_probability():
    draft = [5, 6]
    c = [cands((5, 0.9), (7, 0.06), (8, 0.04)),   # position 0: drafted 5
         cands((6, 0.5), (9, 0.3), (10, 0.2)),    # position 1: drafted 6
         cands((11, 0.7), (12, 0.3))]             # bonus position
    p_a = np.array([0.1, 0.2, 0.7])               # P(a = 0, 1, 2)
    plan = rank_outcomes(draft, c, p_a, fanout=10, min_confidence=0.0, budget_cells=100, cells_per_branch=2)
    assert (0, 5) not in [(o.a, o.b) for o in plan] and (1, 6) not in [(o.a, o.b) for o in plan]
    scores = [o.score for o in plan]
    assert scores == sorted(scores, reverse=True)
    assert (plan[0].a, plan[0].b) == (2, 11) and plan[0].score == pytest.approx(0.7 * 0.7)
    # a < k: b's probability is renormalised without the drafted token: 0.06 / (1 - 0.9)
    by_key = {(o.a, o.b): o.score for o in plan}
    assert by_key[(0, 7)] == pytest.approx(0.1 * 0.6)
    assert by_key[(1, 9)] == pytest.approx(0.2 * 0.6)


@pytest.mark.parametrize("budget,fanout,floor,expected", [
    (100, 2, 0.0, 2),   # the window caps it
    (5, 10, 0.0, 2),    # 5 cells / 2 per branch -> 2 branches
    (1, 10, 0.0, 0),    # not even one branch fits
    (100, 10, 0.22, 2), # only outcomes scoring >= 0.22: 0.8*0.5 and 0.8*0.3
])
def test_rank_respects_window_budget_and_confidence(budget, fanout, floor, expected):
    c = [cands((5, 0.5), (7, 0.5)), cands((11, 0.5), (12, 0.3), (13, 0.2))]
    plan = rank_outcomes([5], c, np.array([0.2, 0.8]), fanout=fanout, min_confidence=floor,
                         budget_cells=budget, cells_per_branch=2)
    assert len(plan) == expected
    assert len(plan) * 2 <= budget


# ---------------------------------------------------------------- policy

def test_policy_backup_after_miss_streak_only_when_predicted_faster():
    pol = PrespecPolicy(PrespecConfig(backup_after_misses=2, rollback_after_misses=10), k=4)
    pol.costs.verify_ms.value, pol.costs.draft_step_ms.value = 100.0, 50.0
    pol.ngram_accept.value = 0.5
    pol.observe_lookup("miss")
    assert not pol.use_backup(ngram_len=4, k=4)            # streak 1 < 2
    pol.observe_lookup("miss")
    assert pol.use_backup(ngram_len=4, k=4)                # n-gram free, draft costs 200 ms
    assert not pol.use_backup(ngram_len=0, k=4)            # nothing to propose
    pol.costs.draft_step_ms.value = 1.0                    # drafting nearly free: JIT wins
    assert not pol.use_backup(ngram_len=4, k=4)


def test_policy_rolls_back_after_misses_and_probes_again():
    pol = PrespecPolicy(PrespecConfig(rollback_after_misses=3, probe_every=5), k=4)
    for _ in range(3):
        assert pol.prespec_enabled
        pol.observe_lookup("miss")
    assert pol.state == "rolled-back" and not pol.prespec_enabled
    for _ in range(4):
        pol.observe_round(50.0)
        assert not pol.prespec_enabled
    pol.observe_round(50.0)
    assert pol.state == "ssd" and pol.prespec_enabled and pol.miss_streak == 0


def test_policy_sla_cuts_window_then_prespeculation():
    pol = PrespecPolicy(PrespecConfig(sla_ms_per_token=100.0, fanout_min=1, fanout_max=4, probe_every=3), k=4)
    pol.fanout = 4
    pol.observe_round(50.0)
    assert pol.fanout == 4 and pol.state == "ssd"
    for _ in range(3):
        pol.observe_round(400.0)
    assert pol.fanout == 1 and pol.state == "sla-cut"
    for _ in range(3):
        pol.observe_round(10.0)
    assert pol.state == "ssd"


def test_policy_window_grows_with_hits_and_shrinks_with_misses():
    pol = PrespecPolicy(PrespecConfig(fanout_min=1, fanout_max=6, rollback_after_misses=100), k=4)
    start = pol.fanout
    for _ in range(8):
        pol.observe_verify(4, 4, "draft")
        pol.observe_lookup("hit")
    assert pol.fanout > start
    for _ in range(16):
        pol.observe_lookup("miss")
    assert pol.fanout == 1


CPU_CURVE = [163.0, 268.0, 338.0, 259.0, 368.0]  # ms of a 1..5-token target decode, measured on this project's CPU


def _policy(alpha: float, curve=CPU_CURVE, draft_step: float = 85.0) -> PrespecPolicy:
    pol = PrespecPolicy(PrespecConfig(), k=3, step_ms=curve[0] if curve else None, verify_curve=curve)
    for a in pol.alpha:
        a.value = alpha
    pol.costs.draft_step_ms.value = draft_step
    return pol


def test_plan_round_on_a_cpu_curve_verifies_nothing_or_a_batch_of_four():
    assert _policy(0.95).plan_round(ready=3, k=3) == 3      # prepared and likely: verify all
    assert _policy(0.95).plan_round(ready=0, k=3) == 3      # likely enough to draft all just in time
    assert _policy(0.3).plan_round(ready=3, k=3) == 0       # unlikely: one plain step beats any batch
    assert _policy(0.6).plan_round(ready=0, k=3) == 0       # drafting 3 first costs more than it brings
    assert _policy(0.6).plan_round(ready=3, k=3) == 3       # ... but free drafts in a 1.6-step batch pay
    # 2 tokens cost more than 4 on this curve: never verify 1 or 2 when 3 are ready
    assert all(_policy(a).plan_round(ready=3, k=3) in (0, 3) for a in (0.1, 0.4, 0.5, 0.7, 0.9))


def test_plan_round_without_a_curve_is_flat_until_a_step_is_timed():
    pol = _policy(0.5, curve=None)
    pol.observe_costs(0, 40.0, None)                        # a plain step timed, no verify yet:
    assert pol.plan_round(ready=0, k=3) == 3                # draft k, so that a verify gets timed
    pol = _policy(0.5, curve=None)
    pol.observe_costs(3, 100.0, None)                       # a verify took 100 ms, no plain step timed
    assert pol.plan_round(ready=3, k=3) == 3                # flat: more tokens per verify is free
    pol.observe_costs(0, 40.0, None)                        # a plain step took 40 ms, a verify 100
    assert pol.plan_round(ready=0, k=3) == 0


def test_outcome_probabilities_sum_to_one_and_follow_acceptance():
    pol = PrespecPolicy(PrespecConfig(), k=3)
    for a in pol.alpha:
        a.value = 0.5
    p = pol.outcome_probs(3)
    assert p.sum() == pytest.approx(1.0)
    assert p == pytest.approx([0.5, 0.25, 0.125, 0.125])


# ---------------------------------------------------------------- the engine on a fake backend
