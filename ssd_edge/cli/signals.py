"""Ctrl-C and SIGTERM for the command line.

Two behaviours, for two kinds of work:

- `terminate_as_interrupt()` (the whole process): SIGTERM raises `Terminated`,
  a KeyboardInterrupt, so every cleanup written for Ctrl-C (finally blocks,
  catalog.pull removing its partial file, subprocess.run killing pip) runs on
  SIGTERM too.
- `CancelOnSignal(event)` (while a generation runs): SIGINT and SIGTERM only set
  `event`; the engine checks it between rounds (and between prompt chunks) and
  finishes with stop_reason "cancelled", joining its worker thread on the way.
  With force=True a second Ctrl-C raises KeyboardInterrupt, for a process
  that will exit anyway and whose user will not wait (the chat, which keeps
  its engine, waits for the round to end instead).

Python runs signal handlers in the main thread only, so both are no-ops
elsewhere (e.g. in a worker thread of a test runner).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143   # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be."""


def exit_code(signum: int | None) -> int:
    return EXIT_TERMINATED if signum == signal.SIGTERM else EXIT_INTERRUPTED


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    if not _main_thread():
        yield
        return

    def raise_terminated(signum: int, frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class CancelOnSignal:
    """with CancelOnSignal(cancel) as sig: ...generate(cancel=cancel)...; sig.signum says which signal came."""

    def __init__(self, event: threading.Event, force: bool = True) -> None:
        self.event = event
        self.force = force
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.force and self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt()  # second Ctrl-C: stop waiting
        if self.signum is None:
            self.signum = signum
        self.event.set()

    def __enter__(self) -> "CancelOnSignal":
        if _main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)
