"""Converting a GGUF file to another type on this device (`ssd-edge models derive`): llama_model_quantize."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from ..errors import CorruptModelError
from .library import init, ll

# `ssd-edge models derive-draft --type` -> llama.cpp's file type (attribute names: llama_cpp loads on first use)
QUANT_TYPES = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
               "f16": "LLAMA_FTYPE_MOSTLY_F16", "bf16": "LLAMA_FTYPE_MOSTLY_BF16"}


def quantize(src: Path, dst: Path, kind: str, threads: int = 0, pure: bool = False) -> None:
    """Requantize the GGUF file `src` into `dst` (llama_model_quantize; threads 0 = all cores). pure:
    every matrix in `kind`, the output layer and token embeddings too (llama.cpp otherwise keeps
    those, and some others, in a wider type)."""
    init()
    params = ll.llama_model_quantize_default_params()
    params.ftype = getattr(ll, QUANT_TYPES[kind])
    params.allow_requantize = True
    params.pure = pure
    params.nthread = threads
    if ll.llama_model_quantize(os.fsencode(src), os.fsencode(dst), ctypes.byref(params)) != 0:
        raise CorruptModelError(f"llama.cpp could not requantize {src} to {kind}")
