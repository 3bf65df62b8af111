"""What an answer must look like: a JSON schema, any JSON object, a regex or a grammar.

A constraint is a small frozen value that names the shape; compile() turns it into an llguidance
grammar for one tokenizer and checks it there, so a bad schema or grammar fails before any token is
drawn, with llguidance's own message (ConstraintError names the field it came from). JSON is rigid:
", " between items, ": " after keys, no other whitespace. That is what leaves the grammar one
choice so often (a key, a quote, a separator) that its forced tokens ride the next verify for free
(forced.py); llguidance's default, free whitespace, would leave almost none.

    JsonSchema(schema, strict=False)   an object that fits the schema; strict: refuse a keyword llguidance
                                       cannot enforce (OpenAI's strict), else compile it leniently
    JsonObject()                       any JSON object
    Regex(pattern)                     text that matches the whole pattern
    Grammar(text, syntax="lark")       a Lark grammar (llguidance's dialect) or llama.cpp's GBNF ("gbnf");
                                       trigger: a special token's text from which the grammar applies (the
                                       text before it is free; tool calls under tool_choice "auto")
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from ..errors import ConfigError

# JSON as ssd-edge writes it: the separators OpenAI's and Python's json.dumps use, no free whitespace
RIGID = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class ConstraintError(ConfigError):
    """A schema, regex, grammar or tool that cannot be enforced; `field` names where it came from
    (a request's field, a CLI flag), the message is llguidance's."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.detail = message


@dataclass(frozen=True)
class JsonSchema:
    schema: dict[str, Any]
    strict: bool = False
    field: str = "json_schema"  # where it came from, for error messages

    def source(self) -> str:
        if not isinstance(self.schema, dict):
            raise ConstraintError(self.field, f"a JSON schema is an object, not {type(self.schema).__name__}")
        from llguidance import LLMatcher

        try:
            return LLMatcher.grammar_from_json_schema(self.schema, overrides={**RIGID, "lenient": not self.strict})
        except (ValueError, TypeError) as e:
            raise ConstraintError(self.field, str(e)) from None


@dataclass(frozen=True)
class JsonObject:
    field: str = "json_object"

    def source(self) -> str:
        return JsonSchema({"type": "object"}, field=self.field).source()


@dataclass(frozen=True)
class Regex:
    pattern: str
    field: str = "regex"

    def source(self) -> str:
        from llguidance import LLMatcher

        return LLMatcher.grammar_from_regex(self.pattern)


@dataclass(frozen=True)
class Grammar:
    text: str
    syntax: Literal["lark", "gbnf"] = "lark"
    trigger: str | None = None  # one token's text (a special token's): the grammar applies from it on (it included)
    field: str = "grammar"

    def source(self) -> str:
        from llguidance import LLMatcher, grammar_from

        if self.syntax == "gbnf":
            try:
                return grammar_from("gbnf", self.text)
            except Exception as e:  # the converter raises on what it cannot parse
                raise ConstraintError(self.field, f"GBNF: {e}") from None
        if self.syntax != "lark":
            raise ConstraintError(self.field, f"unknown grammar syntax {self.syntax!r} (lark or gbnf)")
        return LLMatcher.grammar_from_lark(self.text)


Constraint = Union[JsonSchema, JsonObject, Regex, Grammar]


@dataclass(frozen=True)
class Compiled:
    """A constraint checked against one tokenizer: the llguidance grammar and its trigger token."""

    grammar: str
    trigger: int | None = None
    constraint: Constraint | None = field(default=None, compare=False)


def compile(constraint: Constraint, tokenizer: Any) -> Compiled:
    """The constraint's llguidance grammar, validated for `tokenizer` (an llguidance LLTokenizer);
    ConstraintError with llguidance's message where it does not compile."""
    from llguidance import LLMatcher

    grammar = constraint.source()
    fail, messages = LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if fail:
        raise ConstraintError(constraint.field, _first_line(messages[0]))
    trigger = None
    if isinstance(constraint, Grammar) and constraint.trigger is not None:
        ids = tokenizer.tokenize_str(constraint.trigger, parse_special=True)
        if len(ids) != 1:
            raise ConstraintError(constraint.field, f"the trigger {constraint.trigger!r} is not one token of this "
                                                    "model's vocabulary")
        trigger = ids[0]
    return Compiled(grammar, trigger, constraint)


def _first_line(message: str) -> str:
    """llguidance's message without its source excerpt (a regex's caret lines): the first lines that say
    what is wrong, on one line."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    keep = [ln for ln in lines if not set(ln) <= set("^ ") and not ln[:1].isdigit()]
    return " ".join(keep[:3]) if keep else message.strip()


def parse_schema(text: str, field: str) -> dict[str, Any]:
    """A JSON schema given as text (a CLI flag, a file's contents): the object, or ConstraintError."""
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConstraintError(field, f"not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise ConstraintError(field, "a JSON schema is a JSON object")
    return schema
