"""llama.cpp's unified KV cache as a table of cells, for backends that compute no attention: the priced
backend here and the tests' fake (tests/fakes.py) keep their KV state in it, so a wrong KV state gives
wrong logits there as it would in llama.cpp.

Each decoded token takes a cell holding its position, its token and the set of sequences it belongs
to; seq_cp adds a sequence to cells (no new cells: metadata-only, as with n_seq_max > 1 and
kv_unified), seq_rm removes it, and a cell that no sequence holds any more is freed. A sequence holds
at most one cell per position. store() enforces llama.cpp's rule that a sequence's first position in
a batch is its last stored position + 1 (llama_decode returns -1 otherwise): a broken rule is a bug in
the caller, raised as AssertionError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..errors import ContextFullError


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
        self._live: dict[int, Cell] = {}                 # id(cell) -> cell, in the order they were stored
        self._seqs: dict[int, dict[int, Cell]] = {}     # seq -> position -> its cell

    @property
    def cells(self) -> list[Cell]:
        """The cells in use, oldest first."""
        return list(self._live.values())

    def store(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int | Sequence[int]]
              ) -> list[Cell]:
        """One batch's cells, after checking it as llama_decode does; unstore() takes them back."""
        first: dict[int, int] = {}
        for pos, s in zip(positions, seqs):
            for sid in seq_ids(s):
                if not 0 <= sid < self.n_seq_max:
                    raise AssertionError(f"seq {sid} out of range (n_seq_max {self.n_seq_max})")
                first.setdefault(sid, pos)
        for sid, pos in first.items():
            if pos != self.seq_pos_max(sid) + 1:
                raise AssertionError(f"seq {sid}: batch starts at {pos}, stored up to {self.seq_pos_max(sid)}")
        if len(self._live) + len(tokens) > self.n_ctx or (positions and max(positions) >= self.n_ctx):
            raise ContextFullError(f"no KV cache slot for a batch of {len(tokens)} tokens (context {self.n_ctx} full)")
        out = []
        for t, pos, s in zip(tokens, positions, seqs):
            cell = Cell(int(pos), int(t), set(seq_ids(s)))
            out.append(cell)
            self._live[id(cell)] = cell
            for sid in cell.seqs:
                if self._seqs.setdefault(sid, {}).setdefault(cell.pos, cell) is not cell:
                    self.unstore(out)
                    raise AssertionError(f"seq {sid} holds position {cell.pos} twice in one batch")
        return out

    def unstore(self, cells: Sequence[Cell]) -> None:
        """Free cells store() made (an aborted decode leaves the cache as it was)."""
        for cell in cells:
            for sid in cell.seqs:
                held = self._seqs.get(sid, {})
                if held.get(cell.pos) is cell:
                    del held[cell.pos]
            self._live.pop(id(cell), None)

    # ------------------------------------------------------------ reading a sequence
    def seq_tokens(self, seq: int, end: int | None = None) -> list[int]:
        """The tokens `seq` holds at positions 0 .. end - 1 (all: end None), which must all be there."""
        held = self._seqs.get(seq, {})
        end = (max(held) + 1 if held else 0) if end is None else end
        try:
            return [held[p].token for p in range(end)]
        except KeyError:
            raise AssertionError(f"sequence {seq} has holes: {sorted(held)}") from None

    def tail(self, seq: int, pos: int, n: int) -> tuple[int, ...]:
        """The tokens `seq` holds at positions pos - n + 1 .. pos (those >= 0), which must all be there."""
        held = self._seqs.get(seq, {})
        try:
            return tuple(held[p].token for p in range(max(0, pos - n + 1), pos + 1))
        except KeyError:
            raise AssertionError(f"sequence {seq} has a hole before position {pos}") from None

    def seq_pos_max(self, seq: int) -> int:
        """Last stored position of `seq`, -1 when empty."""
        held = self._seqs.get(seq)
        return max(held) if held else -1

    def cells_outside(self, seq: int) -> int:
        """Cells not held by `seq` (branch cells when `seq` is the main sequence)."""
        return sum(1 for c in self._live.values() if seq not in c.seqs)

    # ------------------------------------------------------------ the KV verbs
    def seq_rm(self, seq: int, p0: int = 0, p1: int = -1) -> None:
        """Remove positions [p0, p1) of `seq` (p1 < 0: to the end; seq < 0: of every sequence)."""
        for sid in (list(self._seqs) if seq < 0 else [seq]):
            held = self._seqs.get(sid, {})
            for p in [p for p in held if p >= p0 and (p1 < 0 or p < p1)]:
                cell = held.pop(p)
                cell.seqs.discard(sid)
                if not cell.seqs:
                    del self._live[id(cell)]

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Add `dst` to the cells of `src` at positions [p0, p1) (p1 < 0: to the end)."""
        if src == dst:
            return
        into = self._seqs.setdefault(dst, {})
        for p, cell in self._seqs.get(src, {}).items():
            if p >= p0 and (p1 < 0 or p < p1):
                if into.setdefault(p, cell) is not cell:
                    raise AssertionError(f"seq_cp {src} -> {dst}: {dst} already holds position {p}")
                cell.seqs.add(dst)

    def clear(self) -> None:
        self._live.clear()
        self._seqs.clear()
