"""ThreadChoice (planning/threads.py): live timings decide the target's threads for plain steps. Pure: fed
made-up step times, no clock. The engine-level twin (a fake machine that gets busy mid-generation) is
tests/engine/test_live_threads.py."""

from __future__ import annotations

import pytest

from ssd_edge.planning.threads import (GAP_FIRST, GAP_MAX, GAP_MIN, PROBE_SHARE, SLOW_ROUNDS, SLOWER, LiveThreads, ThreadChoice,
                                     candidates)


def drive(choice: ThreadChoice, ms: dict[int, float], steps: int, per_round: int = 1) -> list[int]:
    """Plain rounds of `per_round` steps until `steps` steps ran; the thread count of each round."""
    ran = []
    while sum(per_round for _ in ran) < steps:
        t = choice.pick()
        choice.observe(t, ms[t], per_round)
        ran.append(t)
    return ran


def test_candidates_are_every_core_one_fewer_and_the_start():
    assert candidates(2, 2) == [2, 1]
    assert candidates(8, 6) == [8, 7, 6]
    assert candidates(1, 1) == [1]


def test_a_steady_machine_keeps_every_core_and_probes_under_the_stated_share():
    choice = ThreadChoice()
    choice.adopt(2, 2)
    ran = drive(choice, {2: 40.0, 1: 65.0}, 200)
    assert ran[0] == 2 and choice.current == 2
    assert ran.count(1) / len(ran) <= PROBE_SHARE
    drive(choice, {2: 40.0, 1: 65.0}, 5000)  # longer: the gap has doubled to its cap
    assert choice.gap == GAP_MAX and choice.probed / choice.steps <= PROBE_SHARE / 2


def test_a_step_that_doubles_at_the_current_count_moves_to_the_faster_within_a_bound():
    choice = ThreadChoice()
    choice.adopt(2, 2)
    drive(choice, {2: 40.0, 1: 65.0}, 3000)  # long quiet: probes are GAP_MAX apart
    busy = {2: 80.0, 1: 45.0}  # a core taken: every core 2x slower, one fewer now the faster
    ran = drive(choice, busy, 12)
    assert choice.current == 1
    assert ran.index(1) <= SLOW_ROUNDS + 1  # seen in SLOW_ROUNDS rounds in a row, then one probe
    quiet = {2: 40.0, 1: 65.0}  # the other work ends: the next probes go back to every core
    ran = drive(choice, quiet, 4 * GAP_MIN)
    assert choice.current == 2 and ran[-1] == 2


def test_a_new_choice_checks_its_prior_within_a_few_steps():
    choice = ThreadChoice()
    choice.adopt(2, 2)  # a profile said every core; another program holds one from the start
    ran = drive(choice, {2: 90.0, 1: 45.0}, 40)
    assert ran.index(1) == GAP_FIRST and choice.current == 1 and set(ran[GAP_FIRST:GAP_FIRST + GAP_MIN]) == {1}


def test_a_probe_within_the_margin_does_not_switch():
    choice = ThreadChoice()
    choice.adopt(2, 2)
    drive(choice, {2: 40.0, 1: 38.0}, 1000)  # one fewer barely faster (5% < MARGIN): noise, stay
    assert choice.current == 2


def test_the_first_generation_starts_at_the_prior_and_later_ones_keep_what_was_learnt():
    choice = ThreadChoice()
    choice.adopt(1, 2)  # a profile's split said 1 (measured while the machine was busy)
    ran = drive(choice, {2: 40.0, 1: 65.0}, GAP_FIRST + 2)
    assert choice.current == 2 and ran[GAP_FIRST] == 2  # the first probe, soon, found every core faster
    choice.adopt(1, 2)  # the next generation's prior is the same stale 1: the live choice stands
    assert choice.current == 2 and choice.pick() == 2


@pytest.mark.parametrize("beside", [False, True])
def test_live_threads_sets_plain_rounds_at_the_pick_and_other_rounds_by_the_split(beside):
    used = []
    choice = ThreadChoice()
    split = (1, 1) if beside else (2, 2)
    choice.adopt(split[0], 2)
    live = LiveThreads(choice, split, beside, lambda t, d: used.append((t, d)))
    choice.current = 2 if beside else 1
    assert live.before(plain=True) == ((2, 1) if beside else (1, 1))  # a draft beside keeps its own cores
    assert live.before(plain=False) == ((1, 1) if beside else (1, 1))
    assert used[-1] == live.now


def test_without_a_choice_the_split_stands():
    live = LiveThreads(None, (2, 2), False, lambda t, d: pytest.fail("nothing to set"))
    assert live.before(plain=True) == (2, 2)
    live.after((2, 2), 3, 120.0)


def test_slower_is_a_real_change_not_noise():
    assert SLOWER >= 1.3  # a step 30% slower than when compared is within a shared machine's noise


def test_one_stray_slow_round_does_not_set_off_a_probe():
    choice = ThreadChoice()
    choice.adopt(2, 2)
    drive(choice, {2: 40.0, 1: 65.0}, 3000)
    gap, probed = choice.gap, choice.probed
    for ms in (40.0, 200.0, 40.0, 41.0, 150.0, 40.0):  # a page fault, another program's burst: not a change
        assert choice.pick() == 2
        choice.observe(2, ms, 1)
    assert choice.gap == gap and choice.probed == probed


def test_a_switch_won_on_a_moments_interference_goes_back_within_a_few_rounds():
    choice = ThreadChoice()
    choice.adopt(2, 2)
    drive(choice, {2: 80.0, 1: 45.0}, 100)  # a busy core: one thread
    assert choice.current == 1
    while choice.pick() == 1:  # up to the next probe of every core
        choice.observe(1, 45.0, 1)
    choice.observe(2, 30.0, 1)  # the probe won: the busy loop was off its core that moment
    assert choice.current == 2
    ran = drive(choice, {2: 80.0, 1: 45.0}, 6)  # but every core is slow again
    assert choice.current == 1 and ran.index(1) <= SLOW_ROUNDS


def test_the_count_left_is_remembered_by_its_best_recent_round():
    choice = ThreadChoice()
    choice.adopt(2, 2)
    drive(choice, {2: 80.0, 1: 45.0}, 100)
    for ms in (60.0, 50.0, 70.0):  # one thread's rounds of late: the best 50 ms, the average higher
        choice.observe(1, ms, 1)
    assert min(choice.last) == 50.0 and choice.recent[1].value > 50.0
    choice.since = choice.gap  # a probe is due
    assert choice.pick() == 2
    choice.observe(2, 30.0, 1)
    assert choice.left == (1, 50.0)
