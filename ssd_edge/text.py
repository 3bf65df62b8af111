"""Committed tokens -> text deltas, holding back what could still be the start of a stop string."""

from __future__ import annotations

from typing import Sequence

from .interface import BackendModel, TextStream


class StopText:
    """The answer's text as tokens commit: push() each token, take() what may be shown now,
    finish() the rest at the end. Cut at the earliest stop string (one may end inside another)."""

    def __init__(self, model: BackendModel, stop: Sequence[str]) -> None:
        self.stream = TextStream(model)
        self.stop = [s for s in stop if s]
        self.text = ""
        self.sent = 0
        self.stopped = False

    def push(self, token: int) -> None:
        self.text += self.stream.push(token)
        hits = [i for s in self.stop if (i := self.text.find(s, max(0, self.sent - len(s)))) >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            self.stopped = True

    def take(self) -> str:
        hold = 0
        if not self.stopped:
            for s in self.stop:
                for n in range(min(len(s) - 1, len(self.text) - self.sent), 0, -1):
                    if self.text.endswith(s[:n]):
                        hold = max(hold, n)
                        break
        out = self.text[self.sent: len(self.text) - hold]
        self.sent += len(out)
        return out

    def finish(self) -> str:
        """The text not yet handed out (held-back stop-string prefixes, a last partial character)."""
        if not self.stopped:
            self.text += self.stream.flush()
        out = self.text[self.sent:]
        self.sent = len(self.text)
        return out
