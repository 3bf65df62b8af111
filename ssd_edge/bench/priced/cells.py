"""llama.cpp's unified KV cache as a table of cells, for backends that compute no attention: the priced
backend here and the tests' fake (tests/fakes.py) keep their KV state in it, so a wrong KV state gives
wrong logits there as it would in llama.cpp.

Each decoded token takes a cell holding its position, its token and the sequences it belongs to;
seq_cp adds a sequence to cells (no new cells: metadata-only, as with n_seq_max > 1 and kv_unified),
seq_rm removes it, and a cell that no sequence holds any more is freed. A sequence holds at most one
cell per position. store() enforces llama.cpp's rule that a sequence's first position in a batch is
its last stored position + 1 (llama_decode returns -1 otherwise): a broken rule is a bug in the
caller, raised as AssertionError.

The table is arrays, as llama.cpp's is C: which cell each sequence holds at each position, each cell's
token and position and how many sequences hold it, each sequence's last position. seq_cp and seq_rm
are a few array operations, not a loop over the history: a priced decode waits a GPU's price, and the
KV verbs between decodes must cost the microseconds they cost in llama.cpp, not a Python pass over
hundreds of cells that the engine's host time would be charged for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ...errors import ContextFullError


@dataclass
class Cell:
    pos: int
    token: int
    seqs: set[int] = field(default_factory=set)


def seq_ids(s: int | Sequence[int]) -> list[int]:
    """The sequences of one batch entry (an int or several)."""
    return [s] if isinstance(s, int) else list(s)


class CellCache:
    """The KV half of a BackendContext (seq_rm, seq_cp, seq_pos_max, clear), and store() for its decode."""

    def __init__(self, n_ctx: int, n_seq_max: int = 1) -> None:
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max
        self._at = np.full((n_seq_max, n_ctx), -1, np.int32)  # [seq, position] -> its cell, -1: none
        self._token = np.zeros(n_ctx, np.int64)                # cell -> token
        self._pos = np.zeros(n_ctx, np.int64)                  # cell -> position
        self._refs = np.zeros(n_ctx, np.int32)                 # cell -> sequences holding it (0: free)
        self._born = np.zeros(n_ctx, np.int64)                 # cell -> when it was stored (for `cells`)
        self._stored = 0
        self._free = list(range(n_ctx - 1, -1, -1))            # free cells, the next one last
        self._max = [-1] * n_seq_max                           # seq -> its last position

    @property
    def cells(self) -> list[Cell]:
        """The cells in use, oldest first."""
        live = np.flatnonzero(self._refs > 0)
        live = live[np.argsort(self._born[live], kind="stable")]
        return [Cell(int(self._pos[c]), int(self._token[c]),
                     {int(s) for s in np.flatnonzero(self._at[:, self._pos[c]] == c)}) for c in live]

    def store(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int | Sequence[int]]
              ) -> list[int]:
        """One batch's cells, after checking it as llama_decode does; unstore() takes them back."""
        first: dict[int, int] = {}
        for pos, s in zip(positions, seqs):
            for sid in seq_ids(s):
                if not 0 <= sid < self.n_seq_max:
                    raise AssertionError(f"seq {sid} out of range (n_seq_max {self.n_seq_max})")
                first.setdefault(sid, pos)
        for sid, pos in first.items():
            if pos != self._max[sid] + 1:
                raise AssertionError(f"seq {sid}: batch starts at {pos}, stored up to {self._max[sid]}")
        if len(tokens) > len(self._free) or (len(positions) and max(positions) >= self.n_ctx):
            raise ContextFullError(f"no KV cache slot for a batch of {len(tokens)} tokens (context {self.n_ctx} full)")
        out: list[int] = []
        for t, pos, s in zip(tokens, positions, seqs):
            pos = int(pos)
            c = self._free.pop()
            out.append(c)
            self._token[c], self._pos[c], self._born[c] = int(t), pos, self._stored
            self._stored += 1
            for sid in seq_ids(s):
                if self._at[sid, pos] >= 0:
                    self.unstore(out)
                    raise AssertionError(f"seq {sid} holds position {pos} twice in one batch")
                self._at[sid, pos] = c
                self._refs[c] += 1
                self._max[sid] = max(self._max[sid], pos)
        return out

    def unstore(self, cells: Sequence[int]) -> None:
        """Free cells store() made (an aborted decode leaves the cache as it was)."""
        touched: set[int] = set()
        for c in cells:
            pos = int(self._pos[c])
            for sid in np.flatnonzero(self._at[:, pos] == c).tolist():
                self._at[sid, pos] = -1
                touched.add(sid)
            self._refs[c] = 0
            self._free.append(c)
        for sid in touched:
            self._max[sid] = self._last(sid, self.n_ctx)

    def _last(self, seq: int, end: int) -> int:
        """The last position below `end` that `seq` holds, -1 if none."""
        held = np.flatnonzero(self._at[seq, :end] >= 0)
        return int(held[-1]) if len(held) else -1

    def _held(self, seq: int, end: int) -> np.ndarray:
        """The cells of `seq` at positions 0 .. end - 1, which must all be there."""
        cells = self._at[seq, :max(end, 0)]
        if (cells < 0).any():
            raise AssertionError(f"sequence {seq} has holes: {np.flatnonzero(self._at[seq] >= 0).tolist()}")
        return cells

    # ------------------------------------------------------------ reading a sequence
    def seq_tokens(self, seq: int, end: int | None = None) -> list[int]:
        """The tokens `seq` holds at positions 0 .. end - 1 (all: end None), which must all be there."""
        end = self._max[seq] + 1 if end is None else end
        return self._token[self._held(seq, end)].tolist()

    def tail(self, seq: int, pos: int, n: int) -> tuple[int, ...]:
        """The tokens `seq` holds at positions pos - n + 1 .. pos (those >= 0), which must all be there."""
        cells = self._at[seq, max(0, pos - n + 1):pos + 1]
        if (cells < 0).any():
            raise AssertionError(f"sequence {seq} has a hole before position {pos}")
        return tuple(self._token[cells].tolist())

    def tails(self, seqs: Sequence[int], positions: Sequence[int], n: int) -> tuple[np.ndarray, np.ndarray]:
        """tail() of many (seq, pos) at once: (len x n int64 tokens, each row's first `length` the tail, length)."""
        seq = np.asarray(seqs, np.int64)[:, None]
        at = np.asarray(positions, np.int64)[:, None] + np.arange(1 - n, 1)
        cells = self._at[seq, np.maximum(at, 0)]
        if (cells[at >= 0] < 0).any():
            raise AssertionError("a sequence has a hole before a position read")
        tokens = np.where(at >= 0, self._token[cells], 0)
        lengths = np.minimum(at[:, -1] + 1, n)
        for i in np.flatnonzero(lengths < n):  # (the first positions of a sequence) left-aligned
            tokens[i] = np.roll(tokens[i], lengths[i] - n)
        return tokens, lengths

    def seq_pos_max(self, seq: int) -> int:
        """Last stored position of `seq`, -1 when empty."""
        return self._max[seq]

    def cells_outside(self, seq: int) -> int:
        """Cells not held by `seq` (branch cells when `seq` is the main sequence)."""
        return self.n_ctx - len(self._free) - int((self._at[seq] >= 0).sum())

    # ------------------------------------------------------------ the KV verbs
    def seq_rm(self, seq: int, p0: int = 0, p1: int = -1) -> None:
        """Remove positions [p0, p1) of `seq` (p1 < 0: to the end; seq < 0: of every sequence)."""
        p0 = max(p0, 0)
        for sid in (range(self.n_seq_max) if seq < 0 else [seq]):
            end = self._max[sid] + 1 if p1 < 0 else min(p1, self._max[sid] + 1)
            if p0 >= end:
                continue
            span = self._at[sid, p0:end]
            cells = span[span >= 0]
            span[:] = -1
            self._refs[cells] -= 1
            self._free.extend(cells[self._refs[cells] == 0].tolist())
            if self._max[sid] < end:
                self._max[sid] = self._last(sid, p0)

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Add `dst` to the cells of `src` at positions [p0, p1) (p1 < 0: to the end)."""
        if src == dst:
            return
        p0 = max(p0, 0)
        p1 = self._max[src] + 1 if p1 < 0 else min(p1, self._max[src] + 1)
        if p0 >= p1:
            return
        src_span, dst_span = self._at[src, p0:p1], self._at[dst, p0:p1]
        if self._max[dst] < 0 and p0 == 0 and self._max[src] >= p1 - 1 and src_span.min() >= 0:
            dst_span[:] = src_span  # a fresh branch of a whole prefix (SSD's): three array operations
            self._refs[src_span] += 1
            self._max[dst] = p1 - 1
            return
        have = src_span >= 0
        clash = have & (dst_span >= 0) & (dst_span != src_span)
        if clash.any():
            raise AssertionError(f"seq_cp {src} -> {dst}: {dst} already holds position {p0 + int(np.argmax(clash))}")
        new = have & (dst_span < 0)
        self._refs[src_span[new]] += 1
        dst_span[new] = src_span[new]
        if new.any():
            self._max[dst] = max(self._max[dst], p0 + int(np.flatnonzero(new)[-1]))

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Move the cells of `seq` at positions [p0, p1) by `delta`, for every sequence that holds them (as
        llama.cpp moves a cell's position); a cell moved below position 0 is removed. The positions they move
        to must be free (AssertionError otherwise: the caller removes what was there first)."""
        p1 = self._max[seq] + 1 if p1 < 0 else min(p1, self._max[seq] + 1)
        if delta == 0 or p0 >= p1:
            return
        span = self._at[seq, max(p0, 0):p1]
        cells = span[span >= 0]
        for sid in range(self.n_seq_max):
            row = self._at[sid]
            src = np.flatnonzero(np.isin(row, cells))
            if not len(src):
                continue
            moved = row[src].copy()
            row[src] = -1
            dst = src + delta
            if (dst >= self.n_ctx).any() or (row[dst[dst >= 0]] >= 0).any():
                raise AssertionError(f"seq_add: seq {sid} cannot take positions {dst.min()}..{dst.max()}")
            row[dst[dst >= 0]] = moved[dst >= 0]
            gone = moved[dst < 0]
            self._refs[gone] -= 1
            self._free.extend(gone[self._refs[gone] == 0].tolist())
            self._max[sid] = self._last(sid, self.n_ctx)
        self._pos[cells] += delta

    def can_shift(self) -> bool:
        return True

    def clear(self) -> None:
        self._at.fill(-1)
        self._refs.fill(0)
        self._free = list(range(self.n_ctx - 1, -1, -1))
        self._max = [-1] * self.n_seq_max
