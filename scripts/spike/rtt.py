"""Throwaway spike code for issue 53, part 1 (see scripts/spike_draft_side.py): a call's round trip to the
draft side, by thread, pipe and shared word. Not production quality."""

from __future__ import annotations

import ctypes
import mmap
import os
import queue
import threading
import time

from common import Ctl, pyburn


def measure_rtt(lib, how: str, n: int) -> dict:
    """A call's round trip to the draft side and back with nothing to do (what each just-in-time draft, extend or
    unanswered lookup adds): thread (today's _call: SimpleQueue there, SimpleQueue back), proc-pipe (a pipe each
    way), proc-spin (the shared word each way, spin 5 ms then a futex, on both sides), ms p50 and p90."""
    mm = mmap.mmap(-1, ctypes.sizeof(Ctl))
    ctl = Ctl.from_buffer(mm)
    addr = ctypes.addressof(ctl)
    got = []
    if how == "thread":
        inbox, outbox = queue.SimpleQueue(), queue.SimpleQueue()

        def echo() -> None:
            while (m := inbox.get()) is not None:
                outbox.put(m)

        th = threading.Thread(target=echo, daemon=True)
        th.start()
        for i in range(n):
            t = time.perf_counter()
            inbox.put(i)
            outbox.get()
            got.append(time.perf_counter() - t)
            pyburn(2000)  # the engine's own work between calls
        inbox.put(None)
        th.join()
    else:
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                if how == "proc-pipe":
                    while os.read(r1, 1) == b"c":
                        os.write(w2, b"a")
                else:
                    last = 0
                    while True:
                        last = lib.wait_post(addr, last, 5e-3)
                        if ctl.stop:
                            break
                        lib.set_ready(addr, last)
            finally:
                os._exit(0)
        for i in range(1, n + 1):
            t = time.perf_counter()
            if how == "proc-pipe":
                os.write(w1, b"c")
                os.read(r2, 1)
            else:
                lib.post(addr, i, t)
                lib.wait_ready(addr, i, 5e-3)
            got.append(time.perf_counter() - t)
            pyburn(2000)
        if how == "proc-pipe":
            os.write(w1, b"x")
        else:
            lib.stop_all(addr)
        os.waitpid(pid, 0)
        for fd in (r1, w1, r2, w2):
            os.close(fd)
    del ctl
    mm.close()
    got.sort()
    return {"how": how, "rtt_ms_p50": got[len(got) // 2] * 1e3, "rtt_ms_p90": got[int(0.9 * (len(got) - 1))] * 1e3}
