"""Structured output on the default Qwen pair: with a JSON schema and with a tool call, every mode gives
mode ar's tokens, greedy; a difference passes only as a proven near-tie of the shaped rows (the target's
batched and one-token rows differ slightly: tests/lossless_check.py, check_constrained)."""

from __future__ import annotations

import json

import pytest

from conftest import make_engine
from lossless_check import check_constrained, generate
from ssd_edge.structured import JsonSchema, Tools

pytestmark = pytest.mark.default_pair

EXTRACT = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                            "city": {"type": "string"},
                                            "languages": {"type": "array", "items": {"type": "string"}}},
           "required": ["name", "age", "city", "languages"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Extract as JSON: Maria Lopez, 34, lives in Seville and codes in Rust, Go and "
                                   "Python."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"},
                                               "unit": {"enum": ["celsius", "fahrenheit"]}},
                                               "required": ["city", "unit"]}}}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


@pytest.fixture(scope="module")
def qwen(default_pair):
    eng = make_engine(default_pair)
    eng.load_draft()
    yield eng
    eng.close()


@pytest.mark.timeout(900)
def test_every_mode_is_ars_under_a_schema_default_pair(qwen):
    prompt = qwen.tokenize(qwen.render_chat(ASK), parse_special=True)
    ar = generate(qwen, prompt, "ar", 48, None, JsonSchema(EXTRACT))
    obj = json.loads(b"".join(qwen.piece(t) for t in ar.out).decode())
    assert obj["age"] == 34 and obj["city"] == "Seville"
    compared = check_constrained(qwen, prompt, ("sd", "ssd", "auto"), JsonSchema(EXTRACT), 48)
    assert sum(compared.values()) >= 2 * len(ar.out), compared


@pytest.mark.timeout(900)
def test_every_mode_is_ars_under_a_tool_call_default_pair(qwen):
    tools = Tools(TOOLS, "required", parallel=False)
    prompt = qwen.tokenize(qwen.render_chat(WEATHER, TOOLS), parse_special=True)
    grammar = tools.grammar(qwen.chat_template())
    compared = check_constrained(qwen, prompt, ("auto",), grammar, 40)  # sd: the schema's test above
    assert min(compared.values()) >= 10, compared
    qwen.reset()
    out = qwen.complete(messages=WEATHER, max_tokens=40, mode="auto", constraint=tools)
    assert out.stop_reason == "eos" and out.tool_calls[0]["function"]["name"] == "get_weather"
    assert json.loads(out.tool_calls[0]["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}
