"""Messages that worker threads post to the app. Workers post these and nothing
else; the handlers run on the UI thread, the only thread that touches widgets."""

from __future__ import annotations

import logging
from typing import Any, Callable

from textual.message import Message


class StreamWake(Message):
    """The generation outbox went from empty to non-empty: drain it."""


class EngineLoaded(Message):
    def __init__(self, engine: Any) -> None:
        super().__init__()
        self.engine = engine


class EngineFailed(Message):
    """Building the engine failed. `missing` lists catalog models that are not
    downloaded yet (the user can pull them); otherwise `error` is one line."""

    def __init__(self, error: str, exit_code: int, missing: list[Any]) -> None:
        super().__init__()
        self.error = error
        self.exit_code = exit_code
        self.missing = missing


class PullProgress(Message):
    def __init__(self, label: str, done: int, total: int) -> None:
        super().__init__()
        self.label = label
        self.done = done
        self.total = total


class PullFinished(Message):
    def __init__(self, error: str | None) -> None:
        super().__init__()
        self.error = error


class LogNotice(Message):
    """A warning or error that the engine logged (from any thread), shown as a notification."""

    def __init__(self, text: str, error: bool) -> None:
        super().__init__()
        self.text = text
        self.error = error


class NoticeHandler(logging.Handler):
    """Forwards ssd_edge's warnings to the app; the terminal belongs to the app, so
    the engine's log lines would otherwise go unseen (they also go to the log file)."""

    def __init__(self, post: Callable[[Message], Any]) -> None:
        super().__init__(logging.WARNING)
        self.post = post

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.post(LogNotice(record.getMessage(), record.levelno >= logging.ERROR))
        except Exception:  # a closing app: nothing to show it on
            self.handleError(record)
