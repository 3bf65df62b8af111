"""The oracle bound's arithmetic (bench/bound.py): plain numbers, no models."""

import json
import random

import pytest

from ssd_edge.bench.bound import Prices, PromptBound, best_ms, fixed_sd_ms, runs, summarize, write_result

FLAT = Prices(target=lambda n: 100.0 + 5.0 * (n - 1), draft=lambda n: 10.0 + 2.0 * (n - 1))   # memory-bound
STEEP = Prices(target=lambda n: 100.0 * n, draft=lambda n: 10.0 * n)                          # compute-bound


def test_runs_count_agreement_ahead():
    assert runs([True, True, False, True]) == [2, 1, 0, 1]
    assert runs([]) == []


def test_nothing_to_propose_is_plain_steps():
    ms, rounds = best_ms(10, FLAT, draft_runs=None, ngram=None)
    assert ms == pytest.approx(1000.0) and rounds == {"plain": 10}


def test_a_right_copy_is_verified_whole_where_verifying_is_cheap():
    n = 34  # two rounds of 16 copied tokens and the target's own next one
    ms, rounds = best_ms(n, FLAT, draft_runs=None, ngram=[(16, min(16, n - i - 1)) for i in range(n)])
    assert rounds == {"ngram": 2} and ms == pytest.approx(2 * FLAT.target(17))


def test_on_a_steep_curve_nothing_beats_plain_steps():
    n = 20
    perfect = [(16, min(16, n - i - 1)) for i in range(n)]
    ms, _ = best_ms(n, STEEP, draft_runs=[n] * n, ngram=perfect)
    assert ms == pytest.approx(n * STEEP.target(1))


def test_a_draft_that_is_never_right_is_never_used():
    ms, rounds = best_ms(12, FLAT, draft_runs=[0] * 12, ngram=None)
    assert rounds == {"plain": 12}


def test_a_draft_catches_up_on_what_it_missed():
    # one token made by the n-gram copy (plain would do as well), then a draft of 1 that must read 2 tokens
    prices = Prices(target=lambda n: {1: 100.0, 2: 101.0, 3: 300.0}[n], draft=lambda n: 7.0 * n)
    ms, rounds = best_ms(4, prices, draft_runs=[0, 0, 1, 0], ngram=[(1, 1), (0, 0), (0, 0), (0, 0)], draft_cap=1,
                         ngram_cap=1)
    # ngram 1 (commits 2, draft 2 behind), draft 1 reading 3 (commits 2): 101 + 21 + 101
    assert rounds == {"ngram": 1, "draft": 1} and ms == pytest.approx(223.0)


def _brute(i, u, n, prices, draft_runs, ngram, dcap, ncap):
    """Every sequence of rounds, tried (what best_ms must equal)."""
    if i >= n:
        return 0.0
    best = prices.target(1) + _brute(i + 1, u + 1, n, prices, draft_runs, ngram, dcap, ncap)
    for m in range(1, min(ngram[i][0], ncap, n - i - 1) + 1):
        a = min(ngram[i][1], m)
        best = min(best, prices.target(m + 1) + _brute(i + a + 1, u + a + 1, n, prices, draft_runs, ngram, dcap, ncap))
    for k in range(1, min(dcap, n - i - 1) + 1):
        a = min(draft_runs[i], k)
        t = prices.draft(u + 1) + (k - 1) * prices.draft(1) + prices.target(k + 1)
        best = min(best, t + _brute(i + a + 1, int(a == k), n, prices, draft_runs, ngram, dcap, ncap))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_the_bound_is_the_best_of_every_plan(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 8)
    agree = [rng.random() < 0.7 for _ in range(n)]
    ngram = []
    for i in range(n):
        proposed = rng.choice([0, 1, 2, 3, 4])
        ngram.append((proposed, min(proposed, rng.randint(0, 3), n - i - 1)))
    prices = rng.choice([FLAT, STEEP])
    ms, _ = best_ms(n, prices, draft_runs=runs(agree), ngram=ngram, draft_cap=3, ngram_cap=3)
    assert ms == pytest.approx(_brute(0, 0, n, prices, runs(agree), ngram, 3, 3))


def test_fixed_sd_drafts_k_each_round():
    # 9 tokens, k = 3, always right: rounds commit 4, 4, then the last token's round drafts 0
    ms = fixed_sd_ms(9, FLAT, [9 - i for i in range(9)], 3)
    assert ms == pytest.approx(2 * (3 * FLAT.draft(1) + FLAT.target(4)) + FLAT.target(1))


def _bound(pid: str, category: str, x: float) -> PromptBound:
    return PromptBound(pid, category, prompt_tokens=30, tokens=64, prompt_read_ms=100.0, step_ms=80.0,
                       verify4_ms=150.0, draft_step_ms=14.0, bound_x=x, draft_only_x=x, ngram_only_x=1.0,
                       sd3_x=x / 2, rounds={"draft": 10})


def test_the_summary_is_the_geometric_mean_per_category():
    s = summarize([_bound("a", "code", 1.0), _bound("b", "code", 4.0), _bound("c", "prose", 1.5)])
    assert s == {"code": {"bound_x": 2.0, "draft_only_x": 2.0, "ngram_only_x": 1.0, "sd3_x": 1.0},
                 "prose": {"bound_x": 1.5, "draft_only_x": 1.5, "ngram_only_x": 1.0, "sd3_x": 0.75}}


def test_the_json_after_each_prompt_says_whether_more_were_to_come(tmp_path):
    out = tmp_path / "sub" / "bound.json"
    done = [_bound("a", "code", 2.0)]
    write_result(out, ["python", "-m", "ssd_edge.bench.bound"], 2, done, complete=False)
    partial = json.loads(out.read_text())
    assert partial["complete"] is False and [p["id"] for p in partial["prompts"]] == ["a"]
    assert partial["summary"]["code"]["bound_x"] == 2.0
    done.append(_bound("b", "prose", 1.2))
    write_result(out, ["python"], 2, done, complete=True)
    final = json.loads(out.read_text())
    assert final["complete"] is True and [p["id"] for p in final["prompts"]] == ["a", "b"]
    assert not list(out.parent.glob("*.tmp"))  # written whole, then moved into place
