"""Messages that worker threads post to the app. Workers post these and nothing
else; the handlers run on the UI thread, the only thread that touches widgets."""

from __future__ import annotations

from typing import Any

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
