"""Drafters: whatever proposes the next few tokens for the target to verify.

All share one protocol: propose(history, k) -> Draft. The draft model runs a
small LLM in its own llama.cpp context; the n-gram drafter looks the recent
tokens up earlier in the history (prompt lookup) and costs no model at all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..config import SamplingConfig
from ..coupling import Drawer, argmax, gumbel_draw, head_draws
from ..events import Speculator
from ..llama.kvseq import KVSeq, common_prefix
from ..metrics import BusyClock
from ..sampling import HEAD, Heads, Support, head_probs, head_width, reshape_saguaro, support

try:  # a sampled draft step's candidates and draw from one pass over its row (ssd_edge/csrc/module.c)
    from ..native import head_draw as compiled_head_draw
except ImportError:  # pragma: no cover - a build without the extension: a pass for each
    compiled_head_draw = None


@dataclass(frozen=True)
class Draft:
    tokens: tuple[int, ...]
    speculator: Speculator  # who drafted it: "draft", "ngram", "prespec" (Round.speculator once verified)
    # the draft model's top candidates at each drafted position (for SSD's outcome ranking)
    cands: tuple["Candidates", ...] | None = None
    # n-gram drafts: how many history tokens the copied passage matched (the n-gram and its run
    # further back, up to MATCH_CAP); a long match is a copy that tends to go on
    match: int = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def head(self, m: int) -> "Draft":
        """The first m tokens (with their candidates)."""
        if m >= len(self.tokens):
            return self
        return Draft(self.tokens[:m], self.speculator, None if self.cands is None else self.cands[:m], self.match)


@dataclass(frozen=True)
class Candidates:
    """The draft's most likely tokens at one position, with their probabilities."""

    ids: np.ndarray    # (m,) int64, most likely first
    probs: np.ndarray  # (m,) float64


CANDIDATES = 8  # a drafted position's candidates kept for SSD's outcome ranking


def top_candidates(logits: np.ndarray, temperature: float = 1.0, m: int = CANDIDATES) -> Candidates:
    """The draft's m likeliest tokens at `temperature`, from the row's largest logits (sampling.head_probs)."""
    head = head_probs(logits, temperature)
    return Candidates(head.ids[:m], head.p[:m])


EMPTY = Draft((), "none")

# A draft's length rule (planning/proposers.py: StopRule): called before draft token j is drawn,
# with j and the draft's probability of its likeliest token there; returns (draw token j, then step on
# to token j + 1).
GoOn = Callable[[int, float], "tuple[bool, bool]"]


MATCH_CAP = 64  # most history tokens an n-gram match is measured back over


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the history's last n
    tokens (n from ngram_max down to ngram_min) and propose what followed it. The
    draft's `match` says how far back the two passages agree (n, or more where the
    copy runs further back): the planner trusts a long match more.

    It keeps an index of the history it was last asked about (for each n, each n-gram's latest end),
    so a round that only appends tokens costs a few dictionary updates and lookups instead of a pass
    over the whole history (0.06 ms a round right after a CPU decode, most of a planned round's
    lookup); any other history is indexed afresh."""

    name = "ngram"

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4) -> None:
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self._seen: list[int] = []  # the history indexed: every n-gram ending before its last token
        # _ends[n - 1][n-gram] = where its latest occurrence ends in _seen (never at the last token)
        self._ends: list[dict[tuple[int, ...], int]] = [{} for _ in range(max(ngram_max, 0))]

    def propose(self, history: Sequence[int], k: int) -> Draft:
        h = self._index(history)
        n_hist = len(h)
        if n_hist < 2 or k < 1:
            return Draft((), "ngram")
        for n in range(min(self.ngram_max, n_hist - 1), max(self.ngram_min, 1) - 1, -1):
            end = self._ends[n - 1].get(tuple(h[n_hist - n:]))  # the longest n-gram that occurred earlier
            if end is not None:
                start = end + 1  # just after its most recent occurrence
                return Draft(tuple(h[start:start + k]), "ngram", match=_match_length(h, start, n))
        return Draft((), "ngram")

    def _index(self, history: Sequence[int]) -> list[int]:
        """_seen made `history`: extended where it only grew, else rebuilt; the n-grams ending at
        each new position but the last are recorded (the last one's occurrence is the query)."""
        if not isinstance(history, list):
            history = list(history)
        seen, m = self._seen, len(self._seen)
        if len(history) < m or history[:m] != seen:
            seen, m = [], 0
            self._seen = seen
            for ends in self._ends:
                ends.clear()
        seen.extend(map(int, history[m:]))
        for end in range(max(m - 1, 0), len(seen) - 1):  # the ends not indexed yet: the old last token's on
            for n, ends in enumerate(self._ends, 1):
                if end < n - 1:
                    break
                ends[tuple(seen[end - n + 1:end + 1])] = end
        return seen


def _match_length(h: Sequence[int], start: int, n: int) -> int:
    """How many tokens before h[start] equal those before the history's end (at least the n of the
    n-gram that matched, at most MATCH_CAP)."""
    span = min(MATCH_CAP, start)
    if span <= n:
        return n
    before_match = list(h[start - span:start])[::-1]  # before the earlier occurrence, nearest first
    before_end = list(h[len(h) - span:])[::-1]       # before the end of the history, nearest first
    return common_prefix(before_match, before_end)


def draft_probs(logits: np.ndarray, s: SamplingConfig, saguaro_top: int = 2, saguaro_factor: float = 1.0
                ) -> Support | None:
    """The q a draft token is drawn from (with the coupled noise), on its support; None for greedy
    (the argmax)."""
    if s.greedy:
        return None
    ids, q = support(logits, s)
    return Support(ids, reshape_saguaro(q, saguaro_top, saguaro_factor))


def top_probability(logits: np.ndarray, temperature: float = 1.0) -> float:
    """The probability of the likeliest token at `temperature` (--draft-p-min reads it at 1, the planned
    draft length at the drafting temperature), over the row's largest logits (sampling.head_probs)."""
    return float(head_probs(logits, temperature).p[0])


class ModelDrafter:
    """A draft LLM in its own context (sequence 0 of it). Not thread-safe: one
    thread drives it at a time (the engine for `sd`, and `auto` without a worker; the
    pre-speculation worker for `ssd`, and `auto` with one).

    Sampled drafts use the generation's coupled noise (coupling.py): the token drafted for
    position i is argmax(log q + G(seed, i)), the target's own draw there whenever q = p."""

    name = "draft"

    def __init__(self, kv: KVSeq, sampling: SamplingConfig, seed: int, p_min: float = 0.0,
                 busy: BusyClock | None = None, saguaro_top: int = 2, saguaro_factor: float = 1.0,
                 candidates: bool = True, shape: Any = None) -> None:
        self.ctx = kv.ctx
        self.kv = kv  # the main sequence; on a hit SSD's worker moves it onto the branch (KVSeq.adopt)
        self.sampling = sampling
        self.greedy = sampling.greedy  # (read per drafted token: a plain attribute, not the config's property)
        self.seed = seed
        self._draw = Drawer(sampling, seed)  # the target's kind of draw, where q is the sampling distribution
        self.p_min = p_min
        self.busy = busy or BusyClock()
        self.saguaro = (saguaro_top, saguaro_factor)
        # each drafted token's top candidates (Draft.cands), for SSD's outcome ranking: kept only where a
        # pre-speculation worker ranks outcomes (0.04 ms a token over a 152k vocabulary, 3 ms before it was
        # read from the row's head; a draft step on a GPU is 0.25 ms); without, a draft carries none
        self.candidates = candidates
        # the last extend(): (history tokens it had not read, ms reading them with the first row,
        # single draft steps after that, their ms); for the round planner's draft costs
        self.timing: tuple[int, float, int, float] | None = None
        # the generation's row shaping (structured/rows.DraftRows: a grammar's mask, bias, penalties), applied
        # to each row before its token is drawn, as the target's rows get it; None: rows as they come
        self.shape = shape
        self._width = head_width(sampling)
        # a sampled step's candidates and draw from one pass over its row (_candidates): nothing reshapes the
        # row, and its head is wider than the chain's top-k (the whole row's draw, as coupling.head_draws)
        self._one_pass = compiled_head_draw is not None and not self.greedy and self.reads_heads \
            and 0 < sampling.top_k < self._width

    def pick(self, logits: np.ndarray, position: int, cand: Candidates | None = None) -> int:
        """The draft token for sequence position `position`, from one logit row. `cand`: the row's top
        candidates, when read already; greedy, its first is the argmax (ties to the lower id, as
        numpy's argmax), so the row is not read again."""
        if cand is not None and self.greedy:
            return int(cand.ids[0])
        if self.saguaro[1] >= 1.0:  # q is the sampling distribution itself: the target's own kind of draw
            return self._draw(logits, position)
        q = draft_probs(logits, self.sampling, *self.saguaro)
        return argmax(logits) if q is None else gumbel_draw(*q, self.seed, position)

    def _candidates(self, row: np.ndarray, position: int) -> tuple[Candidates, int | None]:
        """The row's candidates; sampled, with the token drawn for `position` where one C pass over the row
        gives both (_one_pass), else None: pick() draws. A second pass for the candidates cost a just-in-time
        draft by SSD's worker 0.34 ms of 8 tokens at T=1 on the priced pair."""
        s = self.sampling
        if self._one_pass and type(row) is np.ndarray and row.dtype == np.float32 and row.flags.c_contiguous \
                and self._width < row.shape[-1]:
            got = compiled_head_draw(row, self._width, HEAD, CANDIDATES, self.cand_temperature(), s.top_k, s.top_p,
                                     s.min_p, s.temperature, int(self.seed) % (1 << 64), int(position) % (1 << 64))
            if got is not None:
                return Candidates(np.frombuffer(got[1], np.int64), np.frombuffer(got[2], np.float64)), got[0]
        return top_candidates(row, self.cand_temperature()), None  # (greedy: pick() reads the argmax off it)

    @property
    def reads_heads(self) -> bool:
        """Whether a branch's rows may come as heads alone (picks()): nothing reshapes its rows (a
        constraint, SAGUARO's q), which would need the whole row."""
        return self.shape is None and self.saguaro[1] >= 1.0

    def picks(self, heads: Heads, positions: Sequence[int]
              ) -> tuple[list[int], list[Candidates], np.ndarray | None]:
        """pick() for the rows a backend handed over as heads (reads_heads): (the tokens, their rows'
        candidates, each row's top probability at temperature 1 where --draft-p-min reads it). Greedy, each head's
        first; sampled, the coupled draw from the head's own sampling distribution (the whole row's draw
        where the head is wider than the chain's top-k, sampling.head_width)."""
        temp = self.cand_temperature()
        p = heads.probs(temp)
        top1 = None if self.p_min <= 0 else p[:, 0] if temp == 1.0 else heads.probs(1.0)[:, 0]
        cands = [Candidates(heads.ids[i, :CANDIDATES], p[i, :CANDIDATES]) for i in range(len(p))]
        if self.greedy:
            return heads.ids[:, 0].tolist(), cands, top1
        return head_draws(heads, self.sampling, self.seed, positions).tolist(), cands, top1

    def propose(self, history: Sequence[int], k: int, cancelled: Callable[[], bool] | None = None,
                go_on: GoOn | None = None, guess: Sequence[int] = ()) -> Draft:
        t0 = time.perf_counter()
        try:
            return self.extend(history, k=k, cancelled=cancelled, go_on=go_on, guess=guess)
        finally:
            self.busy.add(time.perf_counter() - t0)

    def cand_temperature(self) -> float:
        return 1.0 if self.greedy else self.sampling.temperature

    def extend(self, history: Sequence[int], tokens: Sequence[int] = (), cands: Sequence[Candidates] = (),
               k: int = 4, cancelled: Callable[[], bool] | None = None, speculator: Speculator = "draft",
               go_on: GoOn | None = None, guess: Sequence[int] = ()) -> Draft:
        """Continue a draft (tokens and their candidates) that follows `history` until it has k tokens,
        or until `go_on` (asked before each token is drawn, with the draft's probability of its likeliest
        token there) says that token, or the step to the next, is not worth it.

        `guess`: tokens the draft is likely to draw next (an n-gram copy), read in the same batch as
        what the draft has not read yet. While the draft draws exactly the guessed tokens, the row
        for its next token is already there and costs no step; from the first token it draws
        otherwise, it steps as usual. Each token is drawn from its own row either way, so a guess
        makes a draft faster, not different (up to a batch's rounding at a near-tie, as in any read
        of several tokens; the target verifies whatever is drawn)."""
        toks, cands = list(tokens), list(cands)
        full = list(history) + toks
        guess = list(guess[:max(0, k - len(toks) - 1)])  # the last token drawn needs no row after it
        unread = max(0, len(full) - common_prefix(self.kv.tokens, full) - 1)
        t0 = time.perf_counter()
        read = unread + len(guess)  # tokens read beside the first row
        rows = self.kv.feed(full + guess, len(guess) + 1, cancelled)
        row = rows[0]
        t1 = time.perf_counter()
        steps, base, first = 0, len(full), len(toks)
        temperature = self.cand_temperature()
        shape = self.shape
        while len(toks) < k:
            if shape is not None:
                forced = shape.forced(history, toks)[:k - len(toks)]
                if forced:  # the grammar's only continuation: drafted without drawing, read in one batch
                    if guess:
                        self.kv.truncate(base + len(toks) - first)
                        guess = []
                    toks.extend(forced)
                    if self.candidates:
                        cands.extend(Candidates(np.array([t]), np.ones(1)) for t in forced)
                    if len(toks) == k:
                        break
                    row = self.kv.feed(list(history) + toks, 1, cancelled)[0]
                    steps += 1
                shape(row, history, toks)
            top1 = top_probability(row) if self.p_min > 0 else None  # --draft-p-min reads it at temperature 1
            if top1 is not None and top1 < self.p_min:
                break
            cand, drawn = self._candidates(row, base + len(toks) - first) if self.candidates else (None, None)
            more = True
            if go_on is not None:
                if cand is not None:
                    p_top = float(cand.probs[0])
                elif top1 is not None and temperature == 1.0:
                    p_top = top1  # the same number: computed once
                else:
                    p_top = top_probability(row, temperature)
                take, more = go_on(len(toks), p_top)
                if not take:
                    break  # decided before the token is drawn: what is verified never depends on what is drawn
            j = len(toks) - first  # this token's index among the ones drawn in this call
            t = drawn if drawn is not None else self.pick(row, base + j, cand)
            toks.append(t)
            if cand is not None:
                cands.append(cand)
            if len(toks) == k:
                break
            if j < len(guess) and t == guess[j]:
                row = rows[j + 1]  # the guess held: the next row was read with it
                continue
            if not more:
                break
            if guess:
                self.kv.truncate(base + j)  # the guess parted from the draft here: its rows go
                guess = []
            row = self.kv.step(t)
            steps += 1
        self.timing = (read, (t1 - t0) * 1e3, steps, (time.perf_counter() - t1) * 1e3)
        return Draft(tuple(toks), speculator, tuple(cands) if self.candidates else None)
