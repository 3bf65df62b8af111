"""Logit rows -> the distributions actually sampled from, on each row's candidates.

A row of a 152k vocabulary is read once (top_ids: in C where ssd_edge.native is built, else numpy)
and everything after works on its top-k candidates: support() is the distribution on the tokens it can
draw, head_probs() the row's 40 likeliest for planning (the draft's candidates, the target's confidence,
--draft-p-min's probability of the likeliest token: over those 40, not the whole row). top-k 0 (off)
reads the whole row in float64, the slow path. probs() scatters a support into a dense row (tests).

The same transform is applied to the target's rows (p) and the draft's rows
(q). What is committed is always a draw from p (coupling.py); q only decides
how often the draft guesses it, so the draft should see the same settings. The
order is llama.cpp's default sampler chain, so flags moved over from llama.cpp
give the same distribution:

    top-k        keep the k largest logits
    top-p        keep the smallest set, by descending probability at temperature 1,
                 whose mass reaches top_p (the token that crosses it included)
    min-p        keep logits >= max logit + log(min_p), i.e. p >= min_p * p_max at temperature 1
    temperature  softmax(logit / temperature) over what is left

Ties at a top-k or top-p boundary keep the lower ids (llama.cpp leaves that
order unspecified). Temperature 0 means greedy: a one-hot vector at the argmax
(ties broken towards the lower id, like numpy.argmax).

Against llama.cpp's own chain (tests/test_sampler_chain.py, on real rows) the
probabilities agree within 1e-6, with one difference, at the top-p boundary:
this module computes top-p's cumulative mass in float64; llama.cpp normalises
with a float32 running sum over every candidate, which over a whole row (top-k
off; SmolLM2's 49,152 tokens) comes out low by up to 2.7e-4, so its nucleus
can stop a few tail tokens earlier (top-p 0.99: 40 of 58 rows, up to 93 tokens,
total variation up to 0.0019; top-p 0.9: 17 of 58). Only tokens whose
preceding mass is within float32 error of top_p are affected. With top-k on
(the default 40) the candidate sets are small and both keep the same tokens.
min_keep (llama.cpp's top-p/min-p argument) is taken as 1, as llama-cpp-python
passes it; 0 and 1 are the same there, and larger values are not offered.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .config import SamplingConfig

try:  # compiled at install where a C compiler is (setup.py); without it the numpy paths do the same
    from .native import head as compiled_head, support as compiled_support, top_ids as compiled_top_ids
except ImportError:  # pragma: no cover - a build without the extension
    compiled_head = compiled_support = compiled_top_ids = None


def native_path() -> str:
    """Which path reads rows and draws tokens here: "c" where ssd_edge.native is built and imports (a
    row's top-k, support and head, coupling's draws, a llama Context's plain steps in one call), "numpy"
    where it is not (the same tokens, slower; mode ar then steps one round at a time)."""
    return "numpy" if compiled_top_ids is None else "c"

_TOP_P_CANDIDATES = 1024  # top-p looks at this many largest first, and the full row only if needed
HEAD = 40  # the largest logits a row's confidence and candidates are read from where sampling sets no top-k
_SAMPLE = 2048  # values top_ids samples from a row to set its threshold


class Support(NamedTuple):
    """A row's sampling distribution on the tokens it can draw: ids ascending, p > 0 summing to 1."""

    ids: np.ndarray  # (m,) int64
    p: np.ndarray    # (m,) float64


def top_ids(x: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest of x, ties at the boundary to the lower ids: those above the k-th
    largest value in ascending order, then those equal to it. One pass over the row, in C where the
    extension is built (ssd_edge/csrc/rows.c: a running threshold, 32 values tested at a time), else in
    numpy: a threshold from a strided sample (about 2,000 values, set so that a few hundred of the row
    pass it), the ids at or above it (a compare and flatnonzero), then a partition of those few. Never a
    sort, a partition or a copy of the whole row, unless the sample missed the head (one full partition)."""
    n = len(x)
    if k >= n:
        return np.arange(n)
    if compiled_top_ids is not None and x.dtype == np.float32 and x.flags.c_contiguous:
        ids = compiled_top_ids(x, k)  # the same ids in one vectorised C pass (ssd_edge/csrc/rows.c); None: ties
        if ids is not None:
            return np.frombuffer(ids, dtype=np.int64)
    return _top_ids_numpy(x, k)


def _top_ids_numpy(x: np.ndarray, k: int) -> np.ndarray:
    """top_ids without the compiled pass (k < len(x))."""
    n = len(x)
    stride = max(1, n // _SAMPLE)
    sample = x[::stride]
    j = min(len(sample), -(-k // stride) + 4)  # each sampled value stands for `stride` of the row
    ids = np.flatnonzero(x >= np.partition(sample, len(sample) - j)[len(sample) - j])
    if len(ids) < k:  # the sample held few of the head: take the k-th largest from the whole row
        ids = np.flatnonzero(x >= x[np.argpartition(-x, k - 1)[:k]].min())
    z = x[ids]
    edge = np.partition(z, len(z) - k)[len(z) - k]  # the k-th largest value
    return np.concatenate([ids[z > edge], ids[z == edge]])[:k]


def support(logits: np.ndarray, s: SamplingConfig) -> Support:
    """The distribution a row is sampled from (llama.cpp's chain, the module docstring), on its
    candidates alone: with top-k on, one float32 pass finds them and the rest is over k numbers (in C
    where the extension is built); top-k off (0) reads the whole row in float64 (the slow path).
    Greedy: the argmax."""
    x = np.asarray(logits)
    if s.greedy:
        return Support(np.array([int(np.argmax(x))]), np.ones(1))
    if (compiled_support is not None and 0 < s.top_k < x.shape[0] and x.dtype == np.float32
            and x.flags.c_contiguous):  # the same steps in C (ssd_edge/csrc/draws.c); None: ties, NaN
        got = compiled_support(x, s.top_k, s.top_p, s.min_p, s.temperature)
        if got is not None:
            return Support(np.frombuffer(got[0], dtype=np.int64), np.frombuffer(got[1], dtype=np.float64))
    return _support_numpy(x, s)


def _support_numpy(x: np.ndarray, s: SamplingConfig) -> Support:
    """support() without the compiled chain (not greedy)."""
    if 0 < s.top_k < x.shape[0]:  # the k largest logits, ties at the boundary to the lower ids
        idx = top_ids(x, s.top_k)
    else:
        idx = np.arange(x.shape[0])
    z = x[idx].astype(np.float64)
    if s.top_p < 1.0:  # at temperature 1: the smallest descending prefix whose mass reaches top_p
        p1 = np.exp(z - z.max())
        p1 /= p1.sum()
        order = _descending(p1)
        cut = int(np.searchsorted(np.cumsum(p1[order]), s.top_p, side="left")) + 1
        keep = np.sort(order[:cut])
        idx, z = idx[keep], z[keep]
    if s.min_p > 0.0:  # p >= min_p * p_max at temperature 1, written on logits as llama.cpp does
        keep = z >= z.max() + np.log(s.min_p)
        idx, z = idx[keep], z[keep]
    z = z / s.temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(idx)
    idx, p = idx[order], p[order]
    nz = p > 0.0  # a far tail at a low temperature underflows: not a token it can draw
    return Support(idx[nz], p[nz]) if not nz.all() else Support(idx, p)


def probs(logits: np.ndarray, s: SamplingConfig) -> np.ndarray:
    """(V,) or (n, V) float logits -> same-shape dense float64 probabilities (support() scattered;
    for tests and reports: the engine works on the support)."""
    x = np.asarray(logits)
    if x.ndim == 2:
        return np.stack([probs(row, s) for row in x]) if len(x) else x.astype(np.float64)
    out = np.zeros(x.shape[0], dtype=np.float64)
    ids, p = support(x, s)
    out[ids] = p
    return out


def head_probs(logits: np.ndarray, temperature: float = 1.0, k: int = HEAD) -> Support:
    """A row's k largest logits at `temperature`, normalised over those k: the likeliest tokens and
    how sure the model is of them, for planning (the draft's candidates, the target's confidence).
    Ids most likely first. Over the head alone, not the whole row: an estimate (the tail's mass is
    left out), calibrated against real acceptance where it is used (planning/planner.py)."""
    x = np.asarray(logits)
    t = max(temperature, 1e-3)
    if compiled_head is not None and k < x.shape[0] and x.dtype == np.float32 and x.flags.c_contiguous:
        got = compiled_head(x, k, t)  # the same in C (ssd_edge/csrc/draws.c); None: ties, NaN
        if got is not None:
            return Support(np.frombuffer(got[0], dtype=np.int64), np.frombuffer(got[1], dtype=np.float64))
    ids = top_ids(x, min(k, x.shape[0]))
    z = x[ids].astype(np.float64) / t
    order = np.lexsort((ids, -z))  # most likely first, ties to the lower id
    ids, z = ids[order], z[order]
    p = np.exp(z - z[0])
    return Support(ids, p / p.sum())


def _descending(p: np.ndarray) -> np.ndarray:
    """Indices of p sorted descending (stable), sorting only the large head when it suffices."""
    if len(p) > 2 * _TOP_P_CANDIDATES:
        head = np.sort(np.argpartition(-p, _TOP_P_CANDIDATES)[:_TOP_P_CANDIDATES])  # ids ascending, so
        head = head[np.argsort(-p[head], kind="stable")]  # ties break towards the lower id, as in the full sort
        if p[head].sum() >= 1.0 - 1e-12:
            return head
    return np.argsort(-p, kind="stable")


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from probability vector p."""
    nz = np.flatnonzero(p)
    if len(nz) == 1:
        return int(nz[0])
    w = p[nz]
    return int(nz[np.searchsorted(np.cumsum(w), rng.random() * w.sum(), side="right").clip(max=len(nz) - 1)])


def reshape_saguaro(q: np.ndarray, top: int, factor: float) -> np.ndarray:
    """SAGUARO sampling: scale q's `top` most likely tokens by `factor` (< 1) and renormalise.

    The draft then samples from the reshaped q', and verification uses the same
    q', so the output is still exactly the target's distribution; the residual
    max(0, p - q') grows on exactly the tokens the pre-speculation cache holds
    recovery branches for, so misses land on prepared branches more often.
    """
    if factor >= 1.0:
        return q
    nz = np.count_nonzero(q)
    if nz <= 1:
        return q
    out = q.copy()
    top_idx = np.argpartition(-q, min(top, nz - 1))[:min(top, nz - 1)]
    out[top_idx] *= factor
    return out / out.sum()


class Heads(NamedTuple):
    """The largest logits of some rows, most likely first (ties to the lower id): all a branch's draft
    step reads of its row, and all a backend that finds candidates where it makes them (a GPU's top-k,
    the priced pair) hands over, instead of whole rows of the vocabulary."""

    ids: np.ndarray     # (n, w) int64
    logits: np.ndarray  # (n, w) float32

    def probs(self, temperature: float, k: int = HEAD) -> np.ndarray:
        """(n, k) float64: each row's first k at `temperature`, normalised over those k, as head_probs."""
        z = self.logits[:, :k].astype(np.float64) / max(temperature, 1e-3)
        p = np.exp(z - z[:, :1])
        return p / p.sum(axis=1, keepdims=True)

    def chain(self, s: SamplingConfig) -> np.ndarray:
        """(n, w) float64: each head's log-probabilities under the sampling chain (support(), llama.cpp's
        order: top-k, top-p, min-p, temperature), -inf where the chain drops a token; the whole row's
        where the head is wider than top-k (0 < top_k < w), else the head's share of it."""
        x = self.logits.astype(np.float64)
        if 0 < s.top_k < x.shape[1]:
            x = x[:, :s.top_k]  # (most likely first: the first k are the k largest)
        keep = np.ones(x.shape, bool)
        if s.top_p < 1.0:  # at temperature 1, the descending prefix whose mass reaches top_p (its last included)
            p1 = np.exp(x - x[:, :1])
            p1 /= p1.sum(axis=1, keepdims=True)
            keep &= np.cumsum(p1, axis=1) - p1 < s.top_p
        if s.min_p > 0.0:
            keep &= x >= x[:, :1] + np.log(s.min_p)
        z = np.where(keep, x / s.temperature, -np.inf)
        z -= z[:, :1]
        return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def head_width(s: SamplingConfig) -> int:
    """How many of a row's largest logits a head keeps: HEAD for the candidates and confidence, one more
    than the chain's top-k so that a draw from the head is the draw from the whole row."""
    return max(HEAD, s.top_k + 1 if s.top_k > 0 else HEAD)


def heads_of(rows: np.ndarray, width: int) -> Heads:
    """The heads of whole logit rows (in C where the extension is built: one pass a row)."""
    n = len(rows)
    width = min(width, rows.shape[1]) if n else width
    ids = np.empty((n, width), np.int64)
    logits = np.empty((n, width), np.float32)
    for i, row in enumerate(rows):
        top = top_ids(row, width)
        z = row[top]
        order = np.lexsort((top, -z))  # most likely first, ties to the lower id
        ids[i], logits[i] = top[order], z[order]
    return Heads(ids, logits)
