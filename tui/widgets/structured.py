"""A finished answer that holds JSON or tool calls, as the chat column shows it (the raw text streams
first; ssd_edge.structured.readable says what the whole answer holds).

A JSON answer is laid out and highlighted in place of its raw line; a tool call shows as its name and its
arguments laid out, below whatever the model wrote around it."""

from __future__ import annotations

from rich.json import JSON
from rich.style import Style
from rich.text import Text

from ssd_edge.structured.readable import pretty, readable


def readable_text(answer: str, label: Style) -> Text | None:
    """The answer drawn readably (`label`: the style of the "tool call" labels), or None for plain text."""
    shape = readable(answer)
    if shape is None:
        return None
    if not shape.calls:
        return JSON(pretty(shape.value)).text
    out = Text(overflow="fold")
    if shape.text:
        out.append(shape.text + "\n")
    for i, call in enumerate(shape.calls):
        out.append(("\n" if i else "") + "⚙ tool call ", label)
        out.append(call.name + "\n", "bold")
        out.append_text(JSON(pretty(call.arguments)).text)
    return out
