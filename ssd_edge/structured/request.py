"""What an OpenAI request asks its answer to look like: response_format, or tools with tool_choice
(the server's requests and the bench's prompts read the same fields here, into the same Shape).

    response_format {"type": "text"}                      free text (the default)
                    {"type": "json_object"}               any JSON object
                    {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
                                                          an object that fits the schema; strict refuses
                                                          a keyword llguidance cannot enforce
    tools, tool_choice                                    structured/tools.py

A request gives one or the other: the grammar of a call and the grammar of a final answer are not
combined (under tool_choice "none" a response_format applies). Every mistake is a ConstraintError
naming its field; check() compiles the grammar for the model's tokenizer before the request is
queued, so a schema llguidance refuses is a 400 with its message, streamed or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import calls, tools
from .constraint import Constraint, ConstraintError, JsonObject, JsonSchema, compile
from .template import ChatTemplate
from .tools import needs_template


@dataclass(frozen=True)
class Shape:
    constraint: Constraint | None = None
    choice: tools.Choice | None = None        # tools offered (and not "none"): calls are read from the answer
    fmt: tools.Format = "tags"
    listed: list[dict[str, Any]] | None = None  # the tools the prompt lists

    def reader(self) -> calls.Reader | None:
        """A fresh reader for one answer (None: the answer is all content)."""
        if self.choice is None:
            return None
        return calls.Reader(self.fmt, {t.name for t in self.choice.tools})


def read(response_format: dict[str, Any] | None, raw_tools: list[Any] | None, tool_choice: Any,
         template: ChatTemplate | None, parallel: bool = True) -> Shape:
    answer = _response_format(response_format)
    if not raw_tools:
        if tool_choice not in (None, "none"):
            raise ConstraintError("tool_choice", "there are no tools to choose from")
        return Shape(answer)
    offered = tools.parse_tools(raw_tools)
    choice = tools.choose(offered, tool_choice)
    if choice.kind == "none":
        return Shape(answer)
    if answer is not None:
        raise ConstraintError("response_format", "give tools or a response_format, not both (a response_format "
                              "applies with tool_choice \"none\")")
    fmt = tools.format_of(template)
    return Shape(tools.constraint(choice, fmt, parallel), choice, fmt, [t.as_openai() for t in offered])


def _response_format(rf: dict[str, Any] | None) -> Constraint | None:
    if rf is None:
        return None
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return JsonObject(field="response_format")
    if kind != "json_schema":
        raise ConstraintError("response_format.type", f"choose text, json_object or json_schema, got {kind!r}")
    spec = rf.get("json_schema")
    if not isinstance(spec, dict):
        raise ConstraintError("response_format.json_schema", "give {\"name\": ..., \"schema\": {...}, \"strict\": "
                              "true|false}")
    if "name" in spec and not isinstance(spec["name"], str):
        raise ConstraintError("response_format.json_schema.name", "a string")
    strict = spec.get("strict", False)
    if not isinstance(strict, bool) and strict is not None:
        raise ConstraintError("response_format.json_schema.strict", f"true or false, got {strict!r}")
    if "schema" not in spec:
        raise ConstraintError("response_format.json_schema.schema", "give the JSON schema")
    return JsonSchema(spec["schema"], strict=bool(strict), field="response_format.json_schema.schema")


def prompt_tokens(engine: Any, messages: list[dict[str, Any]], shape: Shape) -> list[int]:
    """The chat's prompt tokens under `shape`: the model's own template with the tools the prompt lists
    (or a history of calls and results), else llama.cpp's renderer, as for a plain chat before tools
    existed. `engine` is an ssd_edge Engine (render_chat, tokenize, prompt_tokens); a template that
    cannot render the messages raises ConstraintError."""
    if shape.listed or needs_template(messages):
        return engine.tokenize(engine.render_chat(messages, shape.listed), parse_special=True)
    return engine.prompt_tokens(None, messages)


def check(shape: Shape, tokenizer: Any) -> None:
    """Compile the shape's grammar (each tool's arguments first, so a bad one is named)."""
    if shape.choice is not None:
        tools.check(shape.choice, tokenizer)
    if shape.constraint is not None:
        compile(shape.constraint, tokenizer)
