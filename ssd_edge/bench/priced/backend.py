"""PricedModel and PricedContext: the Backend protocol (interface.py) over a synthetic language model whose
decodes wait the price of a measured GPU (prices.py) instead of computing.

The language (151,936 tokens, Qwen's vocabulary size; 0..255 bytes, then words, then the specials):
  target  the favourite next token is a splitmix hash of the sequence's last 3 tokens and the position
          (never an end of generation, so every answer runs to its length). Its row: one of POOL rows of
          N(-4, 1) noise (chosen by the same hash), the favourite at PEAK, two other candidates below it.
          At T=1 the favourite has p 0.90, the runner-up 0.06 (kept by top-k 40, top-p 0.95, min-p 0.05),
          the third 0.03, the other 151,000 tokens 0.01 together.
  draft   agrees with the target on a context when another hash of it, as a fraction of 2^64, is below
          `agreement`: then its row is the target's, bit for bit, so coupled sampling draws the same
          token. Otherwise it favours another token, in another noise row; the target's favourite is its
          runner-up on half of those contexts (a miss its candidates predict) and absent on the others.
  ties    (PricedModel(ties=f), tests) on a fraction f of the contexts the target's two candidates nearly
          tie and a batch ranks them the other way, as a GPU's batched kernels can: the runner-up
          TIE_GAP below the favourite in a one-token decode's row, TIE_GAP above it in a batch's. Greedy
          ar and a verify then choose differently there, and only a near-tie proof may excuse it
          (tests/lossless_check.py). The draft's row, where it agrees, is the target's, tie included.

A decode stores the batch's cells (cells.py: the KV cache as llama.cpp keeps it, so a wrong rollback
gives wrong rows) and waits out the batch's price with the GIL released (PricedContext._wait: spinning,
as a CUDA host thread does, until the abort signal's byte is set; a sleep where ssd_edge.native is not
built), building the wanted rows (or only their heads: decode_heads) at the end of it: its wall time is
the price, or the time the rows took where that is longer. The measured time goes on interface.DECODES,
as llama_decode's time does.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

import numpy as np

from ...coupling import mix64
from ...errors import DecodeError
from ...interface import DECODES, Aborted, ModelInfo
from ...sampling import Heads
from .cells import CellCache, seq_ids
from .prices import HEAD_DECODE_MS, HEAD_ROW_MS, Curve, PriceTable

try:  # the busy wait and the rows' copies (ssd_edge/csrc/priced.c); without them, decodes sleep their price
    from ...native import copy_rows, priced_choices, spin
except ImportError:  # pragma: no cover - a build without the extension
    copy_rows = priced_choices = spin = None


class SpinFlag:
    """A priced context's abort signal: a threading.Event, mirrored in a byte the compiled spin polls, so a
    wait needs the interpreter's lock only to begin and to end (one that took it back to look at an Event
    every half millisecond waited on SSD's worker's Python each time: a verify of 4.4 ms took 5)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._byte = ctypes.create_string_buffer(1)
        self.address = ctypes.addressof(self._byte)

    def set(self) -> None:
        self._byte[0] = b"\x01"
        self._event.set()

    def clear(self) -> None:
        self._event.clear()
        self._byte[0] = b"\x00"

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


MAKING_MARGIN_S = 20e-6  # (see PricedContext._decode)
C_CHOICES_FROM = 3  # rows from which a decode's picks are made in C (below, the Python is faster than the arrays)

N_VOCAB = 151_936
SPECIALS = {"<|endoftext|>": 151_643, "<|im_start|>": 151_644, "<|im_end|>": 151_645}
EOG = frozenset({151_643, 151_645})
WORD0, N_WORDS = 256, 151_643 - 256  # word ids: WORD0 .. WORD0 + N_WORDS - 1; below them the 256 bytes
CONTEXT = 3                          # tokens the next token depends on (with the position)

POOL = 8            # noise rows, N(-4, 1) float32 (a tail of 0.01 at T=1); specials at -30 (never drawn)
PEAK = 13.0         # the favourite's logit: p 0.91 at T=1 beside the two below and the noise
SECOND = PEAK - 2.7  # p 0.06
THIRD = PEAK - 3.5   # p 0.03
RUNNER_UP = 0.5     # share of the draft's misses where the target's favourite is its second choice
TIE_GAP = 0.15      # a planted tie: the runner-up this far below the favourite (one token), above it (a batch)

_M64 = (1 << 64) - 1
_AGREE, _DRAFT, _TIE = 0x5EED_A9E5, 0xD4AF_7001, 0x71E5_0B0E  # salts: the draft's coin per context, its own
                                                             # choice, a planted tie's coin


def mix(x: int) -> int:
    """splitmix64's step (the golden increment, then its finaliser, coupling.mix64): a well-spread
    64-bit hash of a 64-bit integer."""
    return mix64((x + 0x9E3779B97F4A7C15) & _M64)


def context_hash(tail: Sequence[int], pos: int) -> int:
    h = mix(pos)
    for t in tail:
        h = mix(h ^ t)
    return h


def _word(h: int, *avoid: int) -> int:
    w = WORD0 + h % N_WORDS
    while w in avoid:
        w = WORD0 + (w - WORD0 + 1) % N_WORDS
    return w


@functools.lru_cache(maxsize=1)
def noise() -> np.ndarray:
    """(POOL, N_VOCAB) float32: the rows a logit row starts from."""
    rows = np.random.default_rng(0).standard_normal((POOL, N_VOCAB), dtype=np.float32) - np.float32(4.0)
    rows[:, WORD0 + N_WORDS:] = -30.0
    return rows


def choices(tail: Sequence[int], pos: int, agreement: float | None, ties: float = 0.0
            ) -> tuple[int, int, int, int, bool]:
    """(noise row, favourite, second, third, tied) after `tail` ending at `pos`: the target's (agreement
    None), or the draft's; tied: the target's two candidates nearly tie here (a fraction `ties` of the
    contexts), so a batch ranks them the other way (rows_for)."""
    h = context_hash(tail, pos)
    fav = _word(h)
    tied = ties > 0.0 and mix(h ^ _TIE) < ties * 2**64
    target = (h % POOL, fav, _word(mix(h ^ 1), fav), _word(mix(h ^ 2), fav), tied)
    if agreement is None or mix(h ^ _AGREE) < agreement * 2**64:
        return target
    d = mix(h ^ _DRAFT)
    mine = _word(d, fav)
    second = fav if mix(d ^ 3) < RUNNER_UP * 2**64 else _word(mix(d ^ 1), fav, mine)
    return (d % POOL, mine, second, _word(mix(d ^ 2), fav, mine, second), False)


def rows_for(picks: Sequence[tuple[int, int, int, int, bool]], out: np.ndarray | None = None,
             batched: bool = False) -> np.ndarray:
    """(len(picks), N_VOCAB) float32 logit rows for choices(): new, or written into `out`. A tied pick's
    runner-up sits TIE_GAP below the favourite, or above it in a batch's row (`batched`)."""
    if not picks:
        return np.empty((0, N_VOCAB), np.float32)
    p = np.asarray(picks, dtype=np.int64)
    if copy_rows is not None:  # the copies with the interpreter's lock released: the device's work, not the host's
        out = np.empty((len(p), N_VOCAB), np.float32) if out is None else out
        copy_rows(out, noise(), np.ascontiguousarray(p[:, 0]), N_VOCAB)
    else:
        out = np.take(noise(), p[:, 0], axis=0, out=out)
    at = np.arange(len(p))
    out[at, p[:, 1]] = PEAK
    out[at, p[:, 2]] = np.where(p[:, 4] != 0, PEAK + (TIE_GAP if batched else -TIE_GAP), SECOND)
    out[at, p[:, 3]] = THIRD
    return out


@functools.lru_cache(maxsize=None)
def noise_heads(width: int) -> tuple[np.ndarray, np.ndarray, tuple[frozenset[int], ...]]:
    """Each noise row's `width` largest values and their ids, most likely first ((POOL, width) int64 and
    float32), and each row's head ids as a set."""
    rows = noise()
    ids = np.argsort(-rows, axis=1, kind="stable")[:, :width]
    return ids, np.take_along_axis(rows, ids, axis=1), tuple(frozenset(r.tolist()) for r in ids)


def heads_for(picks: Sequence[tuple[int, int, int, int, bool]], width: int, batched: bool = False) -> Heads:
    """The heads (sampling.Heads) of rows_for(picks, batched=batched) without building the rows: each
    row's three planted tokens (favourite, second, third; a tie's second first in a batch), then its noise
    row's head without them."""
    p = np.asarray(picks, dtype=np.int64).reshape(-1, 5)
    noise_ids, noise_vals, noise_sets = noise_heads(width + 3)
    ids = np.empty((len(p), width), np.int64)
    logits = np.empty((len(p), width), np.float32)
    ids[:, :3], logits[:, :3] = p[:, 1:4], (PEAK, SECOND, THIRD)
    ids[:, 3:], logits[:, 3:] = noise_ids[p[:, 0], :width - 3], noise_vals[p[:, 0], :width - 3]
    tied = np.flatnonzero(p[:, 4])
    if len(tied):
        logits[tied, 1] = PEAK + (TIE_GAP if batched else -TIE_GAP)
        if batched:  # the runner-up above the favourite
            ids[tied, :2], logits[tied, :2] = ids[tied, 1::-1], logits[tied, 1::-1]
    for i, (r, fav, second, third, _) in enumerate(picks):
        if fav in noise_sets[r] or second in noise_sets[r] or third in noise_sets[r]:  # (rare) also in the noise's head
            keep = ~np.isin(noise_ids[r], (fav, second, third))
            ids[i, 3:], logits[i, 3:] = noise_ids[r][keep][:width - 3], noise_vals[r][keep][:width - 3]
    return Heads(ids, logits)


# ---------------------------------------------------------------- the vocabulary

SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "ta", "vo", "si", "pe", "da",
             "go", "hu", "be", "ri", "zu", "fa", "to", "le", "ma", "no")
_PIECES = re.compile(r"\s?\w+|\s?[^\w\s]+|\s+")
_SPECIAL = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")


@functools.lru_cache(maxsize=1 << 16)
def word_piece(token: int) -> bytes:
    """A readable word for a word id: its index in base 20, one syllable a digit, after a space."""
    n, out = token - WORD0, []
    while True:
        n, d = divmod(n, len(SYLLABLES))
        out.append(SYLLABLES[d])
        if not n:
            return (" " + "".join(reversed(out))).encode()


class PricedModel:
    """One side of a priced pair: the target, or the draft that agrees with it at `agreement`; `ties`:
    the fraction of contexts with a planted near-tie that a batch ranks the other way (module doc)."""

    def __init__(self, table: PriceTable, role: str, agreement: float | None = None, ties: float = 0.0) -> None:
        if not 0.0 <= ties <= 1.0:
            raise ValueError(f"ties must be a fraction between 0 and 1, not {ties}")
        self.table, self.role = table, role
        self.agreement = agreement if role == "draft" else None
        self.ties = ties
        # how far a batch's row differs from a one-token row (at a tied runner-up), for near-tie proofs
        self.batch_shift = 2 * TIE_GAP if ties else 0.0
        self.curve: Curve = table.curve(role)
        self.path = Path(f"/priced/{table.name}-{role}")  # no file: calibration profiles skip it
        self.n_vocab = N_VOCAB
        noise()  # made now (once a process, ~30 ms), not in the first decode's price

    def price_s(self, n: int) -> float:
        """Seconds one decode of n tokens costs."""
        return self.curve.ms(n) / 1e3

    def info(self) -> ModelInfo:
        s = self.table.shape(self.role)
        return ModelInfo(path=str(self.path), description=f"priced: {self.table.device} table {self.table.name}, "
                         f"{s.name} ({self.role})", n_params=s.n_params, size_bytes=s.size_bytes, n_vocab=N_VOCAB,
                         n_layer=s.n_layer, n_ctx_train=32_768, gpu_layers=s.n_layer + 1,
                         kv_bytes_per_cell=s.kv_bytes_per_cell)

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Words and runs of punctuation (with a leading space) to ids: a single byte is its byte's
        id, a longer piece a word id by hash; with parse_special the chat markers are their tokens."""
        out = []
        for part in (_SPECIAL.split(text) if parse_special else [text]):
            if part in SPECIALS:
                out.append(SPECIALS[part])
                continue
            for piece in _PIECES.findall(part):
                b = piece.encode()
                out.append(b[0] if len(b) == 1 else
                           _word(int.from_bytes(hashlib.blake2b(b, digest_size=8).digest(), "little")))
        return out

    def piece(self, token: int) -> bytes:
        if token < WORD0:
            return bytes([token])
        return word_piece(token) if token < WORD0 + N_WORDS else b""  # special tokens render as empty

    def is_eog(self, token: int) -> bool:
        return token in EOG

    def eot(self) -> int:
        return SPECIALS["<|endoftext|>"]

    def fim_tokens(self) -> None:
        """A priced pair has no fill-in-the-middle tokens."""
        return None

    def render_chat(self, messages: Sequence[dict[str, str]], add_assistant: bool = True) -> str:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_assistant else "")

    def close(self) -> None: ...


class PricedContext(CellCache):
    """A KV cache of a priced model. Never used from two threads at once; two contexts wait in parallel."""

    def __init__(self, model: PricedModel, n_ctx: int = 4096, n_batch: int = 512, n_seq_max: int = 1,
                 threads: int = 1) -> None:
        super().__init__(n_ctx, n_seq_max)
        self.model = model
        self.n_batch = n_batch
        self.threads = threads
        self.abort = SpinFlag()
        self._out = np.empty((0, N_VOCAB), np.float32)  # the rows decode(copy=False) hands out, as llama.cpp's buffer
        self._late = 0.0  # seconds a wait has been waking up late lately (an average the waits aim early by)
        self._making = 0.0  # seconds a decode's rows took to make lately (made that long before its price is up)
        self.wake: Any = None  # SSD's Wake (prespec/handoff.py), bumped as each decode starts, where the worker set it
        self.started = 0.0  # perf_counter() as the last decode began

    def set_threads(self, threads: int) -> None:
        self.threads = threads  # a price is the GPU's: the host's threads change nothing

    def decode(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int | Sequence[int]],
               logits_for: Sequence[int], copy: bool = True) -> np.ndarray:
        """Decode one batch: its cells stored, its rows built, the rest of its price waited out. copy=False:
        the rows are written into the context's own buffer (valid until its next decode), whose pages
        stay mapped, as llama.cpp's output buffer does."""
        if len(tokens) == 0:
            return np.empty((0, N_VOCAB), np.float32)

        def rows(picks: list, batched: bool) -> np.ndarray:
            if not copy and len(self._out) < len(picks):
                self._out = np.empty((len(picks), N_VOCAB), np.float32)
            return rows_for(picks, None if copy else self._out[:len(picks)], batched=batched)
        return self._decode(tokens, positions, seqs, logits_for, 0.0, rows)

    def decode_heads(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int | Sequence[int]],
                     logits_for: Sequence[int], width: int) -> Heads:
        """decode(), handing over each wanted row's head (its `width` largest logits, sampling.Heads)
        instead of the row, as a GPU's top-k on the device does (llama.cpp's backend sampling): priced at
        HEAD_DECODE_MS and HEAD_ROW_MS a row more (an estimate, prices.py); no row is built on the host."""
        extra_ms = HEAD_DECODE_MS + len(logits_for) * HEAD_ROW_MS
        return self._decode(tokens, positions, seqs, logits_for, extra_ms / 1e3,
                            lambda picks, batched: heads_for(picks, width, batched=batched))

    def _decode(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int | Sequence[int]],
                logits_for: Sequence[int], extra_s: float, make: Callable[[list, bool], Any]) -> Any:
        """A decode priced at its size plus extra_s: its cells stored, what `make` builds of the wanted rows'
        choices, then the rest of its price waited out (the timing and abort rules of decode())."""
        t0 = self.started = time.perf_counter()
        n = len(tokens)
        if n > self.n_batch:
            raise DecodeError(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        if self.abort.is_set():
            raise Aborted()
        price = self.model.price_s(n) + extra_s
        cells = self.store(tokens, positions, seqs)
        # The rows are the device's work, made at the end of the wait (begun twice as long before its end
        # as they took lately, and a margin; at once where that is the whole price: late, they would
        # lengthen the decode): until then this thread leaves the interpreter to the others, as a host
        # thread waiting for its GPU does (made first, the target's rows kept SSD's worker from starting
        # its branches for half a millisecond of each verify)
        if not self._wait(t0 + price - min(2.0 * self._making + MAKING_MARGIN_S, price), self.wake):
            self._aborted(t0, cells)
        t_make = time.perf_counter()
        out = make(self._choices([seq_ids(seqs[i])[0] for i in logits_for], [positions[i] for i in logits_for]),
                   n > 1)
        self._making = 0.5 * self._making + 0.5 * (time.perf_counter() - t_make)
        if not self._wait(t0 + price):
            self._aborted(t0, cells)
        took = time.perf_counter() - t0
        self._late = min(max(self._late + 0.2 * (took - price), 0.0), price / 2)
        DECODES.add(took, len(logits_for))  # as measured, as the llama backend adds it
        return out

    def _aborted(self, t0: float, cells: list[int]) -> NoReturn:
        """An aborted decode (begun at t0): as llama.cpp does, the cache is left as it was (its cells
        unstored); the time it took goes on the decode clock, with no row."""
        self.unstore(cells)
        DECODES.add(time.perf_counter() - t0, 0)
        raise Aborted()

    def _choices(self, seqs: list[int], positions: list[int]) -> list:
        """choices() after each (sequence, position): in C where the extension is built (the same picks)."""
        agreement, ties = self.model.agreement, self.model.ties
        if priced_choices is None or len(seqs) < C_CHOICES_FROM:
            return [choices(self.tail(s, p, CONTEXT), p, agreement, ties) for s, p in zip(seqs, positions)]
        tails, lengths = self.tails(seqs, positions, CONTEXT)
        got = priced_choices(np.ascontiguousarray(tails), lengths.astype(np.int64), np.asarray(positions, np.int64),
                             -1.0 if agreement is None else agreement, ties, POOL, RUNNER_UP)
        return np.frombuffer(got, np.int64).reshape(-1, 5).tolist()

    def _wait(self, until: float, wake: Any = None) -> bool:
        """Wait until perf_counter() reaches `until` as a CUDA host thread waits for its GPU: spinning,
        the interpreter's lock released (the compiled spin, which polls the abort flag's byte), so the
        core stays awake and its caches warm for the Python that follows. A sleep instead costs that
        Python ~0.13 ms a token here (a core woken cold). Without the compiled part: an Event wait, aimed
        early by what the last waits overshot (the VM's timer wakes 50-170 us late). False: aborted. wake:
        SSD's Wake, bumped as the wait begins (from C, the lock released, as a llama.cpp decode's)."""
        left = until - time.perf_counter()
        if wake is not None and (spin is None or left <= 0):
            wake.bump()
        if spin is None:
            return not self.abort.wait(max(0.0, left - self._late))
        if left <= 0:
            return not self.abort.is_set()
        return spin(left, self.abort.address, wake.address) if wake is not None else spin(left, self.abort.address)

    def close(self) -> None: ...
