"""Leave the model its cores: the engine's work on one thread of its own, the UI's below it.

On a CPU-only device llama.cpp decodes with a thread per core, and its threads meet at a barrier
after every operation of the graph: a millisecond the UI thread takes from any of those cores
delays the whole decode by about that much (issue 24: on 2 cores the TUI decoded at 0.87-0.97x the
CLI's speed with the UI thread spending 2-4 ms of CPU per token). So the TUI's process runs its UI
below the engine: the UI thread lowers its own scheduling priority (Linux's SCHED_IDLE, else the
lowest nice value) and then draws in the gaps the engine leaves, between and around its decodes,
instead of in the middle of them.

The engine's own Python work (sampling, planning, the pre-speculation worker's ranking) runs between
its decodes and needs the interpreter's lock; a UI thread holding it keeps them waiting up to the
switch interval (5 ms by default) before the lock changes hands. The TUI's process therefore switches
every SWITCH_INTERVAL_S instead (ssd on 2 cores, in tmux, TUI/CLI: 0.97, 1.01, 0.99, 0.95 against 0.96,
0.94, 0.94, 0.91, 1.06, 0.87 at 5 ms: scripts/tui_speed.py terminal --mode ssd).

A thread inherits its creator's priority, and an unprivileged thread can lower its priority but
never raise it again. So everything that runs llama.cpp (building the engine, calibrating it,
generating, and every thread those start: llama.cpp's OpenMP team, the pre-speculation worker)
runs on one `EngineThread`, started before the UI thread lowers itself; the app's worker threads
only wait on it. Closing the engine needs no priority and runs wherever it is asked.

A thread below the engine runs only where a core would otherwise idle, and on 2 cores a decode
leaves few such moments: a key that must act at once would wait seconds for the UI thread (Esc
stopped a reply after 5-8 s of `ar` on 2 cores). So the UI lowers itself only once Textual's driver
runs (the app's mount), and lowers the driver's writer thread with it; the driver's input thread,
started before, keeps the process's priority, and `urgent_keys_driver` has it act on the keys that
stop work (Esc, Ctrl+Q) the moment they are read, before the UI thread sees them.

Only `run_app` (the real terminal) lowers the UI thread: the app driven in process (Textual's
Pilot, the tests, scripts/tui_speed.py pilot) keeps its caller's priority, so nothing outside the
TUI ever inherits it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from textual import events
from textual.driver import Driver

log = logging.getLogger(__name__)

T = TypeVar("T")
D = TypeVar("D", bound=Driver)


class EngineThread:
    """One thread, started now (at its creator's priority), that runs the engine's work in turn."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ssd-edge-engine")
        self._pool.submit(lambda: None).result()  # the thread exists from here on, at today's priority

    def call(self, fn: Callable[[], T]) -> T:
        """Run fn on the engine thread; wait for it and return its result (or raise its exception)."""
        return self._pool.submit(fn).result()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


SWITCH_INTERVAL_S = 0.0005  # the interpreter lock's switch interval in the TUI's process (Python's default: 0.005)


def yield_to_the_engine(*others: threading.Thread) -> str:
    """What the app does once its driver runs, on the UI thread: lower it (lower_this_thread) and the
    `others` (the driver's writer thread), and shorten the lock's switch interval. Returns what it
    did, for the log."""
    lowered = lower_this_thread()
    for thread in others:
        if thread.native_id is not None:
            lower_this_thread(thread_id=thread.native_id)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    return f"UI thread {lowered or 'at its priority'}, switch interval {SWITCH_INTERVAL_S * 1e3:g} ms"


def urgent_keys_driver(base: type[D], urgent: Callable[[str], None]) -> type[D]:
    """Textual driver class `base`, whose input thread calls urgent(key) with every key it reads
    before passing the key on to the app as usual (the app acts on it again, in its own time).
    urgent runs on that thread: it may only do what is thread-safe (set an Event)."""

    class UrgentKeys(base):  # type: ignore[valid-type,misc]
        def process_message(self, message: Any) -> None:
            if isinstance(message, events.Key):
                urgent(message.key)
            super().process_message(message)

    UrgentKeys.__name__ = UrgentKeys.__qualname__ = f"UrgentKeys{base.__name__}"
    return UrgentKeys


PRIORITY_ENV = "SSD_EDGE_TUI_PRIORITY"  # idle (the default), nice:N (1-19), or normal


def lower_this_thread(how: str | None = None, *, thread_id: int = 0) -> str | None:
    """Put the calling thread (or the thread of native id `thread_id`) below the engine's: `idle` is
    Linux's SCHED_IDLE (it runs when a core would otherwise idle), falling back to nice 19; `nice:N`
    a nice value; `normal` leaves it as it is. Default: $SSD_EDGE_TUI_PRIORITY, else idle. Only where
    the OS has per-thread priorities (Linux); elsewhere they would lower the whole process, the
    engine with it. Returns what it did."""
    how = (how or os.environ.get(PRIORITY_ENV) or "idle").strip().lower()
    if how == "normal" or not sys.platform.startswith("linux"):
        return None
    if how == "idle":
        try:
            os.sched_setscheduler(thread_id, os.SCHED_IDLE, os.sched_param(0))
            return "SCHED_IDLE"
        except (AttributeError, OSError) as e:
            log.debug("SCHED_IDLE refused (%s): trying nice 19", e)
            how = "nice:19"
    try:
        nice = int(how.removeprefix("nice:"))
    except ValueError:
        log.warning("%s=%r is not idle, nice:N or normal: the UI thread's priority stays as it is", PRIORITY_ENV, how)
        return None
    try:
        os.setpriority(os.PRIO_PROCESS, thread_id, max(0, min(19, nice)))  # Linux: that thread alone
        return f"nice {max(0, min(19, nice))}"
    except OSError as e:
        log.info("the UI thread's priority stays as it is: %s", e)
        return None
