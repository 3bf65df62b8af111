"""Greedy losslessness on the small pair: sd, lookup, ssd and ssd's budget variants
give ar's tokens on every prompt of tests/prompts.py, with no near-tie allowed
(its batched and one-token logits are bitwise equal); and the tie diagnosis that
the Qwen group relies on is itself checked here: the replay reproduces whole
runs, and a fabricated difference fails. The machinery and the rules are in
tests/lossless_check.py; the Qwen pair is tests/default_pair/test_lossless_qwen.py."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import make_engine
from lossless_check import (FIRST_RUNS, FULL, FULL_MAX_NEW, MODES, Plan, Run, ar_runs_for, check_mode,
                            check_replay_reproduces, diagnose, first_difference, generate, replay, report_ties)
from prompts import PROMPTS

# Every mode on every prompt, at half the release length: the draft (28 of the target's 30 blocks) costs
# nearly a target step per token, so sd and ssd took 130-140 s each at 128 tokens on a loaded 2-core machine.
SMALL = Plan(tuple(MODES), tuple(PROMPTS), FULL_MAX_NEW // 2)


@pytest.fixture(scope="module")
def plan(request) -> Plan:
    return FULL if request.config.getoption("full") else SMALL


@pytest.fixture(scope="module")
def small(small_pair, plan):
    eng = make_engine(small_pair)
    yield eng, ar_runs_for(eng, plan)
    eng.close()


@pytest.mark.real
def test_prompts_run_long_enough(small, plan):
    _, ar_runs = small
    assert len(PROMPTS) >= 10 and {p.kind for p in PROMPTS} == {"code", "prose", "chat"}
    total = sum(len(r.out) for r in ar_runs.values())
    assert total >= 0.6 * plan.max_new * len(plan.prompts), {k: len(r.out) for k, r in ar_runs.items()}


@pytest.mark.real
@pytest.mark.timeout(1800)  # the ar runs of the module fixture count here too (pytest-timeout includes setup)
@pytest.mark.parametrize("label", list(MODES))
def test_greedy_lossless_small_pair(small, plan, label):
    engine, ar_runs = small
    tally = check_mode(engine, label, ar_runs, plan, max_tie_rate=0.0)
    if label == "ssd":
        assert tally.prespec.get("hits", 0) + tally.prespec.get("partial_hits", 0) > 0, tally.prespec
    if label == "ssd-budget4":
        assert tally.prespec.get("misses", 0) > 0, tally.prespec


@pytest.mark.real
def test_replay_reproduces_whole_runs(small, plan):
    """Guards the tie diagnosis: replaying recorded rounds gives back every token of ar and sd runs."""
    engine, ar_runs = small
    p = PROMPTS[0]
    check_replay_reproduces(engine, ar_runs[p.name])
    sd = FIRST_RUNS.get((id(engine), "sd", p.name)) or generate(engine, ar_runs[p.name].prompt, "sd", plan.max_new)
    check_replay_reproduces(engine, sd)


@pytest.mark.real
def test_tie_diagnosis_rejects_a_real_difference(small):
    """A fabricated speculative run whose token differs from ar's must fail the diagnosis, even where
    the two candidates are close: the replay shows its row's argmax is not the token it claims."""
    engine, ar_runs = small
    ar = ar_runs[PROMPTS[0].name]
    rows = replay(engine, ar, list(range(len(ar.out))))
    margins = {i: float(np.sort(r)[-1] - np.sort(r)[-2]) for i, r in rows.items()}
    i = min(margins, key=margins.get)  # the closest call in the run
    runner_up = int(np.argsort(rows[i])[-2])
    fake = Run(ar.prompt, ar.out[:i] + [runner_up] + ar.out[i + 1:], ar.rounds, ar.stop_reason, ar.stats)
    assert first_difference(ar, fake) == i
    with pytest.raises(AssertionError, match="not lossless"):
        diagnose(engine, ar, fake, i, "fabricated")


def teardown_module() -> None:
    report_ties()
