"""A llama_context over a loaded Model (model.py): its KV cache and sequences (seq_rm, seq_cp,
seq_pos_max, clear), thread count and batch buffer; decode (a batch in, logit rows out, as views of
llama.cpp's output buffer or copies), steps (mode ar's plain steps in one C call, ssd_edge/csrc/steps.c),
and the abort flag llama.cpp polls during a decode. Never use a Context from two threads at once; two
Contexts decode in parallel (ctypes releases the GIL during llama_decode).
"""

from __future__ import annotations

import ctypes
import time
from typing import Any, Sequence

import numpy as np

from ..errors import ContextFullError, DecodeError
from ..interface import DECODES, Aborted
from ..memory import parse_buffers
from .library import capture_log, ll, signals_held
from .model import Model
from .rpc_guard import GUARD

try:  # plain steps in one C call (Context.steps); without the extension, each step is a round of the engine's
    from ..native import decode_woken, steps as native_steps
except ImportError:  # pragma: no cover - a build without the extension
    native_steps = decode_woken = None


# llama.cpp's enum values (ggml_type; llama_flash_attn_type), spelled here so that importing this
# module does not load the library (library.ll is lazy); tests/real checks them against llama_cpp's
KV_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}

_FLOATS: dict[int, Any] = {}  # ctypes array types by length: made once, not per row


def _float_view(ptr: Any, n: int) -> np.ndarray:
    """n float32s at a C float pointer, as a numpy array over that memory (no copy)."""
    return _floats_at(ctypes.cast(ptr, ctypes.c_void_p).value, n)


def _floats_at(address: int, n: int) -> np.ndarray:
    arr = _FLOATS.get(n)
    if arr is None:
        arr = _FLOATS[n] = ctypes.c_float * n
    return np.frombuffer(arr.from_address(address), dtype=np.float32)


def _address(ptr: Any) -> int:
    """A C pointer from llama_cpp (an int, or a ctypes pointer object) as an int."""
    return ptr if isinstance(ptr, int) else ctypes.cast(ptr, ctypes.c_void_p).value


class StepsCall(ctypes.Structure):
    """native.steps's one argument: ssd_edge/csrc/native.h's steps_call, the same fields in the same order (the C
    says what each is; a size that differs is refused there). llama.cpp's functions and objects by address
    and the batch buffer come first, the same in every call of a context; set() fills in one call's token,
    position, sequence, limits and draw."""

    _fields_ = [("decode", ctypes.c_void_p), ("get_logits", ctypes.c_void_p), ("is_eog", ctypes.c_void_p),
                ("ctx", ctypes.c_void_p), ("vocab", ctypes.c_void_p), ("batch", ctypes.c_void_p),
                ("batch_size", ctypes.c_int64), ("n_vocab", ctypes.c_int64),
                ("token", ctypes.c_int32), ("pos", ctypes.c_int32), ("seq", ctypes.c_int32),
                ("most", ctypes.c_int64), ("seconds", ctypes.c_double),
                ("top_k", ctypes.c_int64), ("top_p", ctypes.c_double), ("min_p", ctypes.c_double),
                ("temperature", ctypes.c_double), ("seed", ctypes.c_uint64),
                ("row_hook", ctypes.c_void_p), ("row_hook_user", ctypes.c_void_p),
                ("mask", ctypes.c_void_p), ("mask_words", ctypes.c_int64)]

    def set(self, token: int, pos: int, seq: int, most: int, seconds: float, draws: tuple) -> StepsCall:
        """This call's fields (draws: coupling.Drawer.native's (top_k, top_p, min_p, temperature, seed), then
        its row hook's (C function address, user pointer, and the mask it fills: address, int32 words) where it
        has one); self."""
        self.token, self.pos, self.seq, self.most, self.seconds = token, pos, seq, most, seconds
        self.top_k, self.top_p, self.min_p, self.temperature, self.seed = draws[:5]
        self.row_hook, self.row_hook_user = draws[5:7] if len(draws) > 5 else (None, None)
        self.mask, self.mask_words = draws[7:9] if len(draws) > 7 else (None, 0)
        return self


def _logits_address() -> Any:
    """llama_get_logits as a foreign function of its own that returns the buffer's address as an int (not
    llama_cpp's, whose float pointer costs an object and a cast on every decode; llama_cpp's is untouched)."""
    fn = ll.llama_cpp._lib["llama_get_logits"]
    fn.argtypes, fn.restype = [ctypes.c_void_p], ctypes.c_void_p
    return fn


class Context:
    """A llama_context: KV cache, thread count, batch buffer.

    With n_seq_max > 1 the KV cache is unified: sequences share cells, seq_cp is
    metadata-only, and one batch can decode tokens of many sequences (the draft
    branches of SSD live here).
    """

    def __init__(self, model: Model, n_ctx: int, n_batch: int = 512, threads: int = 1, n_seq_max: int = 1,
                 cache_type_k: str = "f16", cache_type_v: str = "f16", flash_attn: str = "auto"):
        """cache_type_k/v: the KV cache's types (f16, q8_0, q4_0; -ctk/-ctv); flash_attn: on, off, auto (-fa)."""
        self.model = model
        params = ll.llama_context_default_params()
        params.type_k = KV_TYPES[cache_type_k]
        params.type_v = KV_TYPES[cache_type_v]
        params.flash_attn_type = FLASH_ATTN[flash_attn]
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = n_seq_max
        params.n_threads = threads
        params.n_threads_batch = threads
        params.kv_unified = n_seq_max > 1
        params.no_perf = True
        self._endpoints = list(getattr(model, "endpoints", ()))  # llama.cpp calls that may wait on an RPC server
        self._timeout_s = getattr(model, "rpc_timeout_s", 60.0)
        with capture_log() as lines:  # its KV, output and compute buffers (memory.py)
            if self._endpoints:
                ptr = GUARD.call(f"creating a context for {model.path.name}", self._endpoints, self._timeout_s,
                                ll.llama_init_from_model, model.ptr, params)
            else:
                with signals_held():
                    ptr = ll.llama_init_from_model(model.ptr, params)
        self.buffers = parse_buffers(lines)
        if not ptr:
            kv = "" if cache_type_k == cache_type_v == "f16" else \
                f" with a {cache_type_k}/{cache_type_v} KV cache (flash attention {flash_attn})"
            raise DecodeError(f"llama.cpp could not create a context of {n_ctx} tokens for {model.path.name}{kv}")
        self.ptr = ptr
        self.n_ctx = int(ll.llama_n_ctx(ptr))
        self.n_batch = n_batch
        self.n_seq_max = n_seq_max
        self.threads = threads
        self.mem = ll.llama_get_memory(ptr)
        self._batch = ll.llama_batch_init(n_batch, 0, n_seq_max)
        self._logits_address = _logits_address()
        self._views: dict[tuple[int, int], np.ndarray] = {}  # (address, rows) -> the rows over the output buffer
        self._steps_call: StepsCall | None = None  # native.steps's argument, llama.cpp's part found at the first call
        self.wake: Any = None  # SSD's Wake (prespec/handoff.py), bumped as each decode starts, where the worker set it
        self.started = 0.0  # perf_counter() as the last decode began
        self.abort = AbortFlag()
        ll.llama_set_abort_callback(self.ptr, self.abort.callback, self.abort.data)
        self._closed = False

    def set_threads(self, threads: int) -> None:
        ll.llama_set_n_threads(self.ptr, threads, threads)
        self.threads = threads

    def decode(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int | Sequence[int]],
               logits_for: Sequence[int], copy: bool = True) -> np.ndarray:
        """Decode one batch; return float32 logit rows (len(logits_for), n_vocab), in that order.

        tokens[i] goes to position positions[i] of sequence(s) seqs[i]; logits_for lists
        batch indices whose rows are wanted. For each sequence, the first position in
        the batch must be one past its last stored position.

        copy=False: the rows are a view of llama.cpp's own output buffer (logits_for ascending), valid
        until this context's next decode: no 600 KB copy per row of a 152k vocabulary (KVSeq reads its
        rows that way; whoever keeps a row past the next decode copies it).
        """
        n = len(tokens)
        if n == 0:
            return np.empty((0, self.model.n_vocab), dtype=np.float32)
        if n > self.n_batch:
            raise DecodeError(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        if max(positions) >= self.n_ctx:
            raise ContextFullError(f"context of {self.n_ctx} tokens is full")
        b = self._batch
        want = set(logits_for)
        for i in range(n):
            b.token[i] = tokens[i]
            b.pos[i] = positions[i]
            s = seqs[i]
            if isinstance(s, int):
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = s
            else:
                b.n_seq_id[i] = len(s)
                for j, sj in enumerate(s):
                    b.seq_id[i][j] = sj
            b.logits[i] = i in want
        b.n_tokens = n
        view = not copy and (type(logits_for) is range or all(x < y for x, y in zip(logits_for, logits_for[1:])))
        if self._endpoints:  # llama_decode may return before the servers finish: the logits read waits on them too
            rc, rows, took = GUARD.call("a decode", self._endpoints, self._timeout_s, self._decode_into, b, logits_for,
                                        view)
        else:
            rc, rows, took = self._decode_into(b, logits_for, view)
        DECODES.add(took, len(rows))  # on the calling thread, whichever ran the C call
        self._check(rc, n)
        return rows

    def _check(self, rc: int, n: int) -> None:
        """Raise what llama_decode's code `rc` for a batch of n tokens means (0: nothing)."""
        if rc == 2:
            raise Aborted()
        if rc == 1:
            raise ContextFullError(f"no KV cache slot for a batch of {n} tokens (context {self.n_ctx} full)")
        if rc != 0:
            raise DecodeError(f"llama_decode failed with code {rc} ({self.model.path.name})")

    def steps(self, token: int, pos: int, seq: int, most: int, seconds: float,
              draws: tuple) -> tuple[list[int], np.ndarray | None, float] | None:
        """Plain decoding steps in one C call (native.steps), none of them through Python: decode `token`
        at `pos` of `seq`, draw the next token from its row, decode that one, ..., until `most` tokens are
        drawn, an end of generation is, or `seconds` have passed (looked at after each step). draws:
        (top_k, top_p, min_p, temperature, seed), top_k 0 for greedy, and a row hook's (address, user)
        where there is one: coupling.Drawer.native, whose draws these are. Returns (drawn, row, seconds in decodes): every drawn token but the last was decoded
        after it; row, where not None, is the output row of the last decode, whose draw the C pass left to
        the caller (NaN, ties past its buffer: a view, valid until the next decode). None where this
        context cannot (no compiled extension; an --rpc target, whose decodes go through the guard).
        A decode that fails after the first ends the steps with what was drawn; the next call meets it."""
        if native_steps is None or self._endpoints or not 0 <= draws[0] < self.model.n_vocab:
            return None
        most = min(most, self.n_ctx - pos)
        if most < 1:
            raise ContextFullError(f"context of {self.n_ctx} tokens is full")
        call = self._native_call()
        drawn, rc, took, decoded, undecided = native_steps(call.set(token, pos, seq, most, seconds, draws))
        DECODES.add(took, decoded)
        if not drawn and not undecided:
            self._check(rc, 1)
        row = _floats_at(self._logits_address(self.ptr), self.model.n_vocab) if undecided else None
        return drawn, row, took

    def _native_call(self) -> StepsCall:
        """The C entry points' view of this context: llama.cpp's functions and objects by address (found once)."""
        call = self._steps_call
        if call is None:
            lib = ll.llama_cpp._lib
            fns = (ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in
                   ("llama_decode", "llama_get_logits", "llama_vocab_is_eog"))
            call = self._steps_call = StepsCall(*fns, _address(self.ptr), _address(self.model.vocab),
                                                ctypes.addressof(self._batch), ctypes.sizeof(self._batch),
                                                self.model.n_vocab)
        return call

    def _decode_into(self, b: Any, logits_for: Sequence[int], view: bool) -> tuple[int, np.ndarray, float]:
        """llama_decode, then the wanted logit rows: a view of llama.cpp's output buffer (its outputs are
        the flagged tokens in batch order, so ascending logits_for are all of it), or copies; and the
        seconds up to the first read (which synchronizes): the decode's time. Copies are the host's."""
        n_vocab, n_out = self.model.n_vocab, len(logits_for)
        t0 = self.started = time.perf_counter()
        wake = self.wake
        if wake is not None and decode_woken is not None:  # SSD's worker woken from C, the lock released
            call = self._native_call()
            rc = decode_woken(call.decode, call.ctx, call.batch, call.batch_size, wake.address)
        else:
            if wake is not None:
                wake.bump()
            rc = ll.llama_decode(self.ptr, b)
        if rc != 0 or not n_out:
            return rc, np.empty((0, n_vocab), dtype=np.float32), time.perf_counter() - t0
        if view:  # the same array while llama.cpp keeps its buffer (a new one where it reallocates it)
            key = (self._logits_address(self.ptr), n_out)
            rows = self._views.get(key)
            if rows is None:
                if len(self._views) >= 64:
                    self._views.clear()
                rows = self._views[key] = _floats_at(key[0], n_out * n_vocab).reshape(n_out, n_vocab)
            return rc, rows, time.perf_counter() - t0
        ptrs = [ll.llama_get_logits_ith(self.ptr, i) for i in logits_for]
        took = time.perf_counter() - t0
        out = np.empty((n_out, n_vocab), dtype=np.float32)
        for r, ptr in enumerate(ptrs):
            out[r] = _float_view(ptr, n_vocab)  # copy: the view dies at next decode
        return rc, out, took

    # ------------------------------------------------------------ KV cache
    def seq_rm(self, seq: int, p0: int = 0, p1: int = -1) -> None:
        """Remove positions [p0, p1) of `seq` (p1 = -1: to the end)."""
        if not ll.llama_memory_seq_rm(self.mem, seq, p0, p1):
            raise DecodeError(f"could not remove positions {p0}..{p1} of sequence {seq}")

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        ll.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_pos_max(self, seq: int) -> int:
        """Last stored position of `seq`, -1 when empty."""
        return int(ll.llama_memory_seq_pos_max(self.mem, seq))

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Move positions [p0, p1) of `seq` by delta (llama_memory_seq_add; the K rotation at the next decode)."""
        ll.llama_memory_seq_add(self.mem, seq, p0, p1, delta)

    def can_shift(self) -> bool:
        return bool(ll.llama_memory_can_shift(self.mem))

    def clear(self) -> None:
        if self._endpoints:  # clearing the data zeroes buffers on the servers
            GUARD.call("clearing the KV cache", self._endpoints, self._timeout_s, ll.llama_memory_clear, self.mem, True)
        else:
            ll.llama_memory_clear(self.mem, True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._endpoints and GUARD.lost is not None:  # a decode may still hang in it; see Model.close
            return
        if self._endpoints:
            GUARD.call_quietly("freeing a context", self._endpoints, self._timeout_s, ll.llama_free, self.ptr)
        else:
            ll.llama_free(self.ptr)
        ll.llama_batch_free(self._batch)

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


class AbortFlag:
    """A flag that llama.cpp polls between graph nodes during llama_decode.

    set() makes the decode in flight (or the next one) stop and raise Aborted;
    clear() lets decodes run. The poll must be cheap and must not take the GIL
    (a Python callback costs ~50 us per node, +40% per decode), so the callback
    is libc's strlen over a 2-byte buffer: strlen("\x01") == 1 means abort,
    strlen("") == 0 means go on. ggml reads the bool from the low byte of the
    return register, which holds strlen's 0 or 1 on x86-64 and AArch64. Where
    libc cannot be found, a Python callback does the same, slower.
    """

    def __init__(self) -> None:
        self._buf = ctypes.create_string_buffer(2)
        self.data = ctypes.cast(self._buf, ctypes.c_void_p)
        strlen = _libc_strlen()
        if strlen is not None:
            self.callback = ll.ggml_abort_callback(strlen)
        else:  # pragma: no cover - no libc
            self.callback = ll.ggml_abort_callback(lambda _data: self._buf.raw[0] != 0)

    def set(self) -> None:
        self._buf[0] = b"\x01"

    def clear(self) -> None:
        self._buf[0] = b"\x00"

    def is_set(self) -> bool:
        return self._buf.raw[0] != 0


def _libc_strlen() -> int | None:
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        return ctypes.cast(libc.strlen, ctypes.c_void_p).value
    except (OSError, AttributeError):  # pragma: no cover
        return None
