"""KVSeq: which token ids one sequence of a context's KV cache holds.

The invariant: `tokens[i]` is stored at position i of sequence `seq`, for all
i < len(tokens), and nothing else is stored in that sequence. Rolling back
rejected tokens is `feed` with a shorter history: one seq_rm and one slice, here
and nowhere else.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .errors import ContextFullError
from .interface import BackendContext


class Cancelled(Exception):
    """Raised inside the loop when the caller cancelled; turned into a FinishEvent."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class KVSeq:
    def __init__(self, ctx: BackendContext, seq: int = 0) -> None:
        self.ctx = ctx
        self.seq = seq
        self.tokens: list[int] = []

    def truncate(self, n: int) -> None:
        """Keep only the first n tokens."""
        if n < len(self.tokens):
            self.ctx.seq_rm(self.seq, n, -1)
            del self.tokens[n:]

    def feed(self, full: Sequence[int], rows: int = 1, cancelled: Callable[[], bool] | None = None,
             chunk: int | None = None) -> np.ndarray:
        """Make the cache hold exactly `full`; return the logit rows of its last `rows` tokens.

        The longest prefix already cached is kept (at least `rows` tokens are decoded so
        their logits exist); the rest is decoded in chunks of `chunk` tokens (default
        n_batch), checking `cancelled` between chunks: Cancelled leaves the cache holding
        the chunks decoded so far, and `tokens` says so.
        """
        if len(full) > self.ctx.n_ctx:
            raise ContextFullError(f"{len(full)} tokens do not fit in a context of {self.ctx.n_ctx}")
        keep = min(common_prefix(self.tokens, full), len(full) - rows)
        self.truncate(keep)
        todo = list(full[keep:])
        out: list[np.ndarray] = []
        pos = keep
        step = min(chunk or self.ctx.n_batch, self.ctx.n_batch)
        for start in range(0, len(todo), step):
            if cancelled is not None and start and cancelled():
                raise Cancelled()
            chunk = todo[start:start + step]
            first_row = len(todo) - rows  # index in todo of the first token whose logits are wanted
            want = [i for i in range(len(chunk)) if start + i >= first_row]
            out.append(self.ctx.decode(chunk, range(pos, pos + len(chunk)), [self.seq] * len(chunk), want))
            self.tokens.extend(chunk)
            pos += len(chunk)
        return np.concatenate(out) if out else np.empty((0, self.ctx.model.n_vocab), np.float32)
