"""A loaded GGUF model: its weights (on the CPU, a local GPU or --rpc servers), vocabulary (tokenize,
piece, end of generation) and chat template; what describes it (info), and the checks made before and
after loading (check_gguf_file, check_same_vocab). One Model may back several contexts (context.py).
llama_cpp is reached through library.ll, loaded on first use; calls that may wait on an --rpc server go
through rpc_guard.GUARD.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..config import parse_endpoints
from ..errors import CorruptModelError, ModelNotFoundError, NotGGUFError, VocabMismatchError
from ..interface import FimTokens, ModelInfo
from ..memory import parse_buffers
from .library import capture_log, gpu_offload_supported, init, ll, signals_held
from .rpc import probe
from .rpc_guard import GUARD

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

    def eot(self) -> int:
        """The end-of-text token: llama_vocab_eot, else llama_vocab_eos (as llama.cpp's infill sampler ends)."""
        eot = int(ll.llama_vocab_eot(self.vocab))
        return eot if eot >= 0 else int(ll.llama_vocab_eos(self.vocab))

    def fim_tokens(self) -> FimTokens | None:
        """The GGUF's fill-in-the-middle tokens (llama_vocab_fim_pre/suf/mid/pad/rep/sep), None where the
        vocabulary lacks the prefix, suffix or middle one."""
        ids = [int(f(self.vocab)) for f in (ll.llama_vocab_fim_pre, ll.llama_vocab_fim_suf, ll.llama_vocab_fim_mid,
                                              ll.llama_vocab_fim_pad, ll.llama_vocab_fim_rep, ll.llama_vocab_fim_sep)]
        found = [t if 0 <= t < self.n_vocab else None for t in ids]  # LLAMA_TOKEN_NULL is -1
        if None in found[:3]:
            return None
        return FimTokens(*found)

    # ------------------------------------------------------------ chat
    def chat_template(self) -> str | None:
        """The GGUF's Jinja chat template (`tokenizer.chat_template`), None where the file has none."""
        t = ll.llama_model_chat_template(self.ptr, None)
        return t.decode(errors="replace") if t else None

    def bos_eos_text(self) -> tuple[str, str]:
        """The start and end tokens' text, which a Jinja chat template may write (bos_token, eos_token)."""
        return tuple(self.token_text(int(t)) if t >= 0 else ""  # type: ignore[return-value]
                     for t in (ll.llama_vocab_bos(self.vocab), ll.llama_vocab_eos(self.vocab)))

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
