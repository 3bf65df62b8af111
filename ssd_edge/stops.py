"""Stop rules beyond stop strings: llama-server's `n_indent` and `t_max_predict_ms`, which editors send.

A rule reads the answer's text so far and the seconds since its first token, and says where to cut the
text (an index into it) or None to go on. generation.StopText asks each rule after every token, once no
stop string has ended the answer; a rule that fires ends it as a stop string does (stop_reason "stop"),
with no stop word (FinishEvent.stop_word None). Rules travel in generate()'s `stop` beside the strings.
Both are frozen and read only their arguments: one rule may serve any number of generations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@runtime_checkable
class StopRule(Protocol):
    def cut(self, text: str, since_first_s: float) -> int | None:
        """Where to cut `text` and end the answer, or None to go on."""


@dataclass(frozen=True)
class IndentLimit:
    """n_indent (llama-server's rule): a line after the answer's first whose first character past its spaces
    and tabs (any character, a line break too) stands left of column `n` ends the answer, cut before that
    character (the line's indentation stays, as llama-server leaves it). An editor sends the cursor's
    indentation: the completion ends where the block does."""

    n: int

    def cut(self, text: str, since_first_s: float) -> int | None:
        nl = text.find("\n")
        while nl >= 0:
            pos = start = nl + 1
            while pos < len(text) and text[pos] in " \t":
                pos += 1
            if pos < len(text) and pos - start < self.n:
                return pos
            nl = text.find("\n", start)
        return None


@dataclass(frozen=True)
class TimeLimit:
    """t_max_predict_ms (llama-server's rule): past `ms` milliseconds from the first token, the answer ends
    as soon as its text holds a line break (an editor shows whole lines; a line still being written goes on)."""

    ms: float

    def cut(self, text: str, since_first_s: float) -> int | None:
        return len(text) if since_first_s * 1e3 > self.ms and "\n" in text else None
