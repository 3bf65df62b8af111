"""KVSeq: which token ids one sequence of a context's KV cache holds.

The invariant: `tokens[i]` is stored at position i of sequence `seq`, for all
i < len(tokens), and nothing else is stored in that sequence. Only KVSeq's own
operations change `tokens` (read it anywhere, edit it nowhere else):

    feed(full)         make the sequence hold `full` (keeps the cached prefix, decodes the rest)
    step(token)        decode one token at the next position, append it, return its logit row
    steps(full, ...)   plain decoding steps after `full` in one call of the context, where it has one
    truncate(n)        keep the first n tokens (rolling back rejected ones: one seq_rm, one slice)
    adopt(seq, tokens) become sequence `seq`, which holds `tokens` already (an SSD branch handed over)
    move_to(seq)       carry the cells and tokens over to sequence `seq`

Pre-speculation (speculation/prespec/) decodes its branches into sequences no KVSeq holds;
one becomes the draft's main sequence only through adopt().

With `reuse` = N > 0 (--cache-reuse), feed() keeps more than the common prefix where it can: cached chunks
of at least N tokens that the new sequence holds further left (an editor's window that lost lines at the
top) are moved there with seq_add instead of being read again (reuse_plan: llama-server's --cache-reuse
walk). Such a chunk's keys were computed beside text that is gone: an approximation of a cold read, which
is why it is off unless asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

import numpy as np

from ..errors import ContextFullError
from ..interface import BackendContext

if TYPE_CHECKING:
    from ..coupling import Drawer


class Cancelled(Exception):
    """Raised inside the loop when the caller cancelled; turned into a FinishEvent."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share. Lists are compared a slice at a time in C (a halving
    search for the first difference): every round asks it of the whole history, which a Python loop
    walked token by token."""
    n = min(len(a), len(b))
    if type(a) is list and type(b) is list:
        if a[:n] == b[:n]:
            return n
        lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if a[lo:mid] == b[lo:mid]:
                lo = mid
            else:
                hi = mid
        return lo
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Move(NamedTuple):
    """A cached chunk reused at another place: tokens [src, src + n) of the cache go to [dst, dst + n)."""

    src: int
    dst: int
    n: int


def reuse_plan(cached: Sequence[int], full: Sequence[int], keep: int, end: int, n_min: int) -> tuple[list[Move], int]:
    """llama-server's --cache-reuse walk, after the first `keep` tokens that both hold: from there, a run of
    at least n_min tokens where the cache and `full` (up to `end`) agree is moved left to its place in
    `full`, else the cache's next token is skipped. (The moves, how many leading tokens of `full` the cache
    then holds.)"""
    moves: list[Move] = []
    head_c = head_p = keep
    while head_c < len(cached) and head_p < end:
        n = 0
        while head_c + n < len(cached) and head_p + n < end and cached[head_c + n] == full[head_p + n]:
            n += 1
        if n >= n_min:
            moves.append(Move(head_c, head_p, n))
            head_c, head_p = head_c + n, head_p + n
        else:
            head_c += 1
    return moves, head_p


class KVSeq:
    """One sequence of a context and the tokens it holds. Used by one thread at a time: whichever
    drives the context (the engine, or SSD's worker for the draft)."""

    def __init__(self, ctx: BackendContext, seq: int = 0) -> None:
        self.ctx = ctx
        self.seq = seq
        self._tokens: list[int] = []
        self.reuse = 0  # --cache-reuse: the shortest chunk feed() moves rather than reads again (0: off)

    def held_for(self, full: Sequence[int], rows: int = 1) -> int:
        """How many leading tokens of `full` feed(full, rows) would keep rather than read."""
        keep = min(common_prefix(self._tokens, list(full)), len(full) - rows)
        if self.reuse and keep < len(self._tokens) and self.ctx.can_shift():
            keep = reuse_plan(self._tokens, full, keep, len(full) - rows, self.reuse)[1]
        return max(keep, 0)

    @property
    def tokens(self) -> Sequence[int]:
        """The token ids held, position by position (the list itself: read it, do not edit it)."""
        return self._tokens

    def truncate(self, n: int) -> None:
        """Keep only the first n tokens."""
        if n < len(self._tokens):
            self.ctx.seq_rm(self.seq, n, -1)
            del self._tokens[n:]

    def step(self, token: int) -> np.ndarray:
        """Decode `token` at the next position and hold it; its logit row, shape (n_vocab,), valid until
        the context's next decode (as feed's rows)."""
        row = self.ctx.decode([token], [len(self._tokens)], [self.seq], [0], copy=False)[0]
        self._tokens.append(token)
        return row

    def adopt(self, seq: int, tokens: Sequence[int], drop: bool = True) -> int:
        """Become sequence `seq`, whose cells already hold `tokens` (decoded elsewhere: a pre-speculation
        branch). The cells of the sequence held so far are removed (drop=False: left to the caller); its id
        is returned."""
        old = self.seq
        if drop:
            self.ctx.seq_rm(old, 0, -1)
        self.seq, self._tokens = seq, list(tokens)
        return old

    def move_to(self, seq: int) -> None:
        """Carry the cells and the tokens over to sequence `seq` (whatever it held is dropped)."""
        if seq == self.seq:
            return
        self.ctx.seq_rm(seq, 0, -1)
        self.ctx.seq_cp(self.seq, seq, 0, -1)
        self.ctx.seq_rm(self.seq, 0, -1)
        self.seq = seq

    def steps(self, full: list[int], most: int, seconds: float, drawer: Drawer) -> tuple[list[int], float] | None:
        """Plain steps after `full` in one call of the context (a llama Context's steps(): decode full's
        last token, draw the next with `drawer`'s settings, decode it, ...; at most `most` tokens, an end of
        generation, or about `seconds`), where it has one and the cache holds all of `full` but its last
        token. Returns (the tokens drawn, the seconds in decodes); the cache then holds full and every
        drawn token but the last. None where the context cannot: the caller steps a round at a time."""
        steps = getattr(self.ctx, "steps", None)
        held = len(self._tokens)
        if steps is None or drawer.native is None or len(full) != held + 1 or full[:held] != self._tokens:
            return None
        got = steps(full[-1], held, self.seq, most, seconds, drawer.native)
        if got is None:
            return None
        drawn, row, took = got
        if row is not None:  # a draw the C pass left to Python (NaN, ties past its buffer): the drawer's
            drawn.append(drawer(row, held + len(drawn) + 1))
        self._tokens.append(full[-1])
        self._tokens.extend(drawn[:-1])
        return drawn, took

    def _move_chunks(self, full: Sequence[int], keep: int, end: int) -> int:
        """reuse_plan's moves made: what lies between a chunk's new place and its old one removed, the chunk
        shifted there; the tokens follow. Returns how many leading tokens of `full` the cache now holds."""
        moves, held = reuse_plan(self._tokens, full, keep, end, self.reuse)
        for m in moves:
            self.ctx.seq_rm(self.seq, m.dst, m.src)
            self.ctx.seq_add(self.seq, m.src, m.src + m.n, m.dst - m.src)
            self._tokens[m.dst:m.dst + m.n] = self._tokens[m.src:m.src + m.n]
        return held

    def feed(self, full: Sequence[int], rows: int = 1, cancelled: Callable[[], bool] | None = None,
             chunk: int | None = None) -> np.ndarray:
        """Make the cache hold exactly `full`; return the logit rows of its last `rows` tokens, valid
        until the context's next decode (where the backend can, a view of its own buffer: copy a row
        to keep it longer).

        The longest prefix already cached is kept (at least `rows` tokens are decoded so
        their logits exist); the rest is decoded in batches of at most `chunk` tokens
        (default n_batch), checking `cancelled` between batches: Cancelled leaves the cache
        holding the batches decoded so far, and `tokens` says so.
        """
        if len(full) > self.ctx.n_ctx:
            raise ContextFullError(f"{len(full)} tokens do not fit in a context of {self.ctx.n_ctx}")
        held = len(self._tokens)
        if len(full) - held == rows and 0 < rows <= min(chunk or self.ctx.n_batch, self.ctx.n_batch) \
                and full[:held] == self._tokens:
            # a round's usual case: the cache holds all but the new tokens, whose rows are all wanted
            got = self.ctx.decode(full[held:], range(held, held + rows), [self.seq] * rows, range(rows), copy=False)
            self._tokens.extend(full[held:])
            return got
        keep = min(common_prefix(self._tokens, full), len(full) - rows)
        if self.reuse and keep < len(self._tokens) and self.ctx.can_shift():
            keep = self._move_chunks(full, keep, len(full) - rows)
        self.truncate(keep)
        todo = list(full[keep:])
        out: list[np.ndarray] = []
        pos = keep
        step = min(chunk or self.ctx.n_batch, self.ctx.n_batch)
        for start in range(0, len(todo), step):
            if cancelled is not None and start and cancelled():
                raise Cancelled()
            batch = todo[start:start + step]  # the tokens of one decode
            first_row = len(todo) - rows  # index in todo of the first token whose logits are wanted
            want = [i for i in range(len(batch)) if start + i >= first_row]
            last = start + step >= len(todo)  # rows of an earlier batch must outlive the next decode: copies
            got = self.ctx.decode(batch, range(pos, pos + len(batch)), [self.seq] * len(batch), want, copy=not last)
            if len(got):
                out.append(got)
            self._tokens.extend(batch)
            pos += len(batch)
        if len(out) == 1:
            return out[0]
        return np.concatenate(out) if out else np.empty((0, self.ctx.model.n_vocab), np.float32)
