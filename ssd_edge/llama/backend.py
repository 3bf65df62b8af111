"""The llama.cpp adapter, under the name the rest of ssd_edge imports it by: a loaded model
(model.py: Model, check_gguf_file, check_same_vocab) and its contexts (context.py: Context, AbortFlag,
the KV cache types and flash attention settings). llama_cpp itself is reached through library.ll, which
imports it when a model is loaded, so importing this module (or the engine) works without the compiled
library.

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

from ..interface import Aborted, ModelInfo
from .context import FLASH_ATTN, KV_TYPES, AbortFlag, Context
from .library import gpu_offload_supported, init, llama_cpp_version, rpc_supported, system_info
from .model import Model, check_gguf_file, check_same_vocab

__all__ = ["Aborted", "AbortFlag", "Context", "FLASH_ATTN", "KV_TYPES", "Model", "ModelInfo",
           "check_gguf_file", "check_same_vocab", "gpu_offload_supported", "init", "llama_cpp_version",
           "rpc_supported", "system_info"]
