"""`ssd-edge serve` with the `openai` client, on Qwen2.5-coder-0.5B as target and as draft (its chat
template knows `<tool_call>`; pulled on first use, ~0.4 GB): the structured surfaces end to end.

json_schema strict answers that validate, json_object, each tool_choice (auto, none, required, a named
function; under auto this model, greedy, answers a tool question with a fenced JSON block rather than its
`<tool_call>` token, so the call is shown with that token favoured by logit_bias), streamed tool-call
deltas that assemble to the whole call, a tool-result round trip, logprobs of OpenAI's shapes (greedy
picks the top one), penalties and logit_bias that change a greedy answer, n=2 (each choice the answer of
its own seed), and a 400 naming the field for each kind of bad input. Last, on the small pair through the
engine: the generic JSON tool format of a template without tool tags. Lean: greedy where answers are
compared, a few dozen tokens each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[2]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "The local time in a time zone",
                                      "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                                                     "required": ["zone"]}}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def qwen_05b() -> Path:
    from ssd_edge.models import catalog

    cat = catalog.load_catalog()
    path, _ = catalog.pull(cat.get(cat.default_draft))
    return path


@pytest.fixture(scope="module")
def api(qwen_05b, tmp_path_factory):
    """(client, model id): this checkout's `serve` (PYTHONPATH), greedy by default, stopped with SIGTERM."""
    from openai import OpenAI

    env = {k: v for k, v in os.environ.items() if not k.startswith("SSD_EDGE_") or k in ("SSD_EDGE_HOME",
                                                                                          "SSD_EDGE_MODELS")}
    env.update(XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("config")), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-c", "import sys; from ssd_edge.cli.entry import main; sys.argv[0] = 'ssd-edge'; "
           "sys.exit(main())", "serve", "-m", str(qwen_05b), "-md", str(qwen_05b), "-c", "2048", "--temp", "0",
           "--port", "0"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        url, said = None, []
        for line in proc.stderr:
            said.append(line)
            if line.startswith("serving "):
                url = line.split(" at ")[1].split(" ")[0]
                break
        assert url, f"the server did not announce itself: {''.join(said)[-2000:]}"
        client = OpenAI(base_url=url, api_key="none", max_retries=0, timeout=300)
        yield client, client.models.list().data[0].id
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def fits_person(obj) -> bool:
    return (isinstance(obj, dict) and set(obj) == {"name", "age"} and isinstance(obj["name"], str)
            and isinstance(obj["age"], int) and not isinstance(obj["age"], bool))


# ---------------------------------------------------------------- structured output

def test_json_schema_strict_answers_validate(api):
    client, model = api
    for text in ("Ada Lovelace died at 36.", "Alan Turing was 41 when he died.", "My cat Tom is 3 years old."):
        r = client.chat.completions.create(model=model, max_tokens=40, messages=[
            {"role": "user", "content": f"Extract the person's name and age as JSON: {text}"}],
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                                    "strict": True}})
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice
        assert fits_person(json.loads(choice.message.content)), choice.message.content


def test_json_object_answers_are_objects(api):
    client, model = api
    r = client.chat.completions.create(model=model, max_tokens=48, response_format={"type": "json_object"},
                                       messages=[{"role": "user", "content": "Give the capital of France and "
                                                  "of Spain as a JSON object."}])
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    text = client.completions.create(model=model, prompt="A JSON object describing a cat:", max_tokens=48,
                                     extra_body={"response_format": {"type": "json_object"}})
    assert text.choices[0].finish_reason == "stop" and isinstance(json.loads(text.choices[0].text), dict)


# ---------------------------------------------------------------- tools

def weather_call(call) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    assert isinstance(args, dict)
    return args


TOOL_CALL = 151657  # Qwen2.5's <tool_call> token


def test_auto_is_free_text_until_the_model_opens_a_call(api):
    client, model = api
    # greedy, this model answers with a fenced JSON block, not its <tool_call> token: that stays content
    free = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=60).choices[0]
    assert free.finish_reason in ("stop", "length") and not free.message.tool_calls and free.message.content
    # with its <tool_call> token favoured, it opens a call, and from there the grammar makes it a valid one
    r = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=60,
                                       logit_bias={str(TOOL_CALL): 100}, parallel_tool_calls=False)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and "paris" in weather_call(call)["city"].lower()


def test_none_answers_in_text(api):
    client, model = api
    r = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=24)
    choice = r.choices[0]
    assert not choice.message.tool_calls and choice.message.content and choice.finish_reason in ("stop", "length")


def test_required_and_named_force_a_valid_call(api):
    client, model = api
    chat = [{"role": "user", "content": "Hello there!"}]  # nothing a tool is needed for: the grammar decides
    # one call each (greedy, this model follows a call with another until max_tokens where it may)
    r = client.chat.completions.create(model=model, messages=chat, tools=TOOLS, tool_choice="required",
                                       max_tokens=60, parallel_tool_calls=False)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and calls and r.choices[0].message.content is None
    assert {c.function.name for c in calls} <= {"get_weather", "get_time"}
    for c in calls:
        weather_call(c)
    named = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=60,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}},
                                           parallel_tool_calls=False)
    calls = named.choices[0].message.tool_calls
    assert named.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in calls] == ["get_time"] * len(calls)
    assert isinstance(weather_call(calls[0])["zone"], str)


def test_streamed_call_deltas_assemble_to_the_whole_call(api):
    """One call (several, and one cut short, are tests/faces/test_serve_structured.py's, on a scripted text):
    mode ar, one call, where greedy answers repeat run to run. (A second call here holds a near-tie, its
    zone Europe/Paris or Europe/London: two greedy requests differed there, in ar too.)"""
    client, model = api
    whole = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=60,
                                           tool_choice="required", parallel_tool_calls=False,
                                           extra_body={"mode": "ar"}).choices[0]
    calls: dict[int, dict] = {}
    content, reasons, firsts = "", [], 0
    for chunk in client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=60,
                                                tool_choice="required", parallel_tool_calls=False, stream=True,
                                                extra_body={"mode": "ar"}):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasons.append(chunk.choices[0].finish_reason)
        for tc in delta.tool_calls or []:
            if tc.id is not None:
                firsts += 1
                assert tc.type == "function" and tc.function.arguments == ""
                calls[tc.index] = {"name": tc.function.name, "arguments": ""}
            else:
                calls[tc.index]["arguments"] += tc.function.arguments
    assert content == "" and reasons[-1] == whole.finish_reason == "tool_calls" and firsts == len(calls) == 1
    assert [calls[i] for i in sorted(calls)] == [{"name": c.function.name, "arguments": c.function.arguments}
                                                 for c in whole.message.tool_calls]


def test_a_tool_result_round_trip(api):
    client, model = api
    first = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=60,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                           parallel_tool_calls=False)
    message = first.choices[0].message
    call = message.tool_calls[0]
    history = [*ASK, message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'}]
    # the answer in words ("none": under "auto" this model writes another call as text)
    r = client.chat.completions.create(model=model, messages=history, tools=TOOLS, tool_choice="none",
                                       max_tokens=40)
    answer = r.choices[0].message
    assert r.choices[0].finish_reason in ("stop", "length") and not answer.tool_calls
    assert "21" in answer.content, answer.content  # the result reached the model


# ---------------------------------------------------------------- logprobs, penalties, n

def test_logprobs_have_openais_shapes_and_greedy_picks_the_top(api):
    client, model = api
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count to five."}],
                                       max_tokens=8, logprobs=True, top_logprobs=3)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens
    for e in entries:
        assert len(e.top_logprobs) == 3 and e.logprob <= 0
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == pytest.approx(e.logprob)
        assert bytes(e.bytes).decode(errors="replace") == e.token
    assert "".join(e.token for e in entries) == r.choices[0].message.content
    text = client.completions.create(model=model, prompt="def add(a, b):", max_tokens=6, logprobs=2)
    lp = text.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert "".join(lp.tokens) == text.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    for tok, lp_tok, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) <= 2 and max(top.values()) == pytest.approx(lp_tok) and top[tok] == pytest.approx(lp_tok)


def test_penalties_and_logit_bias_change_a_greedy_answer(api, qwen_05b):
    from ssd_edge.llama.model import Model

    client, model = api
    chat = [{"role": "user", "content": "Write the word cat twenty times, separated by spaces."}]
    plain = client.chat.completions.create(model=model, messages=chat, max_tokens=30, logprobs=True)
    penalised = client.chat.completions.create(model=model, messages=chat, max_tokens=30, presence_penalty=2.0,
                                               frequency_penalty=2.0)
    assert plain.choices[0].message.content.count("cat") > penalised.choices[0].message.content.count("cat")
    first = plain.choices[0].logprobs.content[0].token
    vocab = Model(qwen_05b)  # the first token's id, as a client's tokenizer gives it
    try:
        ids = vocab.tokenize(first, add_special=False)
    finally:
        vocab.close()
    assert len(ids) == 1, (first, ids)
    banned = client.chat.completions.create(model=model, messages=chat, max_tokens=4, logprobs=True,
                                            logit_bias={str(ids[0]): -100})
    assert banned.choices[0].logprobs.content[0].token != first


def test_n_answers_are_the_answers_of_their_seeds(api):
    client, model = api
    chat = [{"role": "user", "content": "Name a colour."}]
    both = client.chat.completions.create(model=model, messages=chat, max_tokens=12, n=2, seed=3, temperature=1.0)
    assert [c.index for c in both.choices] == [0, 1]
    singles = [client.chat.completions.create(model=model, messages=chat, max_tokens=12, seed=s, temperature=1.0)
               for s in (3, 4)]
    assert [c.message.content for c in both.choices] == [s.choices[0].message.content for s in singles]
    assert both.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    streamed = {0: "", 1: ""}
    for chunk in client.chat.completions.create(model=model, messages=chat, max_tokens=12, n=2, seed=3,
                                                temperature=1.0, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
    assert [streamed[0], streamed[1]] == [c.message.content for c in both.choices]


# ---------------------------------------------------------------- bad input

BAD = [  # (request fields, the param the 400 names)
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {
        "type": "array", "uniqueItems": True}}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "integer", "minimum": 5, "maximum": 1}}}}, "response_format.json_schema.schema"),
    ({"tools": [TOOLS[0], {"type": "function", "function": {"parameters": {"type": "object"}}}]},
     "tools[1].function.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_stock"}}},
     "tool_choice.function.name"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"n": 0}, "n"),
    ({"logit_bias": {"not-a-token": 5}}, "logit_bias"),
]


@pytest.mark.parametrize("fields,param", BAD, ids=[b[1] for b in BAD])
def test_bad_input_is_a_400_naming_the_field(api, fields, param):
    import openai

    client, model = api
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=ASK, max_tokens=4, extra_body=fields)
    err = e.value.response.json()["error"]
    assert err["param"] == param and err["message"].startswith(param.split("[")[0]), err


# ---------------------------------------------------------------- the generic format, on the small pair

def test_a_template_without_tags_calls_in_the_json_format(small_engine):
    """SmolLM2's template knows no <tool_call>: the tools go in a system message, and under "required"
    the whole answer is {"tool_calls": [...]}, read back as the calls (the engine and the reader the
    server uses). Closed argument objects, one call: a 135M model otherwise invents keys for long."""
    from ssd_edge.structured import calls, tools

    closed = [{"type": "function", "function": {**t["function"], "parameters": {
        **t["function"]["parameters"], "additionalProperties": False}}} for t in TOOLS]
    assert tools.format_of(small_engine.chat_template()) == "json"
    choice = tools.choose(tools.parse_tools(closed), "required")
    text = small_engine.render_chat(ASK, closed)
    assert "You can call these functions" in text and '"get_time"' in text
    answer = small_engine.complete(tokens=small_engine.tokenize(text, parse_special=True), max_tokens=80, mode="sd",
                                   constraint=tools.constraint(choice, "json", parallel=False),
                                   sampling=small_engine.config.sampling.model_copy(update={"temperature": 0.0}))
    assert answer.stop_reason == "eos", answer.text
    read = calls.read(answer.text, "json", {"get_weather", "get_time"})
    assert read.content == "" and len(read.calls) == 1, answer.text
    assert read.calls[0].name in ("get_weather", "get_time") and isinstance(json.loads(read.calls[0].arguments), dict)
