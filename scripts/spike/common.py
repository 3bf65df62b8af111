"""Throwaway spike code for issue 53, part 1 (see scripts/spike_draft_side.py): what the spike's parts share,
the shared control block (draft_side.c's ctl_t), the C library built on the fly, the calibrated Python work,
a thread's run delay, and the price tables. Not production quality."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _prices():
    """prices.py alone (the package's priced/__init__ imports the engine and its dependencies)."""
    spec = importlib.util.spec_from_file_location("spike_prices", ROOT / "ssd_edge" / "bench" / "priced" / "prices.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["spike_prices"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod.TABLES


TABLES = _prices()

CAP = 8192
MAX_DEPTH = 16


class Ctl(ctypes.Structure):
    _fields_ = [("posted", ctypes.c_uint32), ("sleeping", ctypes.c_uint32), ("stop", ctypes.c_uint32),
                ("ready", ctypes.c_uint32), ("abort", ctypes.c_uint8), ("pad", ctypes.c_uint8 * 7),
                ("t_post", ctypes.c_double), ("spin_wait_s", ctypes.c_double), ("pre_read_iters", ctypes.c_double),
                ("read_s", ctypes.c_double), ("post_read_iters", ctypes.c_double),
                ("step_iters", ctypes.c_double * MAX_DEPTH),
                ("depth", ctypes.c_int32), ("short_depth", ctypes.c_int32), ("width", ctypes.c_int32),
                ("pad2", ctypes.c_int32), ("step_s", ctypes.c_double * MAX_DEPTH), ("first", ctypes.c_double * CAP),
                ("cpu_s", ctypes.c_double), ("d_wall", ctypes.c_double), ("d_cpu", ctypes.c_double),
                ("tid", ctypes.c_int32), ("pad3", ctypes.c_int32)]


def build_lib() -> ctypes.CDLL:
    src = ROOT / "scripts" / "spike" / "draft_side.c"
    so = Path(tempfile.gettempdir()) / f"spike_draft_side_{os.getpid()}.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(so), str(src), "-lpthread"], check=True)
    lib = ctypes.CDLL(str(so))  # CDLL: every call drops the interpreter's lock
    so.unlink()
    lib.spin.argtypes = [ctypes.c_double, ctypes.c_void_p]
    lib.spin.restype = ctypes.c_int
    lib.work.argtypes = [ctypes.c_double]
    lib.post.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_double]
    lib.stop_all.argtypes = [ctypes.c_void_p]
    lib.wait_post.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_double]
    lib.wait_post.restype = ctypes.c_uint32
    lib.draft_start.argtypes = [ctypes.c_void_p]
    lib.set_ready.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.wait_ready.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_double]
    lib.ctl_size.restype = ctypes.c_size_t
    lib.spin_stats.argtypes = [ctypes.c_void_p]
    lib.spin_acc.argtypes = [ctypes.c_double, ctypes.c_void_p, ctypes.c_void_p]
    lib.spin_acc.restype = ctypes.c_int
    assert lib.ctl_size() == ctypes.sizeof(Ctl), (lib.ctl_size(), ctypes.sizeof(Ctl))
    return lib


def pyburn(n: int) -> None:
    x = 0
    for i in range(n):
        x += i


def calibrate(lib: ctypes.CDLL) -> tuple[float, float]:
    """(Python loop iterations, C loop iterations) per microsecond: the best of a few tries."""
    best_py = best_c = 0.0
    for _ in range(15):
        t = time.perf_counter()
        pyburn(20000)
        best_py = max(best_py, 20000 / ((time.perf_counter() - t) * 1e6))
        t = time.perf_counter()
        lib.work(2e6)
        best_c = max(best_c, 2e6 / ((time.perf_counter() - t) * 1e6))
    return best_py, best_c


class RunDelay:
    """A thread's time runnable but not running (the 2nd field of /proc/<pid>/task/<tid>/schedstat, ns): time
    another thread or process had its core, or it waited for one after a wake-up."""

    def __init__(self, pid: int, tid: int) -> None:
        self.fd = os.open(f"/proc/{pid}/task/{tid}/schedstat", os.O_RDONLY)

    def read(self) -> float:
        return int(os.pread(self.fd, 128, 0).split()[1]) / 1e9

    def close(self) -> None:
        os.close(self.fd)
