"""SSD's policy, pure and offline: outcome ranking under the window, budget and
confidence floor; the prespec policy (backup after a miss streak, rollback, SLA cut, window), the
inputs it gives the planner. SSD running in the engine on the fake backend is in
tests/engine/test_ssd.py; the planner in tests/unit/test_planner.py."""

from __future__ import annotations

import numpy as np
import pytest

from ssd_edge.config import PrespecConfig
from ssd_edge.speculation.drafters import Candidates
from ssd_edge.speculation.policy import PrespecPolicy, TreeChoice
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
    # the tree: each acceptance length's likeliest outcome first, then the second guesses, each by score
    assert [(o.a, o.b) for o in plan] == [(2, 11), (1, 9), (0, 7), (2, 12), (1, 10), (0, 8)]
    assert plan[0].score == pytest.approx(0.7 * 0.7)
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


def test_the_default_floor_lets_a_tree_hold_every_acceptance_length():
    """A greedy round of the priced 1.5B table as the planner prices it: each rejection length at P(a) near
    0.007 (its acceptance estimate is surer than the counts: about 0.04 each), the draft's runner-up 0.7 of
    what its drafted token leaves. A tree as wide as the lengths holds a branch for each under the default
    floor; the floor of 0.02 it replaced kept the rejections out, and a rejection outcome hits about half
    the time where it is ranked (docs/performance.md, "A tree with every acceptance length")."""
    k = 8
    draft = list(range(100, 100 + k))
    c = [cands((t, 0.99), (200 + t, 0.007), (300 + t, 0.003)) for t in draft] + [cands((900, 0.9), (901, 0.1))]
    p_a = np.array([0.007] * k + [1.0 - 0.007 * k])
    ranked = lambda floor: rank_outcomes(draft, c, p_a, fanout=k + 1, min_confidence=floor,  # noqa: E731
                                         budget_cells=(k + 1) * k, cells_per_branch=k)
    assert sorted(o.a for o in ranked(PrespecConfig().min_confidence)) == list(range(k + 1))
    assert {o.a for o in ranked(0.02)} == {k}  # all accepted alone (its bonus token and a second guess)


# ---------------------------------------------------------------- policy

def test_policy_offers_the_backup_after_a_miss_streak():
    pol = PrespecPolicy(PrespecConfig(backup_after_misses=2, rollback_after_misses=10))
    pol.observe_lookup("miss")
    assert not pol.backup_ready                            # streak 1 < 2
    pol.observe_lookup("miss")
    assert pol.backup_ready
    pol.observe_lookup("partial")                 # a partial hit ends the streak
    assert not pol.backup_ready


def test_policy_rolls_back_after_misses_and_probes_again():
    pol = PrespecPolicy(PrespecConfig(rollback_after_misses=3, probe_every=5))
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


def test_policy_window_starts_whole_shrinks_on_unfinished_branches_and_grows_on_outcomes_it_left_out():
    pol = PrespecPolicy(PrespecConfig(fanout_min=1, fanout_max=6, rollback_after_misses=100))
    assert pol.fanout == 6  # the whole tree from the first round
    for _ in range(8):
        pol.observe_lookup("hit")
    assert pol.fanout == 6
    pol.observe_lookup("partial")                # a branch found unfinished: too wide to finish in time
    pol.observe_lookup("miss", "not-ready")      # a ranked outcome whose branch was never begun: the same
    assert pol.fanout == 4
    for _ in range(16):
        pol.observe_lookup("partial")
    assert pol.fanout == 1
    pol.observe_lookup("miss", "wrong-count")    # an accepted count the window did not hold
    pol.observe_lookup("miss", "wrong-token")    # a count it held, with another next token
    assert pol.fanout == 3
    pol.observe_lookup("miss", "off-path")       # says nothing of the window
    assert pol.fanout == 3


def test_tree_choice_keeps_the_faster_and_tries_the_other_now_and_then():
    pol = PrespecPolicy(PrespecConfig(rollback_after_misses=100))
    tree = pol.tree

    def block(ms_per_token: float) -> None:
        for _ in range(TreeChoice.BLOCK):
            pol.observe_round(ms_per_token, 4)

    assert not tree.on            # the likeliest branch alone first
    block(1.0)                    # 1 token a ms
    assert tree.on                # the tree is timed next
    block(2.0)                    # 0.5 tokens a ms
    arms = []
    for _ in range(2 * TreeChoice.EXPLORE):
        arms.append(tree.on)
        block(2.0 if tree.on else 1.0)
    assert arms.count(True) == 2 and arms.count(False) == 2 * TreeChoice.EXPLORE - 2  # explored, not kept
    tree.rate = {True: 1.02, False: 1.0}  # faster by less than the margin: not worth its risk
    block(1.0)
    assert not tree.on or tree.blocks % TreeChoice.EXPLORE == 0
    tree.rate = {True: 1.5, False: 1.0}
    block(1.0 / 1.5 if tree.on else 1.0)
    assert tree.on or tree.blocks % TreeChoice.EXPLORE == 0
    pol.state = "rolled-back"
    before = dict(tree.rate)
    block(0.1)                    # rounds with pre-speculation off time neither
    assert tree.rate == before


def test_the_snapshot_freezes_what_the_worker_prepares_by():
    pol = PrespecPolicy(PrespecConfig(fanout_min=1, fanout_max=4))
    p = np.array([0.5, 0.25, 0.25])
    pol.fanout = 2
    snap = pol.snapshot(p, depth=5, width=3, short=2)
    pol.fanout = 4
    assert snap.fanout == 2 and snap.depth == 5 and snap.p_accept is p
    assert snap.width == 2 and snap.short == 2  # the width within the window


def test_the_branch_room_is_sized_from_the_draft_length():
    """A branch for every acceptance length of the longest draft, k cells each: auto's 8 by default,
    --draft-max where given; what the user sets is kept."""
    from ssd_edge.config import DRAFT_CAP, EngineConfig

    default = EngineConfig.build(target=dict(path="t.gguf"))
    assert (default.prespec.fanout_max, default.prespec.budget_cells) == (DRAFT_CAP + 1, (DRAFT_CAP + 1) * DRAFT_CAP)
    k3 = EngineConfig.build(target=dict(path="t.gguf"), spec=dict(k=3))
    assert (k3.prespec.fanout_max, k3.prespec.budget_cells) == (4, 12)
    given = EngineConfig.build(target=dict(path="t.gguf"), spec=dict(k=16), prespec=dict(budget_cells=40))
    assert (given.prespec.fanout_max, given.prespec.budget_cells) == (17, 40)
    assert EngineConfig.build(**given.model_dump()).prespec == given.prespec  # sized once: a copy keeps it


def test_a_quiet_worker_grows_the_tree_untimed_and_its_rounds_leave_the_timing_alone():
    """Where the worker costs the verify nothing to speak of (a GPU target), the tree is wanted whatever
    the timing found, and those rounds are not timed as either choice; on shared cores, the timed choice."""
    pol = PrespecPolicy(PrespecConfig(rollback_after_misses=100))
    tree = pol.tree
    assert not tree.on and tree.wanted(quiet=True)
    for _ in range(3 * TreeChoice.BLOCK):
        pol.observe_round(0.5, 4)
    assert tree.rate == {True: None, False: None} and tree.blocks == 0
    assert not tree.wanted(quiet=False)  # timed from here: the likeliest branch alone first
    for _ in range(TreeChoice.BLOCK):
        pol.observe_round(1.0, 4)
    assert tree.rate[False] == 1.0 and tree.on  # one token a ms, alone: the tree is timed next
