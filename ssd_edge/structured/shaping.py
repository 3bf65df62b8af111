"""A row's shaping before its draw: logit bias, penalties, the grammar's mask, llama.cpp's infill sampler
where asked (in that order; then the sampling chain's top-k, top-p, min-p and temperature, sampling.py).

Every shaping is a function of the answer's tokens before the row's position, and of nothing else. So
the target's draw at a position (coupling.py) is still a function of the row, the seed, the position
and the prefix: whichever proposer drafted the prefix, and whether a draft was accepted or rejected,
the committed tokens are those of mode ar under the same constraint. That is what keeps every mode
lossless under a grammar.

    Shaping   one generation's settings: the compiled grammar (its first matcher), the bias, the penalties
    Cursor    one reader of rows: a matcher of its own, following whatever answer prefix it is given
              (the target's verify rows: the committed answer then the draft; the draft's own rows; an SSD
              branch's), rolling back where the prefix parts from what it consumed. One cursor per thread.

Penalties count the answer's own tokens (OpenAI's presence and frequency penalties), not the prompt's.
A grammar with a trigger (tool calls under tool_choice "auto") applies from the trigger token on; the
text before it is free.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..config import SamplingConfig
from ..llama.kvseq import common_prefix
from .constraint import Compiled
from .infill_filter import InfillFilter

try:  # compiled at install (setup.py); without it numpy masks the same
    from ..native import mask as compiled_mask
except ImportError:  # pragma: no cover - a build without the extension
    compiled_mask = None


class Shaping:
    """One generation's row shaping; cursor() makes the readers that apply it."""

    def __init__(self, sampling: SamplingConfig, compiled: Compiled | None = None, tokenizer: Any = None,
                 is_eog: Any = None, model: Any = None) -> None:
        bias = sampling.logit_bias
        self.bias = (np.array(list(bias), dtype=np.int64), np.array(list(bias.values()), dtype=np.float32)) \
            if bias else None
        self.presence, self.frequency = sampling.presence_penalty, sampling.frequency_penalty
        self.compiled = compiled
        self.matcher = None
        if compiled is not None:
            from llguidance import LLMatcher

            self.matcher = LLMatcher(tokenizer, compiled.grammar, log_level=0)
            if self.matcher.is_error():  # compile() validated it: only a tokenizer mismatch gets here
                raise ValueError(f"grammar: {self.matcher.get_error()}")
            self.words = (tokenizer.vocab_size + 31) // 32
        self.trigger = compiled.trigger if compiled is not None else None
        self.is_eog = is_eog or (lambda t: False)
        self.penalises = self.presence != 0.0 or self.frequency != 0.0
        # llama.cpp's infill sampler, last (it reads the row the others shaped); `model`: its vocabulary
        self.infill = InfillFilter(sampling, model.piece, model.is_eog, model.eot()) \
            if sampling.infill and model is not None else None

    @property
    def active(self) -> bool:
        """Whether any row changes at all."""
        return self.matcher is not None or self.bias is not None or self.penalises or self.infill is not None

    def draws(self, sampling: SamplingConfig) -> SamplingConfig:
        """The sampling the draws after this shaping run with: under the infill sampler, which has applied
        top-p and min-p itself (before it, as llama.cpp's chain does), without them."""
        return sampling.model_copy(update=dict(top_p=1.0, min_p=0.0)) if self.infill is not None else sampling

    def cursor(self) -> "Cursor":
        return Cursor(self)


class Cursor:
    """A reader of rows that follows an answer prefix: follow(answer) brings its matcher and counts to the
    state after `answer`, shape(row) then applies the bias, the penalties and the mask."""

    def __init__(self, shaping: Shaping) -> None:
        self.s = shaping
        self.matcher = shaping.matcher.deep_copy() if shaping.matcher is not None else None
        self.tokens: list[int] = []  # the answer prefix followed
        self.start = 0 if shaping.trigger is None else None  # where the grammar begins in tokens (None: not yet)
        self.fed = 0  # tokens from `start` on that the matcher consumed
        self.refused: int | None = None  # index of the first token the grammar refused (rows after it: free)
        self.counts: dict[int, int] = {}
        self.mask = np.empty(shaping.words, dtype=np.int32) if self.matcher is not None else None

    # ------------------------------------------------------------ following an answer
    def follow(self, answer: Sequence[int]) -> None:
        """Be at the state after `answer` (the answer's tokens, not the prompt's)."""
        toks = self.tokens
        n = common_prefix(toks, answer if type(answer) is list else list(answer))
        if n < len(toks):
            self._drop(len(toks) - n)
        for t in answer[n:]:
            self.push(int(t))

    def push(self, t: int) -> None:
        """One more answer token."""
        i = len(self.tokens)
        self.tokens.append(t)
        if self.s.penalises:
            self.counts[t] = self.counts.get(t, 0) + 1
        m = self.matcher
        if m is None or self.refused is not None:
            return
        if self.start is None:
            if t != self.s.trigger:
                return
            self.start = i
        if self.s.is_eog(t):
            return  # the answer ends with it: nothing to consume
        if self.fed == i - self.start and m.try_consume_tokens([t]) == 1:
            self.fed += 1
        else:
            self.refused = i

    def _drop(self, n: int) -> None:
        keep = len(self.tokens) - n
        gone = self.tokens[keep:]
        del self.tokens[keep:]
        if self.s.penalises:
            for t in gone:
                c = self.counts[t] - 1
                if c:
                    self.counts[t] = c
                else:
                    del self.counts[t]
        if self.matcher is None:
            return
        if self.refused is not None and self.refused >= keep:
            self.refused = None
        if self.start is not None:
            fed = max(0, keep - self.start)
            if fed < self.fed:
                self.matcher.rollback(self.fed - fed)
                self.fed = fed
            if self.start >= keep:
                self.start = None if self.s.trigger is not None else 0

    def fork(self) -> "Cursor":
        """A cursor of its own at this one's state, for a pre-speculated branch to grow from: pushes on
        either leave the other as it is (llguidance's deep_copy: a few microseconds)."""
        c = Cursor.__new__(Cursor)
        c.s, c.tokens, c.counts = self.s, list(self.tokens), dict(self.counts)
        c.matcher = self.matcher.deep_copy() if self.matcher is not None else None
        c.start, c.fed, c.refused = self.start, self.fed, self.refused
        c.mask = np.empty_like(self.mask) if self.mask is not None else None
        return c

    # ------------------------------------------------------------ the grammar's view
    @property
    def constrained(self) -> bool:
        """Whether the next row is masked: a grammar that has begun and holds the prefix."""
        return self.matcher is not None and self.start is not None and self.refused is None

    def forced(self) -> list[int]:
        """The tokens the grammar allows as the only continuation after the prefix (llguidance's
        fast-forward tokens: one canonical split of the forced bytes; [] where nothing is forced)."""
        if not self.constrained or self.matcher.is_stopped():
            return []
        return self.matcher.compute_ff_tokens()

    def allowed(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, in order after the prefix, the grammar allows (all, with no grammar)."""
        if not self.constrained:
            return len(tokens)
        return self.matcher.validate_tokens(list(tokens))

    def finished(self) -> bool:
        """Whether the grammar is complete: only an end token may follow."""
        return self.constrained and self.matcher.is_stopped()

    # ------------------------------------------------------------ shaping a row
    def shape(self, row: np.ndarray, mask: bool = True) -> bool:
        """Bias, penalties and the grammar's mask on `row` (float32, in place), for the position after
        the prefix followed. mask=False: the mask is filled (self.mask) but left for the draw to apply
        (native.masked_draw, which need not write -inf over a row it mostly refuses). Returns whether a
        mask applies."""
        s = self.s
        if s.bias is not None:
            ids, add = s.bias
            ok = ids < len(row)
            row[ids[ok]] += add[ok]
        if self.counts:
            ids = np.fromiter(self.counts, dtype=np.int64, count=len(self.counts))
            n = np.fromiter(self.counts.values(), dtype=np.float32, count=len(self.counts))
            ok = ids < len(row)  # a draft's vocabulary may stop short of the target's padding tokens
            row[ids[ok]] -= (s.presence + s.frequency * n)[ok]
        constrained = self.constrained
        if constrained:
            self.matcher.unsafe_compute_mask_ptr(self.mask.ctypes.data, self.mask.nbytes)
            if mask or s.infill is not None:  # (the infill sampler reads the masked row)
                apply_mask(row, self.mask)
        if s.infill is not None:
            s.infill(row)
        return constrained

    def __call__(self, row: np.ndarray, answer: Sequence[int], mask: bool = True) -> bool:
        """follow(answer) then shape(row, mask)."""
        self.follow(answer)
        return self.shape(row, mask)


def apply_mask(row: np.ndarray, mask: np.ndarray) -> None:
    """-inf on every token whose bit in `mask` (int32 words, bit i of word w is token 32 w + i) is 0, and
    past the mask's end; in C where the extension is built (a word at a time: all-allowed words are
    skipped, all-refused ones written at once)."""
    if compiled_mask is not None and row.dtype == np.float32 and row.flags.c_contiguous:
        compiled_mask(row, mask)
        return
    ok = np.unpackbits(mask.view(np.uint8), bitorder="little").view(bool)
    n = min(len(row), len(ok))
    row[:n][~ok[:n]] = -np.inf
    row[n:] = -np.inf
