"""The server's structured surfaces without a model: response_format, tools and tool_choice, tool
calls whole and as streamed deltas, tool messages in the history, penalties and logit_bias, n answers,
and a 400 in OpenAI's shape naming the field for every bad input.

The engine is tests/scripted.py's, playing a scripted answer (a tool call's text, a JSON object), with
what the server needs beyond it: a chat template that knows `<tool_call>` (Hermes' tags, as Qwen's) or
one that does not, and a real llguidance tokenizer over a byte vocabulary with the tags and the end
token as special tokens, so every grammar the server builds is compiled and checked by llguidance
as it would be for a model. The engine records what each generation was asked (constraint, sampling).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from starlette.testclient import TestClient

from scripted import ScriptedEngine
from ssd_edge.server import create_app
from ssd_edge.structured import Grammar, JsonObject, JsonSchema
from ssd_edge.structured.calls import Arguments, CallStart, Reader, Text, read
from ssd_edge.structured.template import ChatTemplate
from ssd_edge.structured import tools as toolsmod

CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
SPECIAL = [b"<|im_end|>", b"<tool_call>", b"</tool_call>"]

# chatml with Hermes' tool format, as Qwen2.5's template writes it (shortened)
TAGS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:\n<tools>{% for t in tools %}{{ '\\n' + t | tojson }}{% endfor %}"
    "{{ '\\n' }}</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n{% elif m.tool_calls %}<|im_start|>assistant{% for c in m.tool_calls %}"
    "{{ '\\n' }}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
    "\n</tool_call>{% endfor %}<|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PLAIN_TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather <now>",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                                                "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL_TEXT = ('Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n'
             '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')


class ByteVocab:
    """llguidance's TokenizerWrapper protocol: the 256 bytes, then the special tokens (marked \\xff)."""

    def __init__(self) -> None:
        self.tokens = [bytes([i]) for i in range(256)] + [b"\xff" + s for s in SPECIAL]
        self.eos_token_id, self.bos_token_id = 256, None
        self.special_token_ids = [256, 257, 258]
        self._split = re.compile(b"(\xff?(?:" + b"|".join(re.escape(s) for s in SPECIAL) + b"))")

    def __call__(self, data: Any) -> list[int]:
        data = data if isinstance(data, bytes) else data.encode()
        out: list[int] = []
        for part in self._split.split(data):
            bare = part.lstrip(b"\xff")
            out += [256 + SPECIAL.index(bare)] if bare in SPECIAL else list(part)
        return out


class Engine(ScriptedEngine):
    """The scripted engine with a chat template and a grammar tokenizer; it records each generation."""

    def __init__(self, reply: str, template: str | None = TAGS_TEMPLATE) -> None:
        super().__init__(reply=reply)
        self.template = ChatTemplate(template) if template else None
        self.calls: list[dict[str, Any]] = []
        self.prompts: list[str] = []
        self._tokenizer = None

    has_draft = True
    n_vocab = 259

    def grammar_tokenizer(self) -> Any:
        from llguidance import LLTokenizer, TokenizerWrapper

        if self._tokenizer is None:
            self._tokenizer = LLTokenizer(TokenizerWrapper(ByteVocab()))
        return self._tokenizer

    def chat_template(self) -> ChatTemplate | None:
        return self.template

    def render_chat(self, messages: Any, tools: Any = None) -> str:
        plain = lambda ms: "".join(f"{m['role']}: {m['content']}\n" for m in ms)  # noqa: E731
        prompt = toolsmod.render(self.template, plain, messages, tools)
        self.prompts.append(prompt)
        return prompt

    def tokenize(self, text: str, *, parse_special: bool = False) -> list[int]:
        return ByteVocab()(text)

    def generate(self, *args: Any, **kw: Any):
        self.calls.append(kw)
        return super().generate(*args, **kw)


def serve(reply: str = CALL_TEXT, template: str | None = TAGS_TEMPLATE) -> TestClient:
    eng = Engine(reply, template)
    client = TestClient(create_app(eng, model_id="fake"))
    client.engine = eng
    return client


def sse(text: str) -> list[Any]:
    return [json.loads(line[5:]) for line in text.splitlines()
            if line.startswith("data:") and line[5:].strip() != "[DONE]"]


def assemble(chunks: list[dict[str, Any]], index: int = 0) -> tuple[str | None, list[dict[str, Any]], str]:
    """A stream's chunks for one choice joined as a client joins them: content, tool calls, finish reason."""
    content, calls, reason = None, {}, None
    for c in chunks:
        for ch in c["choices"]:
            if ch["index"] != index:
                continue
            delta, reason = ch["delta"], ch["finish_reason"] or reason
            if delta.get("content"):
                content = (content or "") + delta["content"]
            for tc in delta.get("tool_calls", []):
                if "id" in tc:
                    assert tc["type"] == "function" and tc["function"]["arguments"] == ""
                    calls[tc["index"]] = {"id": tc["id"], "type": "function", "function": dict(tc["function"])}
                else:
                    assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
                    calls[tc["index"]]["function"]["arguments"] += tc["function"]["arguments"]
    return content, [calls[i] for i in sorted(calls)], reason


def without_ids(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for c in calls:
        assert re.fullmatch(r"call_[0-9a-f]{24}", c["id"])
    return [{k: v for k, v in c.items() if k != "id"} for c in calls]


# ---------------------------------------------------------------- tool calls

EXPECTED_CALLS = [{"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}},
                  {"type": "function", "function": {"name": "get_time", "arguments": "{}"}}]


def test_auto_returns_the_calls_and_the_text_before_them():
    with serve() as client:
        r = client.post(CHAT, json={"messages": ASK, "tools": [WEATHER, TIME]})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["content"] == "Let me look."
        assert without_ids(choice["message"]["tool_calls"]) == EXPECTED_CALLS
        grammar = client.engine.calls[0]["constraint"]
        assert isinstance(grammar, Grammar) and grammar.trigger == "<tool_call>"
        assert 'get_weather' in grammar.text and 'get_time' in grammar.text
        assert "<tools>\n" + json.dumps(WEATHER, ensure_ascii=False) in client.engine.prompts[0]


def test_streamed_deltas_assemble_to_the_whole_call():
    with serve() as client:
        whole = client.post(CHAT, json={"messages": ASK, "tools": [WEATHER, TIME]}).json()["choices"][0]
        r = client.post(CHAT, json={"messages": ASK, "tools": [WEATHER, TIME], "stream": True})
        chunks = sse(r.text)
    content, calls, reason = assemble(chunks)
    assert (content, without_ids(calls), reason) == (whole["message"]["content"],
                                                      without_ids(whole["message"]["tool_calls"]), "tool_calls")
    said = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert "<tool_call>" not in said and "get_weather" not in said
    fragments = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", []) if "id" not in tc]
    assert len(fragments) > 2  # the arguments came in pieces as the rounds gave them


@pytest.mark.parametrize("choice,kind", [("required", "required"),
                                         ({"type": "function", "function": {"name": "get_time"}}, "named")])
def test_required_and_named_force_a_call_from_the_start(choice, kind):
    with serve(CALL_TEXT.split(" ", 3)[3]) as client:
        r = client.post(CHAT, json={"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": choice})
        assert r.status_code == 200, r.text
        grammar = client.engine.calls[0]["constraint"]
    assert grammar.trigger is None and grammar.text.startswith("start: call")
    assert ('get_weather' in grammar.text) == (kind == "required")
    assert r.json()["choices"][0]["message"]["content"] is None


@pytest.mark.parametrize("template", [TAGS_TEMPLATE, PLAIN_TEMPLATE])
def test_parallel_tool_calls_false_allows_one_call(template):
    with serve("x", template) as client:
        for parallel in (True, False):
            r = client.post(CHAT, json={"messages": ASK, "tools": [WEATHER], "tool_choice": "required",
                                        "parallel_tool_calls": parallel})
            assert r.status_code == 200, r.text
        many, one = (c["constraint"].text for c in client.engine.calls)
    assert ("call)*" in many or "body)*" in many) and "call)*" not in one and "body)*" not in one


def test_none_leaves_the_tools_out_and_reads_no_call():
    with serve() as client:
        r = client.post(CHAT, json={"messages": ASK, "tools": [WEATHER], "tool_choice": "none"})
        assert "constraint" not in client.engine.calls[0]
        assert client.engine.prompts == []  # a plain chat: the usual renderer, without tools
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == CALL_TEXT


def test_a_template_without_tags_gets_the_json_format():
    answer = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}'
    with serve(answer, PLAIN_TEMPLATE) as client:
        r = client.post(CHAT, json={"messages": ASK, "tools": [WEATHER], "tool_choice": "required"})
        grammar = client.engine.calls[0]["constraint"]
        assert grammar.text.startswith('start: "{\\"tool_calls\\": ["') and grammar.trigger is None
        assert "You can call these functions" in client.engine.prompts[0]
        free = client.post(CHAT, json={"messages": ASK, "tools": [WEATHER]})  # auto: free, read afterwards
        assert "constraint" not in client.engine.calls[1]
    for resp in (r, free):
        calls = resp.json()["choices"][0]["message"]["tool_calls"]
        assert without_ids(calls) == [{"type": "function", "function": {"name": "get_weather",
                                                                        "arguments": '{"city": "Oslo"}'}}]


def test_a_tool_result_round_trip_renders_the_history():
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]
    with serve("It is 21 C.") as client:
        r = client.post(CHAT, json={"messages": history, "tools": [WEATHER]})
        prompt = client.engine.prompts[0]
    assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": "It is 21 C."}
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\n21 C\n</tool_response>" in prompt


# ---------------------------------------------------------------- response_format, sampling, n

def test_response_formats_reach_the_engine():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    with serve('{"a": 1}') as client:
        strict = client.post(CHAT, json={"messages": ASK, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}})
        client.post(CHAT, json={"messages": ASK, "response_format": {"type": "json_object"}})
        client.post(TEXT, json={"prompt": "x", "response_format": {"type": "json_object"}})
        client.post(CHAT, json={"messages": ASK, "response_format": {"type": "text"}})
        got = [c.get("constraint") for c in client.engine.calls]
    assert strict.json()["choices"][0]["message"]["content"] == '{"a": 1}'
    assert got[0] == JsonSchema(schema, strict=True, field="response_format.json_schema.schema")
    assert isinstance(got[1], JsonObject) and isinstance(got[2], JsonObject) and got[3] is None


def test_penalties_and_logit_bias_reach_the_sampling():
    with serve("ok") as client:
        client.post(CHAT, json={"messages": ASK, "presence_penalty": 0.5, "frequency_penalty": -1.0,
                                "logit_bias": {"17": -100, "42": 2.5}})
        sampling = client.engine.calls[0]["sampling"]
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, -1.0)
    assert sampling.logit_bias == {17: -100.0, 42: 2.5}


def test_n_answers_come_one_after_another_on_their_own_seeds():
    with serve("one two three") as client:
        r = client.post(CHAT, json={"messages": ASK, "n": 3, "seed": 7, "temperature": 0.8}).json()
        seeds = [c["sampling"].seed for c in client.engine.calls]
        stream = sse(client.post(CHAT, json={"messages": ASK, "n": 2, "stream": True,
                                             "stream_options": {"include_usage": True}}).text)
    assert seeds == [7, 8, 9]
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    assert all(c["message"]["content"] == "one two three" for c in r["choices"])
    assert r["usage"]["completion_tokens"] == 9 and r["usage"]["prompt_tokens"] == 7
    assert [assemble(stream, i)[0] for i in (0, 1)] == ["one two three"] * 2
    assert stream[-1]["usage"]["completion_tokens"] == 6 and stream[-1]["choices"] == []


# ---------------------------------------------------------------- bad input: a 400 naming the field

BAD = [  # (body beyond messages, param, words the message holds)
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
     "response_format.json_schema.schema", "Invalid type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {
        "type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}}}},
     "response_format.json_schema.schema", "uniqueItems"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "integer", "minimum": 5, "maximum": 1}}}}, "response_format.json_schema.schema", "Unsatisfiable"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "$ref": "#/$defs/missing"}}}}, "response_format.json_schema.schema", "missing"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema",
     "give the JSON schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "json_schema"),
    ({"response_format": {"type": "json_object"}, "tools": [WEATHER]}, "response_format", "not both"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools[0].function.name", "name"),
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[1].function.parameters", "type object"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "also the name of tools[0]"),
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "nonsense"}}}}}]}, "tools[1].function.parameters", "nonsense"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "tool_choice.function.name", "no tool is named 'get_time'"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "auto, none, required"),
    ({"tool_choice": "required"}, "tool_choice", "no tools"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "0 to 20"),
    ({"top_logprobs": 2}, "top_logprobs", "logprobs"),
    ({"n": 0}, "n", "from 1"),
    ({"n": 9}, "n", "from 1"),
    ({"logit_bias": {"abc": 1}}, "logit_bias", "token ids"),
    ({"logit_bias": {"5": "high"}}, "logit_bias", "a number"),
    ({"logit_bias": {"5": 150}}, "logit_bias", "-100 to 100"),
    ({"logit_bias": {"999999": 1}}, "logit_bias", "below 259"),
    ({"presence_penalty": -3}, "presence_penalty", "-2"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]},
     "messages.0.tool_calls", "assistant"),
]


@pytest.mark.parametrize("body,param,words", BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_structured_input_is_a_400_naming_the_field(body, param, words, stream):
    with serve() as client:
        r = client.post(CHAT, json={"messages": ASK, **body, "stream": stream})
        assert not client.engine.calls  # refused before the engine saw it
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"] and err["type"] == "invalid_request_error"


@pytest.mark.parametrize("body,param", [({"logprobs": 21}, "logprobs"), ({"logprobs": True}, "logprobs"),
                                        ({"top_logprobs": 1}, "top_logprobs"), ({"tools": [WEATHER]}, "tools")])
def test_bad_completions_input_is_a_400_naming_the_field(body, param):
    with serve() as client:
        r = client.post(TEXT, json={"prompt": "x", **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


# ---------------------------------------------------------------- the reader on scripted texts

TEXTS = [
    ("tags", CALL_TEXT),
    ("tags", 'Text with < and <tool and <tool_cal but no call, and blanks  \n'),
    ("tags", '<tool_call>\n{"name": "f", "arguments": {"s": "a}\\"{[", "n": [1, {"b": []}]}}\n</tool_call>'),
    ("tags", '<tool_call>\n{"arguments": {"x": 1}, "name": "g"}\n</tool_call>'),  # keys the other way round
    ("tags", '<tool_call>\n{"name": "g", "arguments": {"x": 1, "y'),             # cut by max_tokens
    ("tags", '<tool_call>\nnot json\n</tool_call> after'),
    ("tags", 'Sure. <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "g",'),
    ("json", '  {"tool_calls": [{"name": "f", "arguments": {"q": "é"}}, {"name": "g", "arguments": {}}]}'),
    ("json", '{"a": 1}'),
    ("json", 'Hello {x} '),
]


def pieces_joined(pieces: list[Any]) -> tuple[str, list[tuple[str, str]]]:
    content, calls = "", {}
    for p in pieces:
        if isinstance(p, Text):
            content += p.text
        elif isinstance(p, CallStart):
            calls[p.index] = [p.name, ""]
        else:
            assert isinstance(p, Arguments)
            calls[p.index][1] += p.text
    return content, [tuple(v) for v in calls.values()]


@pytest.mark.parametrize("fmt,text", TEXTS, ids=[str(i) for i in range(len(TEXTS))])
def test_the_reader_gives_the_same_message_in_any_chunks(fmt, text):
    whole = read(text, fmt, {"f", "g"})
    expected = (whole.content, [(c.name, c.arguments) for c in whole.calls])
    for size in (1, 2, 3, 7):
        reader = Reader(fmt, {"f", "g"})
        pieces = [p for i in range(0, len(text), size) for p in reader.feed(text[i:i + size])] + reader.finish()
        assert pieces_joined(pieces) == expected
    for call in whole.calls:
        if not call.arguments.endswith("y"):  # (but the one cut short) the arguments are the model's JSON
            json.loads(call.arguments)


def test_the_reader_reads_what_each_text_says():
    got = {i: (r.content, [(c.name, c.arguments) for c in r.calls])
           for i, r in ((i, read(t, f, {"f", "g"})) for i, (f, t) in enumerate(TEXTS))}
    assert got[0] == ("Let me look.", [("get_weather", '{"city": "Paris", "unit": "c"}'), ("get_time", "{}")])
    assert got[1] == (TEXTS[1][1], [])  # no call: byte for byte, trailing blanks too
    assert got[2] == ("", [("f", '{"s": "a}\\"{[", "n": [1, {"b": []}]}')])
    assert got[3] == ("", [("g", '{"x": 1}')])
    assert got[4] == ("", [("g", '{"x": 1, "y')])
    assert got[5] == ("<tool_call>\nnot json\n</tool_call> after", [])
    assert got[6] == ("Sure.", [("f", "{}")])  # the second call, cut before its arguments, is dropped
    assert got[7] == ("", [("f", '{"q": "é"}'), ("g", "{}")])
    assert got[8] == ('{"a": 1}', []) and got[9] == ("Hello {x} ", [])


# ---------------------------------------------------------------- logprobs on the fake pair (the real engine)

def test_logprobs_in_openais_shapes_greedy_picks_the_top():
    from test_serve import fake_engine

    with TestClient(create_app(fake_engine(), model_id="fake")) as client:
        chat = client.post(CHAT, json={"messages": ASK, "max_tokens": 6, "temperature": 0, "logprobs": True,
                                       "top_logprobs": 3}).json()
        stream = sse(client.post(CHAT, json={"messages": ASK, "max_tokens": 6, "temperature": 0, "logprobs": True,
                                             "top_logprobs": 3, "stream": True}).text)
        text = client.post(TEXT, json={"prompt": "x", "max_tokens": 6, "temperature": 0, "logprobs": 2}).json()
        none = client.post(CHAT, json={"messages": ASK, "max_tokens": 2, "logprobs": True}).json()
    entries = chat["choices"][0]["logprobs"]["content"]
    assert len(entries) == 6 and "".join(e["token"] for e in entries) == chat["choices"][0]["message"]["content"]
    for e in entries:
        assert len(e["top_logprobs"]) == 3 and e["top_logprobs"][0]["token"] == e["token"]
        assert e["top_logprobs"][0]["logprob"] == pytest.approx(e["logprob"]) and e["logprob"] <= 0
        assert bytes(e["bytes"]).decode() == e["token"]
    streamed = [e for c in stream if c["choices"] and c["choices"][0]["logprobs"]
                for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == entries
    lp = text["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == text["choices"][0]["text"]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(6)]
    for tok, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert len(top) == 2 and top[tok] == pytest.approx(logprob) == max(top.values())
    assert all(e["top_logprobs"] == [] for e in none["choices"][0]["logprobs"]["content"])
