"""Coupled sampling: every random choice is a Gumbel-max draw keyed by (seed, position, token).

To sample token i of a generation from a probability row p, ssd-edge takes

    x_i = argmax_t ( log p(t) + G(seed, i, t) )        G: standard Gumbel noise

where G(seed, i, t) is a fixed function of the seed, the absolute position i in the sequence and
the token id t (a counter-based hash, no generator state). For any fixed prefix this is an exact
sample from p (the Gumbel-max trick), and the noise of different positions is independent, so a
whole generation follows the target's distribution exactly.

The draft model samples its token for position i with the same noise: d_i = argmax(log q + G).
Verification then accepts a drafted token iff it equals the target's own draw x_i, exactly as in
greedy decoding (greedy is the case G = 0). Two consequences:

- Lossless by construction, whatever proposes: the committed token at position i is x_i, a
  function of the target's row and the seed alone. Which proposer ran, how many tokens it drafted,
  when pre-speculation hit or missed: none of it can change a committed token, only how many target
  decodes it takes. Adaptive rules (the round planner, --draft-min, --draft-p-min) cannot bias the
  output, even rules that look at drafted tokens.
- Reproducible: the same seed gives the same tokens in every mode, on a busy or an idle machine
  (up to the batched-vs-one-token logit near-ties that greedy decoding has too).

The price: a drafted token is accepted with probability P(argmax(log q + G) = argmax(log p + G)),
at least (1 - TV) / (1 + TV) (TV: total variation between p and q), against 1 - TV for rejection
sampling. No sampler whose result ignores the draft can do better (a coupling without
communication); on the peaked distributions of a good draft the difference is small.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import numpy as np

from .config import SamplingConfig
from .sampling import Heads, support

try:  # compiled at install (setup.py); without it, numpy draws the same
    from .native import (argmax as compiled_argmax, draw as compiled_draw, gumbel as compiled_gumbel,
                         head_draws as compiled_head_draws)
except ImportError:  # pragma: no cover - a build without the extension
    compiled_argmax = compiled_draw = compiled_gumbel = compiled_head_draws = None

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S30, _S27, _S31, _S11 = (np.uint64(s) for s in (30, 27, 31, 11))
SEED_BITS = 63  # seeds are taken modulo 2**63
_MASK = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection on uint64 whose output bits look independent."""
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def mix64(x: int) -> int:
    """_mix on one Python int (mod 2**64): the same bits, without numpy's scalar overhead."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def uniforms(seed, position, ids) -> np.ndarray:
    """U(seed, position, id) in (0, 1): independent across seeds, positions and ids. Arguments are
    ints or arrays that broadcast together (e.g. seeds (n, 1) against ids (V,) for n draws at once)."""
    if isinstance(seed, (int, np.integer)) and isinstance(position, (int, np.integer)):
        # one draw: the key in Python ints (mod 2**64), numpy only over the ids (arrays wrap silently)
        key = mix64((int(seed) % (1 << SEED_BITS) + int(_GOLDEN)) & _MASK)
        key = np.uint64(mix64(key ^ ((int(position) * int(_GOLDEN)) & _MASK)))
        h = _mix(key ^ (np.asarray(ids, dtype=np.uint64) + np.uint64(1)) * _M2)
        return ((h >> _S11).astype(np.float64) + 0.5) * (1.0 / (1 << 53))
    if isinstance(seed, (int, np.integer)):
        seed = np.uint64(int(seed) % (1 << SEED_BITS))
    else:
        seed = np.asarray(seed).astype(np.uint64) & np.uint64((1 << SEED_BITS) - 1)
    with np.errstate(over="ignore"):
        key = _mix(seed + _GOLDEN)
        key = _mix(key ^ (np.asarray(position, dtype=np.uint64) * _GOLDEN))
        h = _mix(key ^ (np.asarray(ids, dtype=np.uint64) + np.uint64(1)) * _M2)
    return ((h >> _S11).astype(np.float64) + 0.5) * (1.0 / (1 << 53))


def gumbels(seed: int, position, ids: np.ndarray) -> np.ndarray:
    """G(seed, position, id) for each id: the standard Gumbel noise a coupled draw at `position` adds
    (positions and ids broadcast together, as in uniforms)."""
    return -np.log(-np.log(uniforms(seed, position, ids)))


def gumbel_draw(ids: np.ndarray, p: np.ndarray, seed: int, position: int) -> int:
    """Draw from a distribution on its support (ids ascending, p > 0) with the noise of (seed,
    position): argmax log p + G, over those ids alone (the rest have log p = -inf). In C where the
    extension is built (the same noise; its log may differ from numpy's in the last bit)."""
    if len(ids) == 1:
        return int(ids[0])
    if (compiled_gumbel is not None and ids.dtype == np.int64 and p.dtype == np.float64 and ids.flags.c_contiguous
            and p.flags.c_contiguous and len(ids) == len(p)):
        return compiled_gumbel(ids, p, int(seed) % (1 << 64), int(position) % (1 << 64))
    return int(ids[np.argmax(np.log(p) + gumbels(seed, position, ids))])


def gumbel_pick(p: np.ndarray, seed: int, position: int) -> int:
    """Draw from a dense probability row p (V,) with the noise of (seed, position)."""
    ids = np.flatnonzero(p)
    return gumbel_draw(ids, p[ids], seed, position)


def head_draws(heads: Heads, s: SamplingConfig, seed: int, positions: Sequence[int]) -> np.ndarray:
    """draw() for rows handed over as heads (sampling.Heads; row i at positions[i]), in one pass over all
    of them: argmax log p + G over each head's sampling distribution. The draw from the whole row where
    the head is wider than top-k (sampling.head_width), up to the last bit of the arithmetic."""
    w = heads.ids.shape[1]
    if compiled_head_draws is not None and 0 < s.top_k < w:  # the same in C, one call (ssd_edge/csrc/draws.c)
        got = compiled_head_draws(np.ascontiguousarray(heads.ids), np.ascontiguousarray(heads.logits), w, s.top_k,
                                  s.top_p, s.min_p, s.temperature, int(seed) % (1 << 64),
                                  np.asarray(positions, np.int64))
        if got is not None:
            return np.frombuffer(got, dtype=np.int64)
    logp = heads.chain(s)
    ids = heads.ids[:, :logp.shape[1]]
    g = gumbels(seed, np.asarray(positions, np.int64)[:, None], ids)
    return ids[np.arange(len(ids)), np.argmax(logp + g, axis=1)]


def argmax(logits: np.ndarray) -> int:
    """np.argmax of one float32 row (the first of ties; the first NaN where there is one): in C where built,
    where it costs 28 us on a row fresh from a CPU decode, numpy 41 (its dispatch runs cold there too)."""
    if compiled_argmax is not None and type(logits) is np.ndarray and logits.dtype == np.float32 and logits.ndim == 1 \
            and logits.flags.c_contiguous:
        return compiled_argmax(logits)
    return int(np.argmax(logits))


def draw(logits: np.ndarray, s: SamplingConfig, seed: int, position: int) -> int:
    """The target's token at `position` from its logit row: the argmax when greedy, else the coupled
    draw from the row's sampling distribution (sampling.support: its candidates alone). With top-k on,
    the support and the draw are one C call where the extension is built (the same token)."""
    return Drawer(s, seed)(logits, position)


class RowHook(Protocol):
    """What may change a logit row before its draw, before top-k (structured output's grammar mask,
    penalties, a logit bias): called with the row and the drawn token's position, it changes the row in
    place. native: its form for native.steps's C loop, (a C function's address, its user pointer) and
    optionally (the address of the int32 mask it fills, its words), with native.h's row_hook_fn
    signature (it returns 1 where the C loop is to draw under that mask); None where only Python can
    run it (plain steps then go a round at a time)."""

    native: tuple[int, int] | None

    def __call__(self, row: np.ndarray, position: int) -> None: ...


class Drawer:
    """draw() for one generation: its settings and seed bound once, so that a position's draw is the C
    call and little else (on a row fresh from a CPU decode, draw()'s own checks and conversions took 17
    of its 55 us). drawer(row, position) == draw(row, s, seed, position) on the row as its hook leaves
    it (none: as it is)."""

    def __init__(self, s: SamplingConfig, seed: int, hook: RowHook | None = None) -> None:
        self.s, self.seed, self.greedy, self.hook = s, seed, s.greedy, hook
        self._fused = None if self.greedy or compiled_draw is None or s.top_k <= 0 else \
            (s.top_k, s.top_p, s.min_p, s.temperature, int(seed) % (1 << 64))
        # these draws as a backend's C loop of plain steps makes them (llama Context.steps: top_k 0 is the
        # argmax), the hook's native form after them; None where only this object can (top-k off, no
        # compiled extension, a hook with no native form)
        native = (0, 0.0, 0.0, 0.0, 0) if self.greedy and compiled_argmax is not None else self._fused
        if hook is not None and native is not None:
            native = (*native, *hook.native, *(None, 0)[len(hook.native) - 2:]) if hook.native is not None else None
        self.native = native

    def __call__(self, row: np.ndarray, position: int) -> int:
        if self.hook is not None:
            self.hook(row, position)
        if self.greedy:
            return argmax(row)
        if type(row) is not np.ndarray:
            row = np.asarray(row)
        f = self._fused
        if f is not None and f[0] < row.shape[-1] and row.dtype == np.float32 and row.flags.c_contiguous:
            token = compiled_draw(row, *f, int(position) % (1 << 64))
            if token is not None:  # None: NaN, or ties past the compiled pass's buffer
                return token
        return gumbel_draw(*support(row, self.s), self.seed, position)


class Draws:
    """The target's own draws at a verify's positions (row j is position first + j), each made when it
    is first read: verify() reads them up to the first rejection and the recovery token, so the rows
    past it cost no sampling. A draw is a function of its row, the seed and its position alone, so
    when it is made changes nothing."""

    def __init__(self, rows: np.ndarray, drawer: Callable[[np.ndarray, int], int], first: int) -> None:
        self.rows, self.drawer, self.first = rows, drawer, first
        self._made: list[int] = []

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, j: int) -> int:
        while len(self._made) <= j:
            i = len(self._made)
            self._made.append(self.drawer(self.rows[i], self.first + i))
        return self._made[j]


def gumbel_picks(p: np.ndarray, seed: int, first_position: int) -> np.ndarray:
    """One draw per row of p (n, V); row j is position first_position + j."""
    return np.array([gumbel_pick(row, seed, first_position + j) for j, row in enumerate(p)], dtype=np.int64)


def fresh_seed() -> int:
    """A random seed for a generation that was given none (reported in its stats, to replay it)."""
    return int(np.random.SeedSequence().entropy % (1 << SEED_BITS))
