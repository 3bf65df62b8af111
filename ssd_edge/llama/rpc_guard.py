"""The guard around llama.cpp's RPC client (--rpc): the registered servers and their devices, the
calls that may wait on a server run with a timeout, and ggml's abort handler that turns a lost
server into an RPCError instead of the end of the process.

What llama.cpp's RPC client does when a server fails (vendored ggml/src/ggml-rpc/ggml-rpc.cpp): one
dispatcher thread per endpoint sends every command and waits for its answer; a failed send or
receive (the server died, the connection reset) hits RPC_STATUS_ASSERT, which calls GGML_ABORT, which
calls abort() and ends the whole process. A refused connection at registration does the same, on the
caller's thread. No error code ever comes back to llama_decode.

What is guarded here: endpoints are probed in Python before registration (rpc.probe), so a wrong
port is a one-line RPCError. Every llama.cpp call that may wait on a server runs on a helper thread
while the caller waits with a timeout. ggml's abort callback, on a non-main thread and for an abort
raised in ggml-rpc.cpp, marks RPC as lost and parks that thread for good instead of returning (a
return means abort()). The caller then raises RPCError; the models on the servers are never used
or freed again (that would wait on the parked dispatcher), the helper and dispatcher threads stay
parked until the process exits, and local models keep working. A server that vanishes without a
reset (a pulled cable) leaves the dispatcher blocked in recv: the timeout covers that. Whatever
aborts on the main thread, or outside ggml-rpc.cpp, still aborts the process.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from typing import Any, Callable, Sequence

from ..config import Endpoint
from ..errors import RPCError
from .library import ggml, local_gpus

log = logging.getLogger(__name__)

_abort_callback = None  # module-level reference: ggml keeps the pointer


class RpcGuard:
    """Process-wide (one instance, GUARD): the registered endpoints and their devices, and whether RPC
    was lost."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.registered: dict[Endpoint, list[int]] = {}
        self.lost: str | None = None          # why, once a server was lost; RPC is then over for this process
        self.lost_event = threading.Event()

    def register(self, endpoints: list[Endpoint], timeout_s: float) -> list[int]:
        """ggml_backend_rpc_add_server + ggml_backend_register for each new endpoint (as llama.cpp's --rpc
        does in common/arg.cpp); the endpoints' device pointers, in order."""
        self.check(endpoints)
        g = ggml()
        reg = g.ggml_backend_reg_by_name(b"RPC")
        if not reg:
            raise RPCError("this llama-cpp-python build has no RPC backend: rebuild it with scripts/setup.sh "
                           "(it sets -DGGML_RPC=ON)")
        add = g.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
        add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(add)  # ggml_backend_rpc_add_server_t
        _install_abort_callback()
        devs: list[int] = []
        with self.lock:
            for ep in endpoints:
                if ep not in self.registered:
                    server_reg = self.call(f"connecting to {ep}", [ep], timeout_s, add_server, str(ep).encode())
                    if not server_reg:
                        raise RPCError(f"rpc server {ep} offers no devices")
                    g.ggml_backend_register(server_reg)
                    self.registered[ep] = [g.ggml_backend_reg_dev_get(server_reg, i)
                                           for i in range(g.ggml_backend_reg_dev_count(server_reg))]
                    log.info("rpc server %s: devices %s", ep,
                             ", ".join(g.ggml_backend_dev_name(d).decode() for d in self.registered[ep]))
                devs += self.registered[ep]
        return devs

    def check(self, endpoints: Sequence[Endpoint]) -> None:
        if self.lost is not None:
            raise RPCError(f"rpc server {_names(endpoints)}: RPC is unusable in this process since a server was "
                           f"lost ({self.lost}); restart ssd-edge")

    def lose(self, why: str) -> None:
        if self.lost is None:
            self.lost = why
        self.lost_event.set()

    def call(self, what: str, endpoints: Sequence[Endpoint], timeout_s: float, fn: Callable[..., Any],
             *args: Any) -> Any:
        """fn(*args) on a helper thread; RPCError if RPC is lost meanwhile or it takes over timeout_s."""
        self.check(endpoints)
        box: list[Any] = []
        done = threading.Event()

        def run() -> None:
            try:
                box.append(fn(*args))
            except BaseException as e:  # pragma: no cover - ctypes calls raise only on bad arguments
                box.append(e)
            finally:
                done.set()

        threading.Thread(target=run, name="ssd-edge-rpc-call", daemon=True).start()
        deadline = time.monotonic() + timeout_s
        try:
            self._wait(what, endpoints, timeout_s, done, deadline)
        except RPCError:
            raise
        except BaseException as interrupt:  # Ctrl-C while waiting: the C call cannot be stopped, and a context
            try:                            # must not be used from two threads: let it end (or be lost) first
                self._wait(what, endpoints, timeout_s, done, deadline)
            except RPCError:
                pass
            raise interrupt
        if isinstance(box[0], BaseException):  # pragma: no cover
            raise box[0]
        return box[0]

    def _wait(self, what: str, endpoints: Sequence[Endpoint], timeout_s: float, done: threading.Event,
              deadline: float) -> None:
        while not done.wait(0.02):  # returns at once when the call ends; the poll only watches for a loss
            if self.lost_event.is_set():
                raise RPCError(f"rpc server {_names(endpoints)} lost during {what} ({self.lost}); the models on it "
                               "cannot be used again in this process")
            if time.monotonic() >= deadline:
                self.lose(f"no answer within {timeout_s:g} s")
                raise RPCError(f"rpc server {_names(endpoints)} did not answer within {timeout_s:g} s during {what}"
                               "; the models on it cannot be used again in this process")

    def call_quietly(self, what: str, endpoints: Sequence[Endpoint], timeout_s: float, fn: Callable[..., Any],
                     *args: Any) -> None:
        """A clean-up call: a lost server is logged, not raised (a close must not fail)."""
        try:
            self.call(what, endpoints, timeout_s, fn, *args)
        except RPCError as e:
            log.warning("%s", e)

    def devices_for(self, endpoints: list[Endpoint], timeout_s: float) -> Any:
        """llama_model_params.devices for a model: its RPC servers' devices, then the local GPUs. None
        (llama.cpp's own choice) while no RPC server is registered in this process."""
        if endpoints:
            devs = self.register(endpoints, timeout_s)
        elif self.registered:
            devs = []
        else:
            return None
        devs = devs + local_gpus()
        return (ctypes.c_void_p * (len(devs) + 1))(*devs, None)


GUARD = RpcGuard()


def _names(endpoints: Sequence[Endpoint]) -> str:
    return ",".join(str(e) for e in endpoints)


def _on_ggml_abort(message: bytes) -> None:  # called from C, on the failing thread, just before abort()
    text = (message or b"").decode(errors="replace")
    where, _, why = text.partition(": ")
    if "ggml-rpc" in where and threading.current_thread() is not threading.main_thread():
        GUARD.lose(why.strip() or text)
        threading.Event().wait()  # park this thread for good: returning means abort()
    try:  # what ggml prints when no callback is set (less its backtrace)
        os.write(2, message + b"\n")
    except OSError:
        pass


def _install_abort_callback() -> None:
    global _abort_callback
    if _abort_callback is None:
        _abort_callback = ctypes.CFUNCTYPE(None, ctypes.c_char_p)(_on_ggml_abort)
        ggml().ggml_set_abort_callback(ctypes.cast(_abort_callback, ctypes.c_void_p))
