"""The Backend protocol: what the engine needs of a model and a context.

ssd_edge/llama/backend.py implements it with llama.cpp; tests/fakes.py
implements it with a tiny deterministic model. Nothing here imports llama_cpp,
so the engine, the drafters and SSD import (and are tested) without the
compiled library. Aborted and ModelInfo live here because both
implementations share them; backend.py re-exports them under their old names.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

import numpy as np


class Aborted(Exception):
    """A decode stopped by its abort flag. llama.cpp has removed the batch's positions
    from the KV cache, so every sequence is as it was before the call."""


@dataclass(frozen=True)
class ModelInfo:
    path: str
    description: str
    n_params: int
    size_bytes: int
    n_vocab: int
    n_layer: int
    n_ctx_train: int
    gpu_layers: int  # layers really offloaded (0 on a CPU-only build, whatever was asked)
    kv_bytes_per_cell: int  # K+V bytes one token occupies in the KV cache (f16 cache)

    @property
    def device(self) -> str:
        """Where its layers run: 'CPU', or 'GPU 29/29 layers' (the output layer counts as one)."""
        return f"GPU {self.gpu_layers}/{self.n_layer + 1} layers" if self.gpu_layers else "CPU"



@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's fill-in-the-middle tokens (llama.cpp's llama_vocab_fim_*): prefix, suffix and middle
    always; the pad, repository-name and file-separator tokens where the vocabulary has them (None if not)."""

    pre: int
    suf: int
    mid: int
    pad: int | None = None
    rep: int | None = None
    sep: int | None = None


class DecodeClock:
    """Time spent inside decode calls (llama_decode, or a priced backend's wait) and the logit rows they
    returned, per thread: a backend adds each decode to the thread that made it, and the engine reads
    its own thread's totals before and after a generation. Its wall time less that is the host's work
    (Python, sampling, planning, copying rows): Stats.host_ms_per_position."""

    def __init__(self) -> None:
        self._local = threading.local()

    def here(self) -> DecodeTotals:
        """The calling thread's totals: one object a thread, which add() updates in place (a reader on
        that thread may keep it and read its fields, as the meter does each round)."""
        try:
            return self._local.totals
        except AttributeError:  # this thread's first use
            totals = self._local.totals = DecodeTotals()
            return totals

    def add(self, seconds: float, rows: int) -> None:
        totals = self.here()
        totals.seconds += seconds
        totals.rows += rows

    def read(self) -> tuple[float, int]:
        """(seconds inside decodes, rows returned) on the calling thread, since it started."""
        totals = self.here()
        return totals.seconds, totals.rows


class DecodeTotals:
    """One thread's time inside decodes and the rows they returned (DecodeClock.here)."""

    __slots__ = ("seconds", "rows")

    def __init__(self) -> None:
        self.seconds, self.rows = 0.0, 0


DECODES = DecodeClock()  # the one clock every backend adds to; per thread, so no lock

@runtime_checkable
class BackendModel(Protocol):
    """A loaded model: its vocabulary and chat template. May back several contexts."""

    path: Path
    n_vocab: int

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]: ...

    def piece(self, token: int) -> bytes:
        """The bytes of one token (special tokens render as empty)."""

    def is_eog(self, token: int) -> bool: ...

    def eot(self) -> int:
        """The end-of-text token (llama_vocab_eot, else its end of sequence): what llama.cpp's infill
        sampler ends with."""

    def fim_tokens(self) -> FimTokens | None:
        """The fill-in-the-middle tokens, None where the vocabulary lacks prefix, suffix or middle."""

    def render_chat(self, messages: Sequence[dict[str, str]], add_assistant: bool = True) -> str: ...

    def close(self) -> None: ...


@runtime_checkable
class AbortSignal(Protocol):
    """Polled during a decode: set() makes the decode in flight (or the next) raise Aborted."""

    def set(self) -> None: ...

    def clear(self) -> None: ...

    def is_set(self) -> bool: ...


@runtime_checkable
class BackendContext(Protocol):
    """One KV cache with its thread count. Never used from two threads at once.

    With n_seq_max > 1 the cache is unified: a cell may belong to several
    sequences, seq_cp adds a sequence to cells without copying them, and one
    batch can decode tokens of many sequences.
    """

    model: BackendModel
    n_ctx: int
    n_batch: int
    n_seq_max: int
    threads: int
    abort: AbortSignal

    def set_threads(self, threads: int) -> None: ...

    def decode(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int | Sequence[int]],
               logits_for: Sequence[int], copy: bool = True) -> np.ndarray:
        """Decode one batch; float32 logit rows (len(logits_for), n_vocab) for the listed batch indices.
        A sequence's first position in the batch must be one past its last stored position.
        copy=False: the rows may be a view valid only until this context's next decode."""

    def seq_rm(self, seq: int, p0: int = 0, p1: int = -1) -> None:
        """Remove positions [p0, p1) of `seq` (p1 = -1: to the end)."""

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None: ...

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Move the cells of `seq` at positions [p0, p1) by `delta` positions (llama_memory_seq_add: their
        keys are rotated to the new positions at the next decode). The positions they move to must be free."""

    def can_shift(self) -> bool:
        """Whether seq_add works on this cache (llama_memory_can_shift)."""

    def seq_pos_max(self, seq: int) -> int:
        """Last stored position of `seq`, -1 when empty."""

    def clear(self) -> None: ...

    def close(self) -> None: ...
