"""The llama.cpp adapter: a loaded model and its contexts. llama_cpp itself is reached through
library.ll, which imports it when a model is loaded, so importing this module (or the engine)
works without the compiled library.

Model   one loaded GGUF file (weights, vocabulary, chat template); may back
        several contexts.
Context one llama_context with its own KV cache and thread count. Never use a
        Context from two threads at once; two Contexts decode in parallel
        (ctypes releases the GIL during llama_decode).

Everything above this module sees numpy arrays and Python ints. Model and
Context implement the Backend protocol of interface.py (BackendModel,
BackendContext); Aborted and ModelInfo live there and are
re-exported here, as are library.py's questions about the build (init,
system_info, gpu_offload_supported, rpc_supported, llama_cpp_version).
Calls that may wait on an --rpc server go through rpc_guard.GUARD.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..config import parse_endpoints
from ..errors import (ContextFullError, CorruptModelError, DecodeError, ModelNotFoundError, NotGGUFError,
                      VocabMismatchError)
from ..interface import DECODES, Aborted, ModelInfo
from ..memory import parse_buffers
from .library import (capture_log, gpu_offload_supported, init, ll, llama_cpp_version, rpc_supported, signals_held,
                      system_info)
from .rpc import probe
from .rpc_guard import GUARD

try:  # plain steps in one C call (Context.steps); without the extension, each step is a round of the engine's
    from ..native import steps as native_steps
except ImportError:  # pragma: no cover - a build without the extension
    native_steps = None

__all__ = ["Aborted", "AbortFlag", "Context", "Model", "ModelInfo", "check_gguf_file",
           "check_same_vocab", "gpu_offload_supported", "init", "llama_cpp_version", "rpc_supported",
           "system_info"]

log = logging.getLogger(__name__)


def check_gguf_file(path: Path) -> None:
    """Raise a typed error naming the file if it is missing or not a GGUF file."""
    if not path.exists():
        raise ModelNotFoundError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelNotFoundError(f"not a file: {path}")
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise ModelNotFoundError(f"cannot read model file {path}: {e.strerror}") from None
    if head[:4] != b"GGUF":
        raise NotGGUFError(f"not a GGUF file (bad magic {head[:4]!r}): {path}")
    if len(head) < 8:
        raise CorruptModelError(f"truncated GGUF file (only {len(head)} bytes): {path}")


class Model:
    """A loaded GGUF model."""

    def __init__(self, path: str | os.PathLike[str], n_gpu_layers: int = 0, verbose: bool = False,
                 rpc: Sequence[str] = (), rpc_timeout_s: float = 60.0, repack: bool = True, mmap: bool = True,
                 mlock: bool = False):
        """rpc: endpoints of llama.cpp rpc-servers whose devices take this model's offloaded layers (the
        n_gpu_layers), ahead of any local GPU. A model without rpc never uses an RPC device, even after
        another model registered one (the draft stays local). repack=False keeps the weights in llama.cpp's
        plain CPU layout (no extra buffer types), as an rpc-server's CPU device holds them. mmap=False reads
        the weights into memory instead of mapping the file (--no-mmap); mlock locks them in RAM (--mlock)."""
        self.path = Path(path)
        check_gguf_file(self.path)  # before loading llama.cpp: a wrong path is named without the library
        self.endpoints = parse_endpoints(list(rpc))
        self.rpc_timeout_s = rpc_timeout_s
        self.ptr = None
        self._closed = True
        for ep in self.endpoints:  # llama.cpp's client abort()s on a refused connection: find out first
            if ep not in GUARD.registered:  # (a registered one may hold our own connection: a probe would wait)
                probe(ep)
        init(verbose)
        params = ll.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers if n_gpu_layers >= 0 else 1 << 30
        params.use_extra_bufts = repack
        params.use_mmap = mmap
        params.use_mlock = mlock
        devices = GUARD.devices_for(self.endpoints, rpc_timeout_s)
        if devices is not None:  # NULL-terminated; llama.cpp copies the list during the load
            params.devices = ctypes.cast(devices, ctypes.c_void_p)
        path_c = str(self.path).encode()
        with capture_log() as lines:  # the weight buffers llama.cpp allocates, by device (memory.py)
            if self.endpoints:  # weights travel to the servers: a dead one must not hang the load
                ptr = GUARD.call(f"loading {self.path.name}", self.endpoints, 10 * rpc_timeout_s,
                                ll.llama_model_load_from_file, path_c, params)
            else:
                with signals_held():  # a Ctrl-C during the load would be lost in the log callback
                    ptr = ll.llama_model_load_from_file(path_c, params)
        self.buffers = parse_buffers(lines)
        if not ptr:
            raise CorruptModelError(f"llama.cpp could not load {self.path} (truncated or corrupt GGUF?)")
        self.ptr = ptr
        self.vocab = ll.llama_model_get_vocab(ptr)
        self.n_vocab = int(ll.llama_vocab_n_tokens(self.vocab))
        self.n_layer = int(ll.llama_model_n_layer(ptr))
        asked = self.n_layer + 1 if n_gpu_layers < 0 else n_gpu_layers
        can_offload = bool(self.endpoints) or gpu_offload_supported()
        self.gpu_layers = min(asked, self.n_layer + 1) if can_offload else 0
        if n_gpu_layers != 0 and not can_offload:
            log.warning("GPU offload asked for %s, but this machine has no GPU llama.cpp can use (--rpc servers "
                        "take the target only): running on CPU", self.path.name)
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._closed = False

    @property
    def lost(self) -> bool:
        """Whether an RPC server this model lives on was lost: the model can never be used or freed again."""
        return bool(self.endpoints) and GUARD.lost is not None

    # ------------------------------------------------------------ metadata
    def info(self) -> ModelInfo:
        buf = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self.ptr, buf, len(buf))
        n_embd = int(ll.llama_model_n_embd(self.ptr))
        n_head = max(1, int(ll.llama_model_n_head(self.ptr)))
        n_head_kv = int(ll.llama_model_n_head_kv(self.ptr))
        kv_cell = 2 * self.n_layer * n_head_kv * (n_embd // n_head) * 2  # K and V, f16
        return ModelInfo(
            path=str(self.path), description=buf.value.decode(errors="replace"),
            n_params=int(ll.llama_model_n_params(self.ptr)), size_bytes=int(ll.llama_model_size(self.ptr)),
            n_vocab=self.n_vocab, n_layer=self.n_layer, n_ctx_train=int(ll.llama_model_n_ctx_train(self.ptr)),
            gpu_layers=self.gpu_layers, kv_bytes_per_cell=kv_cell)

    # ------------------------------------------------------------ tokens
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (ll.llama_token * n_max)()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (ll.llama_token * n_max)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one token (special tokens render as empty)."""
        cached = self._pieces.get(token)
        if cached is not None:
            return cached
        buf = ctypes.create_string_buffer(64)
        n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        out = buf.raw[:n]
        self._pieces[token] = out
        return out

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def token_text(self, token: int) -> str:
        """The vocabulary entry's raw text (for comparing vocabularies)."""
        return (ll.llama_vocab_get_text(self.vocab, token) or b"").decode(errors="replace")

    def is_eog(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:  # asked once per token: a C call costs more than the lookup, every round
            eog = self._eog[token] = bool(ll.llama_vocab_is_eog(self.vocab, token))
        return eog

    # ------------------------------------------------------------ chat
    def chat_template(self) -> str | None:
        t = ll.llama_model_chat_template(self.ptr, None)
        return t.decode(errors="replace") if t else None

    def render_chat(self, messages: Sequence[dict[str, str]], add_assistant: bool = True) -> str:
        """Render messages with the GGUF's own chat template (llama.cpp's built-in renderer)."""
        tmpl = ll.llama_model_chat_template(self.ptr, None)
        if tmpl is None:  # no template in the file
            return _transcript(messages, add_assistant)
        keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
        arr = (ll.llama_chat_message * len(keep))(*[ll.llama_chat_message(r, c) for r, c in keep])
        size = sum(len(r) + len(c) for r, c in keep) * 2 + 1024
        buf = ctypes.create_string_buffer(size)
        n = ll.llama_chat_apply_template(tmpl, arr, len(keep), add_assistant, buf, size)
        if n > size:
            buf = ctypes.create_string_buffer(n + 1)
            n = ll.llama_chat_apply_template(tmpl, arr, len(keep), add_assistant, buf, n + 1)
        if n < 0:  # a template llama.cpp's renderer does not know
            return _transcript(messages, add_assistant)
        return buf.raw[:n].decode("utf-8", errors="replace")

    def close(self) -> None:
        if self._closed or not self.ptr:
            return
        self._closed = True
        if self.lost:  # freeing sends to the lost server and would wait for ever: leave it to the process exit
            return
        if self.endpoints:
            GUARD.call_quietly(f"freeing {self.path.name}", self.endpoints, self.rpc_timeout_s,
                              ll.llama_model_free, self.ptr)
        else:
            ll.llama_model_free(self.ptr)

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def _transcript(messages: Sequence[dict[str, str]], add_assistant: bool) -> str:
    """A plain 'Role: text' transcript, for models without a chat template llama.cpp knows."""
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join(lines) + ("\nAssistant:" if add_assistant else "")


def check_same_vocab(target: Model, draft: Model) -> None:
    """Raise VocabMismatchError unless the two models tokenize identically."""
    where = f"target {target.path.name} and draft {draft.path.name}"
    if target.n_vocab != draft.n_vocab:
        # Qwen-style pairs can pad their embedding tables differently; the vocabularies
        # must still agree on every token both have. A gap bigger than a padding is a mismatch.
        if abs(target.n_vocab - draft.n_vocab) > 128:
            raise VocabMismatchError(f"{where} have different vocabularies ({target.n_vocab} vs {draft.n_vocab} tokens)")
    n = min(target.n_vocab, draft.n_vocab)
    rng = np.random.default_rng(0)
    ids = np.unique(np.concatenate([np.arange(min(n, 512)), rng.integers(0, n, 512), np.arange(max(0, n - 64), n)]))
    for t in ids.tolist():
        if target.token_text(t) != draft.token_text(t):
            raise VocabMismatchError(f"{where} have different vocabularies (token {t}: "
                                     f"{target.token_text(t)!r} vs {draft.token_text(t)!r})")


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
        self._step_fns: tuple[int, ...] | None = None  # what steps() hands native.steps, found at its first call
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
              draws: tuple[int, float, float, float, int]) -> tuple[list[int], np.ndarray | None, float] | None:
        """Plain decoding steps in one C call (native.steps), none of them through Python: decode `token`
        at `pos` of `seq`, draw the next token from its row, decode that one, ..., until `most` tokens are
        drawn, an end of generation is, or `seconds` have passed (looked at after each step). draws:
        (top_k, top_p, min_p, temperature, seed), top_k 0 for greedy: coupling.Drawer.native, whose draws
        these are. Returns (drawn, row, seconds in decodes): every drawn token but the last was decoded
        after it; row, where not None, is the output row of the last decode, whose draw the C pass left to
        the caller (NaN, ties past its buffer: a view, valid until the next decode). None where this
        context cannot (no compiled extension; an --rpc target, whose decodes go through the guard).
        A decode that fails after the first ends the steps with what was drawn; the next call meets it."""
        if native_steps is None or self._endpoints or not 0 <= draws[0] < self.model.n_vocab:
            return None
        most = min(most, self.n_ctx - pos)
        if most < 1:
            raise ContextFullError(f"context of {self.n_ctx} tokens is full")
        if self._step_fns is None:
            lib = ll.llama_cpp._lib
            self._step_fns = tuple(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in
                                   ("llama_decode", "llama_get_logits", "llama_vocab_is_eog")) + (
                _address(self.ptr), _address(self.model.vocab), ctypes.addressof(self._batch))
        drawn, rc, took, decoded, undecided = native_steps(*self._step_fns, token, pos, seq, self.model.n_vocab,
                                                           most, seconds, *draws)
        DECODES.add(took, decoded)
        if not drawn and not undecided:
            self._check(rc, 1)
        row = _floats_at(self._logits_address(self.ptr), self.model.n_vocab) if undecided else None
        return drawn, row, took

    def _decode_into(self, b: Any, logits_for: Sequence[int], view: bool) -> tuple[int, np.ndarray, float]:
        """llama_decode, then the wanted logit rows: a view of llama.cpp's output buffer (its outputs are
        the flagged tokens in batch order, so ascending logits_for are all of it), or copies; and the
        seconds up to the first read (which synchronizes): the decode's time. Copies are the host's."""
        n_vocab, n_out = self.model.n_vocab, len(logits_for)
        t0 = time.perf_counter()
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
