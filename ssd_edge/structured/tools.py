"""OpenAI tools in, the prompt and the grammar of a call out.

Two formats, chosen by the model's chat template (ChatTemplate.calls_tools_in_tags):

    tags   Qwen's (Hermes') format, where the template knows tools: the template renders them, and a
           call is `<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>`, several separated
           by "\\n". `<tool_call>` is one special token, so under tool_choice "auto" the answer is free
           text until the model emits it, and the call's grammar from there (Grammar's trigger).
    json   any other template (or none): the tools are described in a system message, and a call is
           the whole answer `{"tool_calls": [{"name": "f", "arguments": {...}}]}`. Without a special
           token to start from, "auto" leaves the answer free and reads a call out of it afterwards.

tool_choice:
    "auto"       (the default with tools) free text or calls
    "required"   at least one call, forced by the grammar
    {"type": "function", "function": {"name": "f"}}   a call of f only
    "none"       no call: the tools are left out of the prompt (history calls and results still
                 render), and no grammar applies, so the answer is what the model says to the same
                 chat without tools. (OpenAI keeps them in the prompt; a model shown tools here would
                 be tempted into a call that a grammar would then have to forbid at every token.)

Every argument schema is compiled on its own first (check()), so a bad one is named by its field,
e.g. `tools[1].function.parameters`, with llguidance's message.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, Sequence

from .constraint import RIGID, ConstraintError, Grammar, JsonSchema, compile
from .template import ChatTemplate

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
OPEN, CLOSE = "<tool_call>", "</tool_call>"
Format = Literal["tags", "json"]


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict[str, Any]   # the arguments' JSON schema
    description: str | None = None
    strict: bool = False
    index: int = 0               # its place in the request's `tools`, for error messages

    @property
    def field(self) -> str:
        return f"tools[{self.index}].function.parameters"

    def as_openai(self) -> dict[str, Any]:
        """The tool as a template renders it (OpenAI's shape, the parameters as given)."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = self.parameters
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class Choice:
    """Which calls an answer may or must make."""

    kind: Literal["auto", "none", "required", "named"]
    tools: tuple[Tool, ...]      # the tools a call may name (the named one alone for "named")


NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


def parse_tools(raw: Sequence[Any]) -> list[Tool]:
    """OpenAI's `tools` as Tools; ConstraintError naming the field at fault."""
    out: list[Tool] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(item, dict) or item.get("type", "function") != "function":
            raise ConstraintError(f"{where}.type", "each tool is {\"type\": \"function\", \"function\": {...}}")
        fn = item.get("function")
        if not isinstance(fn, dict):
            raise ConstraintError(f"{where}.function", "give the function: {\"name\": ..., \"parameters\": {...}}")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ConstraintError(f"{where}.function.name", "a name of 1 to 64 letters, digits, '_' or '-' is "
                                  f"required, got {name!r}")
        if name in seen:
            raise ConstraintError(f"{where}.function.name", f"{name!r} is also the name of tools[{seen[name]}]")
        seen[name] = i
        params = fn.get("parameters", NO_ARGUMENTS)
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise ConstraintError(f"{where}.function.parameters", "the arguments' schema must be a JSON schema "
                                  "of type object")
        desc = fn.get("description")
        out.append(Tool(name, params, desc if isinstance(desc, str) else None, fn.get("strict") is True, i))
    return out


def choose(tools: Sequence[Tool], tool_choice: Any) -> Choice:
    """tool_choice (None: "auto" with tools) as a Choice; ConstraintError for an unknown tool."""
    if tool_choice is None:
        tool_choice = "auto"
    if isinstance(tool_choice, str):
        if tool_choice not in ("auto", "none", "required"):
            raise ConstraintError("tool_choice", f"choose auto, none, required or a function, got {tool_choice!r}")
        if tool_choice != "none" and not tools:
            raise ConstraintError("tool_choice", f"{tool_choice!r} needs tools; none were given")
        return Choice(tool_choice, tuple(tools))  # type: ignore[arg-type]
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise ConstraintError("tool_choice", "a function is named as {\"type\": \"function\", \"function\": "
                              "{\"name\": ...}}")
    named = [t for t in tools if t.name == name]
    if not named:
        known = ", ".join(t.name for t in tools) or "none"
        raise ConstraintError("tool_choice.function.name", f"no tool is named {name!r} (tools: {known})")
    return Choice("named", tuple(named))


def format_of(template: ChatTemplate | None) -> Format:
    return "tags" if template is not None and template.calls_tools_in_tags else "json"


# ---------------------------------------------------------------- the grammar

def _arguments(tool: Tool) -> dict[str, Any]:
    """The arguments' schema with ssd-edge's rigid JSON (llguidance's x-guidance options)."""
    return {**tool.parameters, "x-guidance": {**RIGID, "lenient": not tool.strict}}


def check(choice: Choice, tokenizer: Any) -> None:
    """Compile each argument schema alone: a bad one fails here, named by its field."""
    for tool in choice.tools:
        compile(JsonSchema(tool.parameters, strict=tool.strict, field=tool.field), tokenizer)


def constraint(choice: Choice, fmt: Format, parallel: bool = True) -> Grammar | None:
    """The grammar the answer follows (None: the answer is free); parallel=False: one call at most
    (OpenAI's parallel_tool_calls)."""
    if choice.kind == "none" or (fmt == "json" and choice.kind == "auto"):
        return None
    rules = [f"fn_{i}: {json.dumps(_head(t))} args_{i} \"}}\"\nargs_{i}: %json {json.dumps(_arguments(t))}"
             for i, t in enumerate(choice.tools)]
    call = " | ".join(f"fn_{i}" for i in range(len(choice.tools)))
    if fmt == "tags":
        more = ' ("\\n" call)*' if parallel else ""  # a line break may end the answer too, as the templates write
        text = (f'start: call{more} "\\n"?\ncall: {OPEN} "\\n" body "\\n" {CLOSE}\nbody: {call}\n' + "\n".join(rules))
        return Grammar(text, trigger=OPEN if choice.kind == "auto" else None, field="tools")
    more = ' (", " body)*' if parallel else ""
    text = (f'start: "{{\\"tool_calls\\": [" body{more} "]}}"\n' f"body: {call}\n" + "\n".join(rules))
    return Grammar(text, field="tools")


def _head(tool: Tool) -> str:
    """A call's text before its arguments (the name is a literal: one choice per tool)."""
    return f'{{"name": {json.dumps(tool.name)}, "arguments": '


# ---------------------------------------------------------------- the prompt

def prompt_messages(messages: Sequence[dict[str, Any]], choice: Choice | None, fmt: Format
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) to render. tags: as given, for the template (tools None under "none").
    json: plain role/text messages (calls and results written as text), the tools described in the
    system message, for any renderer."""
    offered = [t.as_openai() for t in choice.tools] if choice is not None and choice.kind != "none" else None
    if fmt == "tags":
        return list(messages), offered
    out = [_as_text(m) for m in messages]
    if offered:
        described = _describe([t for t in choice.tools])  # type: ignore[union-attr]
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{described}"}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out, None


def _describe(tools: Sequence[Tool]) -> str:
    lines = "\n".join(json.dumps(t.as_openai()["function"], ensure_ascii=False) for t in tools)
    return ("You can call these functions (their arguments are JSON schemas):\n" + lines + "\n\nTo call "
            "functions, answer with only a JSON object: {\"tool_calls\": [{\"name\": <function name>, "
            "\"arguments\": <arguments object>}]}. Otherwise answer in plain text.")


def _as_text(m: dict[str, Any]) -> dict[str, str]:
    """One message as role and text, for templates that know no tools."""
    content = m.get("content") or ""
    if m["role"] == "tool":
        who = m.get("name") or m.get("tool_call_id") or "a function"
        return {"role": "user", "content": f"The result of {who}: {content}"}
    calls = m.get("tool_calls")
    if calls:
        fns = [c.get("function", c) for c in calls]
        body = [{"name": f.get("name"), "arguments": _object(f.get("arguments"))} for f in fns]
        text = json.dumps({"tool_calls": body}, ensure_ascii=False)
        content = f"{content}\n{text}" if content else text
    return {"role": m["role"], "content": content}


def _object(args: Any) -> Any:
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


def render(template: ChatTemplate | None, plain: Any, messages: Sequence[dict[str, Any]],
           tools: Sequence[dict[str, Any]] | None) -> str:
    """The prompt of a chat with tools or tool messages: the model's own template where it knows
    `<tool_call>`, else `plain` (llama.cpp's renderer) over messages made text (prompt_messages)."""
    fmt = format_of(template)
    offered = parse_tools(tools or [])
    msgs, listed = prompt_messages(messages, Choice("auto", tuple(offered)) if offered else None, fmt)
    if fmt == "tags":
        assert template is not None
        return template.render(msgs, listed)
    return plain(msgs)


def needs_template(messages: Sequence[dict[str, Any]]) -> bool:
    """Whether the history holds tool calls or results (which llama.cpp's renderer cannot take)."""
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)

