"""Progress of a long command (bench, calibrate, the first-use calibration) on
stderr: a redrawn bar on a terminal; in a log or a pipe, where a bar would show
nothing until the end, one plain line as each step begins:

    [3/14 0:01:12] separate: sd · code-fizzbuzz
    [40% 0:00:09] calibrating: running both at once, 1+1 threads

A Task counts units of work (total=N: begin() one, done() when it ends) or
follows a fraction (at(what, fraction))."""

from __future__ import annotations

import datetime as dt
import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as Bar


class Progress:
    """Tasks shown on `console`: as rich bars when it is a terminal, as plain lines otherwise."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.t0 = time.perf_counter()
        self.bar: Bar | None = None
        if console.is_terminal:
            self.bar = Bar(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[position]}"),
                           TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True)

    def __enter__(self) -> Progress:
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.bar is not None:
            self.bar.__exit__(kind, exc, tb)

    def task(self, what: str, total: int | None = None, visible: bool = True) -> Task:
        """A counted task (total units) or, with total None, a fraction from 0 to 1."""
        return Task(self, what, total, visible)

    def line(self, position: str, what: str) -> None:
        """One plain progress line (not on a terminal)."""
        clock = dt.timedelta(seconds=int(time.perf_counter() - self.t0))
        self.console.print(f"[{position} {clock}] {what}", markup=False, highlight=False, soft_wrap=True)


class Task:
    def __init__(self, owner: Progress, what: str, total: int | None, visible: bool) -> None:
        self.owner, self.total, self.what = owner, total, what
        self.completed = 0.0
        self.id: TaskID | None = None
        if owner.bar is not None:
            self.id = owner.bar.add_task(what, total=total or 1.0, visible=visible, position=self._position())

    def _position(self, completed: float | None = None) -> str:
        done = self.completed if completed is None else completed
        return f"{int(done)}/{self.total}" if self.total is not None else f"{done:.0%}"

    def begin(self, what: str) -> None:
        """A unit of a counted task starts: `what` it is."""
        self.what = what
        if self.owner.bar is not None and self.id is not None:
            self.owner.bar.update(self.id, description=what)
        else:
            self.owner.line(f"{int(self.completed) + 1}/{self.total}", what)

    def done(self, units: int = 1) -> None:
        """Units of a counted task have ended."""
        self.completed += units
        if self.owner.bar is not None and self.id is not None:
            self.owner.bar.update(self.id, completed=self.completed, position=self._position())

    def at(self, what: str, fraction: float, visible: bool = True) -> None:
        """Where a fractional task is: doing `what`, `fraction` (0..1) of the way. A plain line is
        printed when `what` changes."""
        changed = what != self.what
        self.what, self.completed = what, fraction
        if self.owner.bar is not None and self.id is not None:
            self.owner.bar.update(self.id, description=what, completed=fraction, visible=visible,
                                  position=self._position())
        elif changed and visible:
            self.owner.line(self._position(), what)
