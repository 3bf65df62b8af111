"""Load llama.cpp's shared library (libllama and the ggml backends it links) before anything loads numpy.

On one CUDA machine (FIELD_NOTES, "The GPU regime, measured") numpy imported before libllama made the
first model load segfault, even at -ngl 0; the other order did not. The `ssd-edge` command calls
preload_library() first (cli/entry.py). It opens the library file llama-cpp-python ships, with ctypes
and nothing else: llama_cpp's own import later opens the same file (the loader hands back the same
library) and pulls numpy in after it. Stdlib only, on purpose."""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from pathlib import Path

NAMES = {"linux": ("libllama.so",), "darwin": ("libllama.dylib", "libllama.so"), "win32": ("llama.dll", "libllama.dll")}


def library_path() -> Path | None:
    """libllama as llama-cpp-python ships it (its package's lib/ folder); None where it is not installed."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    platform = "linux" if sys.platform.startswith(("linux", "freebsd")) else sys.platform
    return next((lib / n for n in NAMES.get(platform, ()) if (lib / n).exists()), None)


def preload_library() -> bool:
    """Open libllama now (before numpy); whether it was opened. A failure is left to the real import,
    which reports it with its own message."""
    path = library_path()
    if path is None:
        return False
    try:
        ctypes.CDLL(str(path))
    except OSError:
        return False
    return True
