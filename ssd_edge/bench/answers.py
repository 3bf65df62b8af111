"""A structured answer checked against what its prompt asked, the same way for ssd-edge's runs and for
llama-server's (peer_server.py): a validator other than the grammar that made the answer (the
`jsonschema` package, not llguidance), so a grammar that lets a wrong answer through is caught here.

    json_object   the answer is one JSON object
    json_schema   the answer is JSON that validates against the schema
    tools         the answer read as calls (calls.Reader, as the server reads it): at least one call
                  where tool_choice asks for one ("required", a named function), at most one where
                  parallel_tool_calls is false, no text beside them, and each call names an offered tool
                  whose parameters schema its arguments validate against

check() gives (valid, why): why is None where the answer is valid, else the first thing wrong in a few
words (the part of the answer or of the schema at fault).
"""

from __future__ import annotations

import json
from typing import Any

from ..structured.constraint import JsonObject, JsonSchema
from ..structured.request import Shape

Check = tuple[bool, str | None]


def check(shape: Shape, text: str, parallel: bool = True) -> Check:
    """Whether `text`, a whole answer, is what `shape` asked for (parallel: parallel_tool_calls)."""
    if shape.choice is not None:
        return _calls(shape, text, parallel)
    c = shape.constraint
    if isinstance(c, JsonSchema):
        return _json(text, c.schema)
    if isinstance(c, JsonObject):
        return _json(text, {"type": "object"})
    raise ValueError(f"no check for the constraint {c!r}")  # the bench's prompts hold JSON or tools only


def _json(text: str, schema: dict[str, Any]) -> Check:
    try:
        value = json.loads(text)
    except ValueError as e:
        return False, f"not JSON: {e}"
    return _validates(value, schema, "the answer")


def _validates(value: Any, schema: dict[str, Any], what: str) -> Check:
    from jsonschema import exceptions, validators

    cls = validators.validator_for(schema)
    try:
        error = exceptions.best_match(cls(schema).iter_errors(value))
    except exceptions.SchemaError as e:  # llguidance took it; jsonschema cannot check against it
        return False, f"{what}: the schema is not one jsonschema reads: {e.message}"
    if error is None:
        return True, None
    where = "".join(f"[{p!r}]" for p in error.absolute_path)
    return False, f"{what}{where}: {error.message}"


def _calls(shape: Shape, text: str, parallel: bool) -> Check:
    reader = shape.reader()
    assert reader is not None and shape.choice is not None
    reader.feed(text)
    reader.finish()
    calls, tools = reader.calls, {t.name: t for t in shape.choice.tools}
    if shape.choice.kind in ("required", "named") and not calls:
        return False, "no tool call (tool_choice asks for one)"
    if not parallel and len(calls) > 1:
        return False, f"{len(calls)} tool calls (parallel_tool_calls is false)"
    if shape.choice.kind in ("required", "named") and reader.content.strip():
        return False, f"text beside the calls: {reader.content.strip()[:40]!r}"
    for i, call in enumerate(calls):
        tool = tools.get(call.name)
        if tool is None:
            return False, f"call {i} names {call.name!r}, not an offered tool"
        try:
            args = json.loads(call.arguments)
        except ValueError as e:
            return False, f"call {i} ({call.name}): arguments are not JSON: {e}"
        ok, why = _validates(args, tool.parameters, f"call {i} ({call.name}) arguments")
        if not ok:
            return False, why
    return True, None
