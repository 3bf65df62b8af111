"""Leave the model its cores: the engine's work on one thread of its own, the UI's below it.

On a CPU-only device llama.cpp decodes with a thread per core, and its threads meet at a barrier
after every operation of the graph: a millisecond the UI thread takes from any of those cores
delays the whole decode by about that much (issue 24: on 2 cores the TUI decoded at 0.87-0.97x the
CLI's speed with the UI thread spending 2-4 ms of CPU per token). So the TUI's process runs its UI
below the engine: the UI thread lowers its own scheduling priority to the lowest nice value (19)
and then draws mostly in the gaps the engine leaves, between and around its decodes, instead of in
the middle of them. Not SCHED_IDLE, which it used first: a thread under SCHED_IDLE runs only where a
core would otherwise idle, and on 2 cores a decode leaves so few such moments that the screen stood
still for 2.3-3.7 s at a time in auto and ar; at nice 19 the scheduler still gives the UI a small
share, the screen's longest stand-still is 0.3-0.9 s, and the TUI is as fast against the CLI
(scripts/tui_speed.py terminal --ui-priority idle,nice:19, 150x45, 213 tokens, TUI/CLI medians:
auto 0.944 idle, 0.947 nice 19 over 3 runs; ssd 0.978, 0.976; ar 1.03, 1.05 over 2).

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

A thread below the engine still waits for a core while the model decodes, and a key that must
act at once should not (under SCHED_IDLE Esc stopped an `ar` reply 1.6-11 s after the key). So the
UI lowers itself only once Textual's driver runs (the app's mount), and lowers the driver's writer
thread with it; the driver's input thread, started before, keeps the process's priority, and
`urgent_keys_driver` has it act on the keys that stop work (Esc, Ctrl+Q) the moment they are read,
before the UI thread sees them (Esc to a stopped reply: 0.25-0.46 s).

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


DEFAULT_PRIORITY = "nice:19"
PRIORITY_ENV = "SSD_EDGE_TUI_PRIORITY"  # nice:N (1-19; nice:19 the default), idle (SCHED_IDLE), or normal


def lower_this_thread(how: str | None = None, *, thread_id: int = 0) -> str | None:
    """Put the calling thread (or the thread of native id `thread_id`) below the engine's: `idle` is
    Linux's SCHED_IDLE (it runs when a core would otherwise idle), falling back to nice 19; `nice:N`
    a nice value; `normal` leaves it as it is. Default: $SSD_EDGE_TUI_PRIORITY, else nice:19. Only where
    the OS has per-thread priorities (Linux); elsewhere they would lower the whole process, the
    engine with it. Returns what it did."""
    how = (how or os.environ.get(PRIORITY_ENV) or DEFAULT_PRIORITY).strip().lower()
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
        log.warning("%s=%r is not nice:N, idle or normal: the UI thread's priority stays as it is", PRIORITY_ENV, how)
        return None
    try:
        os.setpriority(os.PRIO_PROCESS, thread_id, max(0, min(19, nice)))  # Linux: that thread alone
        return f"nice {max(0, min(19, nice))}"
    except OSError as e:
        log.info("the UI thread's priority stays as it is: %s", e)
        return None
