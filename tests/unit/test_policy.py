"""SSD's policy, pure and offline: outcome ranking under the window, budget and
confidence floor; the prespec policy (backup after a miss streak, rollback, SLA cut, window), the
inputs it gives the planner. SSD running in the engine on the fake backend is in
tests/engine/test_ssd.py; the planner in tests/unit/test_planner.py."""

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


def test_sampled_ranking_puts_the_draft_s_coupled_draw_first_and_it_predicts_the_target_s_draw():
    """Sampling: the target's bonus token is its coupled draw (argmax log p + G(seed, position)). Ranked
    by the draft's own coupled order, the first outcome is the draft's draw with that noise, which is the
    target's wherever the two distributions agree, so it is right far more often than q's mode (right
    only as often as the mode is drawn). The probabilities stay q's, reassigned to that order."""
    from ssd_edge.coupling import gumbel_draw

    rng = np.random.default_rng(0)
    mode_right = coupled_right = 0
    n = 400
    for pos in range(n):
        ids = np.arange(100, 108)
        p = rng.dirichlet(np.full(8, 0.7))  # the target's distribution over 8 candidates
        q = 0.9 * p + 0.1 * rng.dirichlet(np.full(8, 0.7))  # a draft close to it
        order = np.argsort(-q, kind="stable")
        c = [Candidates(ids[order], q[order])]
        target_draw = gumbel_draw(ids, p, 7, pos)
        plan = rank_outcomes([], c, np.array([1.0]), fanout=8, min_confidence=0.0, budget_cells=100,
                             cells_per_branch=1, coupled=(7, pos))
        assert plan[0].b == gumbel_draw(ids, q, 7, pos)  # the draft's own coupled draw leads
        assert sorted(o.score for o in plan) == pytest.approx(sorted(q))  # q's probabilities, reordered
        coupled_right += plan[0].b == target_draw
        mode_right += int(ids[order[0]]) == target_draw
    assert coupled_right > 0.85 * n and coupled_right > mode_right + 0.2 * n, (coupled_right, mode_right)


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

def test_policy_offers_the_backup_after_a_miss_streak():
    pol = PrespecPolicy(PrespecConfig(backup_after_misses=2, rollback_after_misses=10))
    pol.observe_lookup("miss", 0.8)
    assert not pol.backup_ready                            # streak 1 < 2
    pol.observe_lookup("miss", 0.8)
    assert pol.backup_ready
    pol.observe_lookup("partial", 0.8)                     # a partial hit ends the streak
    assert not pol.backup_ready


def test_policy_rolls_back_after_misses_and_probes_again():
    pol = PrespecPolicy(PrespecConfig(rollback_after_misses=3, probe_every=5))
    for _ in range(3):
        assert pol.prespec_enabled
        pol.observe_lookup("miss", 0.8)
    assert pol.state == "rolled-back" and not pol.prespec_enabled
    for _ in range(4):
        pol.observe_round(50.0)
        assert not pol.prespec_enabled
    pol.observe_round(50.0)
    assert pol.state == "ssd" and pol.prespec_enabled and pol.miss_streak == 0


def test_policy_sla_cuts_window_then_prespeculation():
    pol = PrespecPolicy(PrespecConfig(sla_ms_per_token=100.0, fanout_min=1, fanout_max=4, probe_every=3))
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
    pol = PrespecPolicy(PrespecConfig(fanout_min=1, fanout_max=6, rollback_after_misses=100))
    start = pol.fanout
    for _ in range(8):
        pol.observe_lookup("hit", 0.3)                     # hits, but a draft that is rarely accepted
    assert pol.fanout == start
    for _ in range(8):
        pol.observe_lookup("hit", 0.9)
    assert pol.fanout > start
    for _ in range(16):
        pol.observe_lookup("miss", 0.9)
    assert pol.fanout == 1


def test_the_snapshot_freezes_what_the_worker_prepares_by():
    pol = PrespecPolicy(PrespecConfig(fanout_min=1, fanout_max=4))
    p = np.array([0.5, 0.25, 0.25])
    snap = pol.snapshot(p, depth=5)
    pol.fanout = 4
    assert snap.fanout == 2 and snap.depth == 5 and snap.p_accept is p
