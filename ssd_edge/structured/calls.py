"""Tool calls read out of an answer's text, as it streams or whole (the same reader for both).

The reader turns text into three kinds of pieces: Text (the answer's own words, OpenAI's `content`),
CallStart (a call's name is known: its index, id and name) and Arguments (a fragment of the call's
arguments, as the model wrote them). Fed the answer in any chunks, it gives pieces that join to the
same message, which is what makes a streamed call assemble to the call a whole response carries.

    tags   `<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>` (Qwen): text before the
           first call is content; a call's name is out as soon as its head is read, its arguments
           stream as they come, ending where their JSON value closes (a scan of brackets outside
           strings), so the call's own text never reaches content.
    json   `{"tool_calls": [{"name": "f", "arguments": {...}}]}` as the whole answer: an answer that
           starts with "{" is held to its end, then read as calls (names the request's tools) or
           given back as content.

Whitespace is held back until something follows it: leading and trailing blanks around calls are no
content, while an answer without calls comes out byte for byte. A call that never completes (cut by
max_tokens) keeps the arguments it got, one cut before its name was read is dropped; a tag followed
by something other than a call's JSON is given back as content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Collection, Sequence, Union

from .constraint import Grammar
from .template import ChatTemplate
from .tools import CLOSE, OPEN, Format, choose, constraint, format_of, parse_tools


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class Arguments:
    index: int
    text: str


Piece = Union[Text, CallStart, Arguments]
HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class Call:
    id: str
    name: str
    arguments: str = ""

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Reader:
    """One answer's reader: feed() its text as it comes, finish() once; `content` and `calls` hold
    what the pieces said."""

    fmt: Format
    names: Collection[str] = ()          # the json format reads calls of these tools only
    content: str = ""
    calls: list[Call] = field(default_factory=list)
    _state: str = "text"                 # tags: text | head | args | tail; json: text | object | free
    _buf: str = ""
    _depth: int = 0
    _in_string: bool = False
    _escaped: bool = False
    _started: bool = False               # the arguments' first non-blank character was read

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        if self.fmt == "json":
            self._json_text(out)
            return out
        progress = True
        while progress:
            progress = {"text": self._text, "head": self._head, "args": self._args, "tail": self._tail}[self._state](out)
        return out

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        if self.fmt == "json":
            if self._state == "object":
                self._json_object(out)
            elif self._buf:
                self._say(out, self._buf)
        elif self._state == "text" and self._buf and (not self.calls or self._buf.strip()):
            self._say(out, self._buf)
        elif self._state == "head" and self._buf.strip() and not self._buf.lstrip().startswith("{"):
            self._say(out, OPEN + self._buf)  # not a call after all: its text is content
        # (a call cut before its name and arguments were read, by max_tokens or a stop, is dropped)
        self._buf = ""
        return out

    # ------------------------------------------------------------ tags
    def _text(self, out: list[Piece]) -> bool:
        i = self._buf.find(OPEN)
        if i >= 0:
            before, self._buf = self._buf[:i], self._buf[i + len(OPEN):]
            if before.strip():
                self._say(out, before.rstrip())
            self._state = "head"
            return True
        keep = _partial_suffix(self._buf, OPEN)  # the start of a call's tag, or blanks: wait for more
        stripped = self._buf[:len(self._buf) - keep].rstrip()
        if stripped:
            self._say(out, stripped)
            self._buf = self._buf[len(stripped):]
        return False

    def _head(self, out: list[Piece]) -> bool:
        m = HEAD.match(self._buf)
        if m is not None and m.end() < len(self._buf):  # the blanks after the colon are all read
            self._start(out, json.loads(m.group(1)))
            self._buf, self._state = self._buf[m.end():], "args"
            self._depth, self._in_string, self._escaped, self._started = 0, False, False, False
            return True
        j = self._buf.find(CLOSE)
        if j < 0:
            return False
        body, self._buf = self._buf[:j], self._buf[j + len(CLOSE):]
        call = _parsed(body)
        if call is None:  # not a call: its text is content
            self._say(out, OPEN + body + CLOSE)
        else:
            self._start(out, call[0])
            self._args_piece(out, call[1])
        self._state = "text"
        return True

    def _args(self, out: list[Piece]) -> bool:
        """Arguments up to the end of their JSON value: a bracket scan outside strings."""
        end = None
        for i, ch in enumerate(self._buf):
            if not self._started:
                if ch.isspace():
                    continue
                self._started = True
            if self._in_string:  # a string's brackets are text; \" does not end it
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
                continue
            if ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]" or (ch == "," and self._depth == 0):
                if self._depth == 0:  # the body's own brace or comma after a bare value
                    end = i
                    break
                self._depth -= 1
                if self._depth == 0:
                    end = i + 1
                    break
        taken = self._buf if end is None else self._buf[:end]
        self._args_piece(out, taken.lstrip() if not self.calls[-1].arguments else taken)
        if end is None:
            self._buf = ""
            return False
        self._buf, self._state = self._buf[end:], "tail"
        return True

    def _tail(self, out: list[Piece]) -> bool:
        j = self._buf.find(CLOSE)
        if j < 0:
            return False
        self._buf, self._state = self._buf[j + len(CLOSE):], "text"
        return True

    # ------------------------------------------------------------ json
    def _json_text(self, out: list[Piece]) -> None:
        if self._state == "object" or not self._buf.strip():
            return  # an object is read at the end; blanks only: the answer may still open one
        if self._state == "text" and self._buf.lstrip().startswith("{"):
            self._state = "object"
            return
        self._state = "free"  # no call: text as it comes
        self._say(out, self._buf)
        self._buf = ""

    def _json_object(self, out: list[Piece]) -> None:
        try:
            data = json.loads(self._buf)
        except ValueError:
            data = None
        calls = data.get("tool_calls") if isinstance(data, dict) and len(data) == 1 else None
        ok = isinstance(calls, list) and calls and all(
            isinstance(c, dict) and set(c) == {"name", "arguments"} and c["name"] in self.names for c in calls)
        if not ok:
            self._say(out, self._buf)
            return
        for c in calls:
            self._start(out, c["name"])
            self._args_piece(out, json.dumps(c["arguments"], ensure_ascii=False))

    # ------------------------------------------------------------ pieces
    def _say(self, out: list[Piece], text: str) -> None:
        self.content += text
        out.append(Text(text))

    def _start(self, out: list[Piece], name: str) -> None:
        self.calls.append(Call(call_id(), name))
        out.append(CallStart(len(self.calls) - 1, self.calls[-1].id, name))

    def _args_piece(self, out: list[Piece], text: str) -> None:
        if text:
            self.calls[-1].arguments += text
            out.append(Arguments(len(self.calls) - 1, text))


def _partial_suffix(text: str, tag: str) -> int:
    """How many of text's last characters may start `tag` (or are blanks before where it may come)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n + (len(text) - n - len(text[:-n].rstrip()))
    return len(text) - len(text.rstrip())


def _parsed(body: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a whole call body written other than as the head expects."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or "arguments" not in data:
        return None
    return data["name"], json.dumps(data["arguments"], ensure_ascii=False)


def read(text: str, fmt: Format, names: Collection[str] = ()) -> Reader:
    """A whole answer read at once: .content and .calls."""
    reader = Reader(fmt, names)
    reader.feed(text)
    reader.finish()
    return reader


@dataclass(frozen=True)
class Tools:
    """The Python API's tools (Engine.generate's constraint=Tools(...)): OpenAI's tool list, tool_choice and
    parallel_tool_calls. The engine renders them into the chat's prompt with the model's own template and
    holds the answer to the call grammar that tool_choice asks for; read(text) gives the answer's content
    and calls (Completion.tool_calls)."""

    tools: Sequence[dict[str, Any]]
    choice: Any = "auto"
    parallel: bool = True
    field: str = "tools"

    @property
    def offered(self) -> bool:
        """Whether the tools reach the prompt and calls are read: not under "none", which answers as if
        there were no tools (as the server does)."""
        return self.choice != "none"

    def grammar(self, template: ChatTemplate | None) -> Grammar | None:
        return constraint(choose(parse_tools(self.tools), self.choice), format_of(template), self.parallel)

    def read(self, text: str, template: ChatTemplate | None) -> tuple[str, list[dict[str, Any]]]:
        if not self.offered:
            return text, []
        reader = Reader(format_of(template), [t.name for t in parse_tools(self.tools)])
        reader.feed(text)
        reader.finish()
        return reader.content, [c.as_openai() for c in reader.calls]
