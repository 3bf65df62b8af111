"""What a finished answer holds, for the faces to show readably: a JSON value, or tool calls.

An answer streams raw; once it is complete, `readable(text)` says whether it holds structure that reads
better another way, and each face draws that its own way (the chat CLI with rich's JSON, the TUI as a
highlighted block):

    the whole answer is a JSON object or array    Readable(value=...)
    (or one fenced block of it, ```json ... ```)
    Qwen's tool calls, each as the model writes it:
        <tool_call>
        {"name": "get_weather", "arguments": {"city": "Paris"}}
        </tool_call>                              Readable(calls=(Call("get_weather", {"city": "Paris"}),),
                                                           text=the free text around them)

A call cut short (no closing tag: max_tokens) is shown when what it holds parses; anything that does not
parse is left as the raw text it is. `pretty()` is the one layout of JSON both faces use.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
FENCE = re.compile(r"```(?:json)?\s*\n(.*)\n\s*```", re.DOTALL | re.IGNORECASE)  # the whole answer, fenced


@dataclass(frozen=True)
class Call:
    name: str
    arguments: Any  # the arguments as parsed JSON (an object, as a rule); as given when a JSON string held them


@dataclass(frozen=True)
class Readable:
    value: Any = None              # the answer's JSON value (an object or array), when the whole answer is one
    calls: tuple[Call, ...] = ()   # the answer's tool calls, in order
    text: str = ""                 # with calls: the free text outside them, stripped


def readable(text: str) -> Readable | None:
    """The structure of a complete answer, or None when it is plain text."""
    stripped = text.strip()
    if fenced := FENCE.fullmatch(stripped):
        stripped = fenced[1].strip()
    if stripped[:1] in ("{", "["):
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, (dict, list)):
            return Readable(value=value)
    calls = tool_calls(text)
    if not calls:
        return None
    return Readable(calls=calls, text=TOOL_CALL.sub("", text).strip())


def tool_calls(text: str) -> tuple[Call, ...]:
    """The tool calls in `text` (Qwen's <tool_call> blocks) that parse as {"name": ..., "arguments": ...}."""
    calls = []
    for body in TOOL_CALL.findall(text):
        try:
            data = json.loads(body)
        except json.JSONDecodeError:
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            continue
        arguments = data.get("arguments", data.get("parameters", {}))
        if isinstance(arguments, str):  # OpenAI's wire form: the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        calls.append(Call(data["name"], arguments))
    return tuple(calls)


def pretty(value: Any) -> str:
    """JSON laid out to read: two-space indents, characters as they are (no \\u escapes)."""
    return json.dumps(value, indent=2, ensure_ascii=False)
