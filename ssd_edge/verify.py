"""Lossless verification of a draft against the target: pure functions on numpy.

Given k draft tokens d[0..k-1], the draft distributions q[0..k-1] they were
sampled from, and the target's k+1 distributions p[0..k] (p[i] is the target's
distribution for the position of d[i]; p[k] the one after the last draft
token), return (a, b): the number of draft tokens accepted and the token the
target emits next (recovery token if a < k, bonus token if a == k).

The output of (accepted prefix, b) is distributed exactly as k+1 steps of
sampling from the target alone (Leviathan et al. 2023; Chen et al. 2023).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .sampling import sample


def verify_greedy(draft: Sequence[int], target_argmax: Sequence[int]) -> tuple[int, int]:
    """Temperature 0: accept while the draft token is the target's argmax."""
    k = len(draft)
    assert len(target_argmax) == k + 1, "need one target row more than draft tokens"
    a = 0
    while a < k and int(draft[a]) == int(target_argmax[a]):  # p is one-hot: accept iff equal
        a += 1
    return a, int(target_argmax[a])  # recovery (a < k) or bonus (a == k): the argmax either way


def verify_sampled(draft: Sequence[int], q: np.ndarray | None, p: np.ndarray,
                   rng: np.random.Generator) -> tuple[int, int]:
    """Speculative sampling. q=None means a deterministic drafter (q is one-hot at d[i]).

    q: (k, V) float64, p: (k+1, V) float64; rows are probability vectors.
    """
    k = len(draft)
    assert p.shape[0] == k + 1, "need one target row more than draft tokens"
    for i, x in enumerate(draft):
        x = int(x)
        qx = 1.0 if q is None else float(q[i, x])
        px = float(p[i, x])
        # accept x with probability min(1, p(x)/q(x)); q(x) >= p(x) is the only case that can reject
        if px > 0.0 and (qx <= px or rng.random() * qx < px):
            continue
        # rejected: resample from norm(max(0, p - q)); its mass sits where p > q, never on x itself
        if q is None:
            residual = p[i].copy()
            residual[x] = 0.0
        else:
            residual = np.maximum(p[i] - q[i], 0.0)
        total = residual.sum()
        if total <= 0.0:  # p == q up to rounding: any sample from p is exact
            residual = p[i]
        return i, sample(residual, rng)
    return k, sample(p[k], rng)  # all accepted: the bonus token comes from the last target row
