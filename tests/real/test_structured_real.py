"""Structured output on the small real pair (SmolLM2-135M and its truncated draft, whose batched and
one-token rows are bitwise equal: tests/real/test_backend.py): every mode gives mode ar's tokens exactly
under a JSON schema and under a tool call, greedy and seed for seed when sampled, and the answers
validate. (Every layer's logic: tests/engine/test_structured_engine.py; the Qwen pair's check:
tests/default_pair/test_structured_qwen.py.)"""

from __future__ import annotations

import json

import pytest

from lossless_check import generate
from ssd_edge.config import SamplingConfig
from ssd_edge.structured import JsonSchema, Tools

pytestmark = pytest.mark.real

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "city": {"type": "string", "maxLength": 20}},
          "required": ["name", "age", "city"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Describe Ada Lovelace, 36, of London, as JSON."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}}}]
MODES = ("sd", "lookup", "ssd", "auto")


@pytest.mark.parametrize("temperature, seed", [(0.0, None), (1.0, 4)])
def test_every_mode_is_ars_under_a_schema(small_engine, temperature, seed):
    eng = small_engine
    prompt = eng.tokenize(eng.render_chat(ASK), parse_special=True)
    s = SamplingConfig(temperature=temperature, seed=seed)
    ar = generate(eng, prompt, "ar", 60, s, JsonSchema(PERSON))
    assert ar.stop_reason == "eos", "the grammar completes the object"
    obj = json.loads(eng.detokenize(ar.out) if hasattr(eng, "detokenize") else
                     b"".join(eng.piece(t) for t in ar.out).decode())
    assert set(obj) == {"name", "age", "city"} and 0 <= obj["age"] <= 120
    for mode in MODES:
        run = generate(eng, prompt, mode, 60, s, JsonSchema(PERSON))
        assert run.out == ar.out, f"{mode} at T={temperature}: not ar's tokens"
    assert sum(1 for p in run.provenance if p == "grammar") >= 5, "keys and separators rode as forced drafts"


@pytest.mark.parametrize("temperature, seed", [(1.0, 8)])
def test_every_mode_is_ars_under_a_required_tool_call(small_engine, temperature, seed):
    eng = small_engine
    s = SamplingConfig(temperature=temperature, seed=seed)
    tools = Tools(TOOLS, "required", parallel=False)
    ref = eng.complete(messages=ASK, max_tokens=50, mode="ar", sampling=s, constraint=tools)
    assert ref.stop_reason == "eos" and len(ref.tool_calls) == 1, ref
    call = ref.tool_calls[0]["function"]
    assert call["name"] == "get_weather" and isinstance(json.loads(call["arguments"])["city"], str)
    for mode in MODES:
        eng.reset()
        out = eng.complete(messages=ASK, max_tokens=50, mode=mode, sampling=s, constraint=tools)
        eng.reset()
        again = eng.complete(messages=ASK, max_tokens=50, mode="ar", sampling=s, constraint=tools)
        assert out.tokens == again.tokens, f"{mode}: not ar's tokens"
        assert [c["function"] for c in out.tool_calls] == [c["function"] for c in again.tool_calls]
