"""llama.cpp itself, loaded on first use: the llama_cpp module (`ll`), its one-time initialisation and
logs, what the build can do (system info, a local GPU, the RPC backend), and libggml's device calls.

Importing this module loads nothing: `ll.x` imports llama_cpp the first time any attribute is read."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from contextlib import contextmanager
from importlib import metadata
from typing import Any, Iterator


class _Library:
    """Stands for the llama_cpp module: the first read of an attribute imports llama_cpp, and each
    attribute read is kept on the instance, so later reads are plain attribute lookups."""

    def __getattr__(self, name: str) -> Any:
        try:
            import llama_cpp
        except ImportError as e:
            raise ImportError("llama-cpp-python is not installed; run scripts/setup.sh") from e
        value = getattr(llama_cpp, name)
        setattr(self, name, value)
        return value


ll: Any = _Library()

_init_lock = threading.Lock()
_initialised = False
_verbose = False
_log_callback = None  # the C callback; a module-level reference keeps it alive while llama.cpp holds it


_captures: list[list[str]] = []  # the open capture_log() lists: every llama.cpp log line goes to each
_captures_lock = threading.Lock()


def _write_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:  # called from C
    if _captures:
        line = text.decode(errors="replace")
        with _captures_lock:
            for lines in _captures:
                lines.append(line)
    if _verbose:
        try:
            os.write(2, text)
        except OSError:
            pass


def init(verbose: bool = False) -> None:
    """Initialise llama.cpp once per process; llama.cpp logs go to stderr only if verbose."""
    global _initialised, _verbose, _log_callback
    _verbose = verbose
    with _init_lock:
        if _initialised:
            return
        _log_callback = ll.llama_log_callback(_write_log)
        ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
        info = system_info()
        if "AMX_INT8 = 1" in info or "AMX = 1" in info:
            raise RuntimeError(
                "this llama-cpp-python build uses Intel AMX, which crashes with 'Illegal instruction' on "
                "machines that trap it; rebuild with scripts/setup.sh (it switches AMX off)")
        ll.llama_backend_init()
        _initialised = True


@contextmanager
def capture_log() -> Iterator[list[str]]:
    """The llama.cpp log lines written while the block runs (whatever the verbosity), from any thread:
    what a model load or a context creation says of the buffers it allocated (memory.py reads them)."""
    lines: list[str] = []
    with _captures_lock:
        _captures.append(lines)
    try:
        yield lines
    finally:
        with _captures_lock:
            _captures[:] = [c for c in _captures if c is not lines]


@contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM during a long llama.cpp call (a model load, a context's creation) reach their
    handlers when the block ends. Python runs a handler at the next Python code of the main thread, which
    during a C call is the log callback (_write_log); ctypes prints and drops what a callback raises, so a
    KeyboardInterrupt raised there would be lost. A no-op outside the main thread (no handler runs there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: held.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        for signum in dict.fromkeys(held):
            signal.raise_signal(signum)  # to the handler restored above: KeyboardInterrupt, Terminated, ...


def system_info() -> str:
    return ll.llama_print_system_info().decode(errors="replace")


def llama_cpp_version() -> str:
    """The installed llama-cpp-python's version, read without loading the library."""
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return "not installed"


# ---------------------------------------------------------------- libggml's devices

_DEV_GPU, _DEV_IGPU = 1, 2  # enum ggml_backend_dev_type
_ggml_lib: Any = None


def ggml() -> Any:
    """libggml as llama-cpp-python loaded it, with the prototypes used here (ggml-backend.h, ggml.h)."""
    global _ggml_lib
    if _ggml_lib is None:
        from llama_cpp import _ggml as g

        lib, vp, sz, s = g.libggml, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
        for name, args, res in [
            ("ggml_backend_dev_count", [], sz), ("ggml_backend_dev_get", [sz], vp),
            ("ggml_backend_dev_type", [vp], ctypes.c_int), ("ggml_backend_dev_backend_reg", [vp], vp),
            ("ggml_backend_dev_name", [vp], s), ("ggml_backend_dev_description", [vp], s),
            ("ggml_backend_reg_name", [vp], s),
            ("ggml_backend_reg_by_name", [s], vp), ("ggml_backend_reg_get_proc_address", [vp, s], vp),
            ("ggml_backend_reg_dev_count", [vp], sz), ("ggml_backend_reg_dev_get", [vp, sz], vp),
            ("ggml_backend_register", [vp], None), ("ggml_set_abort_callback", [vp], vp)]:
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
        _ggml_lib = lib
    return _ggml_lib


def local_gpus() -> list[int]:
    """Device pointers of the local GPUs (not RPC devices), in ggml's order."""
    g = ggml()
    out = []
    for i in range(g.ggml_backend_dev_count()):
        dev = g.ggml_backend_dev_get(i)
        if g.ggml_backend_dev_type(dev) in (_DEV_GPU, _DEV_IGPU) and \
                g.ggml_backend_reg_name(g.ggml_backend_dev_backend_reg(dev)) != b"RPC":
            out.append(dev)
    return out


def local_gpu_names() -> list[str]:
    """Each local GPU as ggml names and describes it, e.g. 'CUDA0 (NVIDIA H200)'; [] on a CPU build."""
    init()
    g = ggml()
    return [f"{g.ggml_backend_dev_name(d).decode()} ({g.ggml_backend_dev_description(d).decode()})"
            for d in local_gpus()]


def gpu_offload_supported() -> bool:
    """Whether this machine has a GPU llama.cpp can offload to. Not llama_supports_gpu_offload(): that is
    also true on a CPU-only build with the RPC backend compiled in, where -ngl without --rpc does nothing."""
    init()
    return bool(local_gpus())


def rpc_supported() -> bool:
    """Whether this llama-cpp-python build has the RPC backend (scripts/setup.sh builds with -DGGML_RPC=ON)."""
    init()
    return bool(ggml().ggml_backend_reg_by_name(b"RPC"))
