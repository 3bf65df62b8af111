"""Greedy losslessness on the default Qwen pair (1.5B target, 0.5B draft, one
thread each), where batched and one-token logits really differ and near-ties
must be proven (tests/lossless_check.py says how).

By default the modes whose verify paths differ run here: sd, ssd and auto, on
five prompts (2 code, 1 prose, 2 chat) at QWEN.max_new tokens. lookup and ssd's
budget variants (misses, backups, partial hits) go through the same verify path
and run on the small pair only, as does the check that the replay reproduces
whole runs (tests/real/test_lossless.py). `--full` runs every prompt in every
mode at 128 tokens, and the replay check, here too.
"""

from __future__ import annotations

import pytest

from conftest import make_engine
from lossless_check import (FULL, QWEN_MAX_TIE_RATE, ROW_TOL, Plan, ar_runs_for, check_mode, check_whole_runs,
                            report_ties)
from prompts import PROMPTS

# 2 code, 1 prose, 2 chat prompts (the budget prompts among them). Measured with 6 prompts at 96 tokens:
# 1,070 s for this layer on a loaded 2-core machine, most of it proving near-ties (7 in sd alone).
QWEN_NAMES = ("fibonacci", "js_fetch", "lighthouse", "chat_code", "chat_multi")
# (ssd-budget4 ran here too until the suite neared CI's 20 minutes: 62-78 s, covered on the small pair)
QWEN = Plan(("sd", "ssd", "auto"), tuple(p for p in PROMPTS if p.name in QWEN_NAMES), 64)


def pytest_generate_tests(metafunc) -> None:
    if "label" in metafunc.fixturenames:
        plan = FULL if metafunc.config.getoption("full") else QWEN
        metafunc.parametrize("label", plan.labels)


@pytest.fixture(scope="module")
def plan(request) -> Plan:
    return FULL if request.config.getoption("full") else QWEN


@pytest.fixture(scope="module")
def qwen(default_pair, plan):
    eng = make_engine(default_pair)
    yield eng, ar_runs_for(eng, plan)
    eng.close()


@pytest.mark.timeout(1800)  # 1.5B + 0.5B at one thread each; the ar runs of the module fixture count here too
def test_greedy_lossless_default_pair(qwen, plan, label):
    engine, ar_runs = qwen
    check_mode(engine, label, ar_runs, plan, max_tie_rate=QWEN_MAX_TIE_RATE)


@pytest.mark.timeout(1800)
def test_replay_reproduces_whole_runs_default_pair(qwen, plan, request):
    if not request.config.getoption("full"):
        pytest.skip("the replay self-check runs on the small pair; --full runs it on Qwen too")
    engine, ar_runs = qwen
    worst = max(check_whole_runs(engine, ar_runs, p, plan.max_new)[0] for p in plan.prompts[:3])
    assert worst <= ROW_TOL, worst


def teardown_module() -> None:
    report_ties()
