"""The target's rows under a constraint: the row hook (coupling.RowHook) that shapes each of them before
its draw, in the Python draw (a verify's rows, coupling.Draws) and in the C loop of plain steps alike,
and the log-probabilities that a request for logprobs reads from them.

A row at position p follows the answer up to p: the committed answer (the generation's history after
its prompt) and, within a round, the drafted tokens before p (`ahead`: the draft a verify reads rows
for; in the C loop, the tokens it has drawn so far, which it hands the hook one by one). A verify reads
its rows in order and stops at the first rejection (verify.py), so every row it reads follows tokens
that the target itself drew there: the draws are mode ar's under the same constraint.
"""

from __future__ import annotations

import ctypes
from typing import Sequence

import numpy as np

from ..events import TokenLogprob
from ..sampling import top_ids
from .shaping import Cursor, apply_mask

# native.h's row_hook_fn: (user, row, n_vocab, position, the token decoded before the row) -> 1: draw under the mask
try:  # compiled at install: a C row hook that calls Python and lets what it raises (Ctrl-C) through
    from ..native import row_hook_address
except ImportError:  # pragma: no cover - a build without the extension: plain steps go a round at a time
    row_hook_address = None
TOP_LOGPROBS_MAX = 20  # OpenAI's limit on top_logprobs


class AnswerRows:
    """The generation's row hook: history is the generation's own list (the prompt, then each committed
    token), n_prompt its prompt's length. logprobs: None, or how many alternatives each token's
    TokenLogprob carries (0..20); then each row is kept as it came, before any shaping, until read."""

    def __init__(self, cursor: Cursor | None, history: list[int], n_prompt: int, logprobs: int | None = None) -> None:
        self.cursor = cursor
        self.history = history
        self.n_prompt = n_prompt
        self.ahead: list[int] = []  # the round's drafted tokens (a verify), or the C loop's drawn ones
        self.logprobs = logprobs
        self.raw: dict[int, np.ndarray] = {}  # position -> the row before shaping (logprobs only)
        self._call = self._row  # kept alive with the hook: native.steps's C hook calls it by address (its id)
        # logprobs keep a row copy per position: plain steps then go a round at a time, in Python
        self.native = None
        if logprobs is None and row_hook_address is not None:
            mask = cursor.mask if cursor is not None and cursor.mask is not None else None
            self.native = (row_hook_address(), id(self._call),
                           mask.ctypes.data if mask is not None else None, len(mask) if mask is not None else 0)
        self._c_shaped = -1  # the position whose row the C loop's call shaped all but the mask of
        self._views: dict[tuple[int, int], np.ndarray] = {}

    def round(self, draft: Sequence[int] = ()) -> None:
        """A round starts: its rows follow the committed history, then `draft`."""
        self.ahead = list(draft)
        self._c_shaped = -1  # a C loop's first row follows the whole prefix

    def __call__(self, row: np.ndarray, position: int, mask: bool = True) -> bool:
        """Shape the row of `position` in place (mask=False: all but the mask, which the cursor holds
        filled for the draw to apply); whether a mask applies."""
        if self.logprobs is not None:
            self.raw[position] = np.array(row, dtype=np.float32, copy=True)
        c = self.cursor
        if c is None:
            return False
        if position == self._c_shaped:  # the C loop left this row's draw to Python: the mask alone is missing
            self._c_shaped = -1
            if c.constrained:
                apply_mask(row, c.mask)
            return c.constrained
        j = position - len(self.history)
        h = self.history
        return c(row, h[self.n_prompt:] + self.ahead[:j] if j > 0 else h[self.n_prompt:], mask)

    def _row(self, row: int, n_vocab: int, position: int, previous: int) -> int:
        """The C loop's call: the row (its address) after `previous`, which it drew (or, first, the history's
        last); or, with no row (0), the notice that it drew `previous` and decodes it now, which needs
        nothing here. Within one loop the cursor is where the last row left it, so it takes one token;
        the mask is filled here, not ahead on a thread (measured on the default pair: the hand-off cost
        what the fill did). What it raises stops the loop and is raised from native.steps (csrc/row_hook.c:
        py_row_hook)."""
        if not row:
            return 0  # a drawn token, decoded now: the next row's call follows it
        if position - len(self.history) > len(self.ahead):
            self.ahead.append(previous)
        view = self._views.get((row, n_vocab))
        if view is None:
            view = np.ctypeslib.as_array(ctypes.cast(row, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
            self._views = {(row, n_vocab): view}
        c = self.cursor
        if c is not None and self._c_shaped == position - 1 and len(c.tokens) == position - self.n_prompt - 1:
            c.push(previous)  # the loop's last row was this cursor's, and the loop drew `previous` from it
            masked = c.shape(view, mask=False)
        else:
            masked = self(view, position, mask=False)
        self._c_shaped = position
        return 1 if masked else 0

    # ------------------------------------------------------------ logprobs
    def take_logprobs(self, first: int, tokens: Sequence[int]) -> tuple[TokenLogprob, ...]:
        """The kept tokens' logprobs (token i at position first + i), from the rows as they came; the
        rows held for those positions and before are let go."""
        out = []
        for i, t in enumerate(tokens):
            row = self.raw.get(first + i)
            out.append(token_logprob(row, t, self.logprobs or 0) if row is not None else TokenLogprob(t, float("nan"), ()))
        for p in [p for p in self.raw if p < first + len(tokens) + 1]:
            del self.raw[p]
        return tuple(out)


def token_logprob(row: np.ndarray, token: int, top: int) -> TokenLogprob:
    """log softmax(row) at temperature 1 for `token` and the row's `top` likeliest (OpenAI's logprobs:
    before bias, penalties, the grammar and the sampling filters)."""
    x = row.astype(np.float64)
    m = float(x.max())
    lse = m + float(np.log(np.exp(x - m).sum()))
    alts: tuple[tuple[int, float], ...] = ()
    if top > 0:
        ids = top_ids(row, min(top, len(row)))
        ids = ids[np.lexsort((ids, -x[ids]))]  # likeliest first, ties to the lower id
        alts = tuple((int(i), float(x[i] - lse)) for i in ids)
    return TokenLogprob(int(token), float(x[token] - lse), alts)


class DraftRows:
    """The draft model's rows under the same shaping as the target's (a grammar's mask, the bias, the
    penalties): shape(row, history, drafted) before each drafted token is drawn, so that a draft never
    proposes what the target's masked row cannot draw. One per drafter: its thread alone calls it (the
    engine's, or the pre-speculation worker's for every branch, each a prefix the cursor rolls to)."""

    def __init__(self, cursor: Cursor, n_prompt: int) -> None:
        self.cursor = cursor
        self.n_prompt = n_prompt

    def __call__(self, row: np.ndarray, history: Sequence[int], drafted: Sequence[int]) -> None:
        self.cursor(row, [*history[self.n_prompt:], *drafted])

    def fork(self, history: Sequence[int], drafted: Sequence[int]) -> Cursor:
        """A cursor of its own after history + drafted: a pre-speculated branch's, shaping its rows as it
        grows (push each token it draws, then shape the next row)."""
        self.cursor.follow([*history[self.n_prompt:], *drafted])
        return self.cursor.fork()

    def forced(self, history: Sequence[int], drafted: Sequence[int]) -> list[int]:
        """The grammar's forced run after history + drafted ([] where none, or no grammar)."""
        if self.cursor.matcher is None:
            return []
        self.cursor.follow([*history[self.n_prompt:], *drafted])
        return self.cursor.forced()


class ForcedRuns:
    """A grammar's forced run after a history (Rounds.forced): the tokens the grammar allows as the only
    continuation, proposed first in a round, free (they cost no model; the target verifies them as any
    draft, on masked rows, so another split of the same bytes would be the target's own to draw).

    Their acceptance is learned as a proposer's is: a rate that starts from a prior of 1 (PRIOR rounds'
    worth of accepted tokens) and counts each verified forced token, accepted or the first refused. A
    run is cut where the chance of reaching its next token falls under FLOOR: decided from earlier
    rounds alone, before the run is proposed."""

    PRIOR = 4.0   # pseudo-tokens, all accepted
    FLOOR = 0.1   # the least chance of reaching a forced token worth a verify position

    def __init__(self, cursor: Cursor, n_prompt: int) -> None:
        self.cursor = cursor
        self.n_prompt = n_prompt
        self.verified = self.accepted = self.PRIOR

    @property
    def acceptance(self) -> float:
        return self.accepted / self.verified

    def __call__(self, history: list[int]) -> list[int]:
        self.cursor.follow(history[self.n_prompt:])
        run = self.cursor.forced()
        p = self.acceptance
        if run and p < 1.0:
            reach, keep = 1.0, 0
            while keep < len(run) and reach * p >= self.FLOOR:  # the first forced token's reach is p
                reach *= p
                keep += 1
            run = run[:max(keep, 1)]  # one at least: a forced token still holds what the grammar allows
        return run

    def observe(self, forced: int, accepted: int) -> None:
        """A round verified `forced` forced tokens first and accepted `accepted` tokens of its draft."""
        if forced:
            self.accepted += min(accepted, forced)
            self.verified += min(accepted + 1, forced)
