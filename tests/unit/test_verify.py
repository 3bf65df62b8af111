"""verify_greedy / verify_sampled: edge cases of the acceptance rule on hand-built rows.

The statistical check that the emitted tokens follow the target's distribution
is tests/test_distribution.py; here each case has a known answer.
"""

from __future__ import annotations

import numpy as np
import pytest

from ssd_edge.config import SamplingConfig
from ssd_edge.sampling import probs
from ssd_edge.verify import verify_greedy, verify_sampled

V = 8


def one_hot(i: int, v: int = V) -> np.ndarray:
    out = np.zeros(v)
    out[i] = 1.0
    return out


def rows(*ids: int) -> np.ndarray:
    return np.stack([one_hot(i) for i in ids])


def rand_rows(rng: np.random.Generator, n: int, v: int = V) -> np.ndarray:
    return rng.dirichlet(np.ones(v), size=n)


# ---------------------------------------------------------------- greedy

def test_greedy_k0_emits_the_argmax():
    assert verify_greedy([], [5]) == (0, 5)


def test_greedy_all_accepted_gives_the_bonus():
    assert verify_greedy([1, 2, 3], [1, 2, 3, 7]) == (3, 7)


def test_greedy_first_rejected_gives_the_recovery():
    assert verify_greedy([4, 2, 3], [1, 2, 3, 7]) == (0, 1)


def test_greedy_stops_at_the_first_mismatch():
    # position 2 would match again, but acceptance is a prefix
    assert verify_greedy([1, 9, 3], [1, 2, 3, 7]) == (1, 2)


def test_greedy_needs_one_row_more_than_the_draft():
    with pytest.raises(AssertionError):
        verify_greedy([1, 2], [1, 2])


# ---------------------------------------------------------------- sampled: known outcomes

def test_sampled_k0_samples_the_single_row():
    rng = np.random.default_rng(0)
    p = np.array([[0.0, 0.0, 1.0, 0, 0, 0, 0, 0]])
    assert verify_sampled([], np.empty((0, V)), p, rng) == (0, 2)
    assert verify_sampled([], None, p, rng) == (0, 2)


def test_sampled_all_accepted_when_q_equals_p():
    rng = np.random.default_rng(0)
    for _ in range(200):
        p = rand_rows(rng, 4)
        d = [int(rng.choice(V, p=p[i])) for i in range(3)]
        a, b = verify_sampled(d, p[:3].copy(), p, rng)
        assert a == 3 and p[3, b] > 0  # q(x) <= p(x): always accept; bonus drawn from the last row


def test_sampled_bonus_comes_from_the_last_row():
    rng = np.random.default_rng(0)
    p = np.stack([one_hot(1), one_hot(2), one_hot(6)])
    assert verify_sampled([1, 2], rows(1, 2), p, rng) == (2, 6)


def test_sampled_first_rejected():
    rng = np.random.default_rng(0)
    p = np.stack([one_hot(3), one_hot(2), one_hot(6)])
    for _ in range(50):  # p(d0) = 0: rejected at 0; the residual max(0, p - q) is one-hot at 3
        assert verify_sampled([1, 2], rows(1, 2), p, rng) == (0, 3)


def test_sampled_zero_target_probability_always_rejects():
    """p(x) = 0 must reject whatever q(x) is, and the recovery token is never x."""
    rng = np.random.default_rng(1)
    for qx in (1.0, 0.5, 1e-9):
        for _ in range(300):
            p = rand_rows(rng, 2)
            p[0, 4] = 0.0
            p[0] /= p[0].sum()
            q = rand_rows(rng, 1)
            q[0] *= (1 - qx) / (q[0].sum() - q[0, 4])
            q[0, 4] = qx
            a, b = verify_sampled([4], q, p, rng)
            assert a == 0 and b != 4 and p[0, b] > 0


def test_sampled_zero_draft_probability_always_accepts():
    """q(x) = 0 < p(x) (a token the drafter called impossible): min(1, p/q) = 1, always accepted."""
    rng = np.random.default_rng(2)
    for _ in range(300):
        p = rand_rows(rng, 2)
        q = rand_rows(rng, 1)
        q[0, 5] = 0.0
        q[0] /= q[0].sum()
        assert verify_sampled([5], q, p, rng)[0] == 1


def test_top_k_cutting_the_draft_token_rejects_it():
    """Draft and target see the same top-k, but on different logits: a draft token outside
    the target's top-k has p(x) = 0 and is rejected every time."""
    s = SamplingConfig(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0)
    target_logits = np.array([[5.0, 4.0, 0.0, -1.0, 0, 0, 0, 0], [0.0] * V])
    draft_logits = np.array([[0.0, 4.5, 5.0, -1.0, 0, 0, 0, 0]])
    p, q = probs(target_logits, s), probs(draft_logits, s)
    assert p[0, 2] == 0.0 and q[0, 2] > 0.5
    rng = np.random.default_rng(3)
    for _ in range(200):
        a, b = verify_sampled([2], q, p, rng)
        assert a == 0 and b in (0, 1)
    # token 1 is in both top-2 sets: accepted with probability min(1, p/q)
    acc = np.mean([verify_sampled([1], q, p, rng)[0] for _ in range(20_000)])
    want = min(1.0, p[0, 1] / q[0, 1])
    assert 0.5 < want < 0.9
    assert abs(acc - want) < 5 * np.sqrt(want * (1 - want) / 20_000)


def test_acceptance_rate_is_min_one_p_over_q():
    rng = np.random.default_rng(4)
    p = np.array([[0.1, 0.6, 0.3, 0, 0, 0, 0, 0], one_hot(0)])
    q = np.array([[0.4, 0.2, 0.4, 0, 0, 0, 0, 0]])
    n = 20_000
    for x, want in ((0, 0.25), (1, 1.0), (2, 0.75)):
        acc = np.mean([verify_sampled([x], q, p, rng)[0] for _ in range(n)])
        assert abs(acc - want) <= 5 * np.sqrt(want * (1 - want) / n) + 1e-12, (x, acc, want)


def test_recovery_is_drawn_from_the_residual():
    """After a rejection the token comes from norm(max(0, p - q)): here max(0, p-q) = (0, 0.4, 0, ...)
    on token 1 alone, whatever was drafted."""
    rng = np.random.default_rng(5)
    p = np.array([[0.1, 0.6, 0.3, 0, 0, 0, 0, 0], one_hot(0)])
    q = np.array([[0.4, 0.2, 0.4, 0, 0, 0, 0, 0]])
    outs = [verify_sampled([0], q, p, rng) for _ in range(2000)]
    assert {b for a, b in outs if a == 0} == {1}


# ---------------------------------------------------------------- deterministic drafter (q = None)

def test_deterministic_drafter_accepts_with_probability_p():
    rng = np.random.default_rng(6)
    p = np.array([[0.2, 0.5, 0.3, 0, 0, 0, 0, 0], one_hot(7)])
    n = 20_000
    outs = [verify_sampled([1], None, p, rng) for _ in range(n)]
    acc = np.mean([a for a, _ in outs])
    assert abs(acc - 0.5) < 5 * np.sqrt(0.25 / n)
    # q is one-hot at the drafted token: the residual is p without it
    rejected = np.array([b for a, b in outs if a == 0])
    assert set(rejected.tolist()) == {0, 2}
    frac0 = np.mean(rejected == 0)
    assert abs(frac0 - 0.4) < 5 * np.sqrt(0.24 / len(rejected))
    assert all(b == 7 for a, b in outs if a == 1)


def test_deterministic_drafter_certain_token_is_always_accepted():
    rng = np.random.default_rng(7)
    p = rows(3, 4, 5)
    assert all(verify_sampled([3, 4], None, p, rng) == (2, 5) for _ in range(50))


# ---------------------------------------------------------------- greedy is temperature 0 of the sampled rule

def test_greedy_is_the_temperature_zero_case():
    """With one-hot p (the target's argmax) and one-hot q (the drafted token, or q=None), the
    sampled rule gives exactly verify_greedy's answer, with no randomness involved."""
    rng = np.random.default_rng(8)
    greedy = SamplingConfig(temperature=0.0)
    for _ in range(500):
        k = int(rng.integers(0, 6))
        logits = rng.normal(size=(k + 1, V))
        target_argmax = logits.argmax(axis=1)
        # drafts that agree with the target for a random prefix, then random tokens
        agree = int(rng.integers(0, k + 1))
        d = [int(t) for t in target_argmax[:agree]] + [int(t) for t in rng.integers(0, V, k - agree)]
        want = verify_greedy(d, target_argmax)
        p = probs(logits, greedy)
        q = rows(*d) if k else np.empty((0, V))
        assert verify_sampled(d, q, p, rng) == want
        assert verify_sampled(d, None, p, rng) == want
