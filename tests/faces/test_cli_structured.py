"""Structured output on the command line, offline: the constraint flags of generate and chat (one at most,
a schema inline or from a file, GBNF by its extension, a bad one refused with exit 2 and llguidance's message
before any model loads), the penalty and logit-bias settings, --logprobs, and how chat and the TUI show an
answer that holds JSON or tool calls. The engine is test_chat's scripted one; constraints compile with
llguidance alone (no vocabulary), as the CLI checks them before a load."""

from __future__ import annotations

import io
import json
import re
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console
from rich.style import Style

from ssd_edge.cli import loader
from ssd_edge.cli.chat import ChatSession, stream_reader
from ssd_edge.cli.structured import constraint_from, logprobs_json, readable_view
from ssd_edge.errors import ConfigError
from ssd_edge.structured import ConstraintError, Grammar, JsonObject, JsonSchema, Regex
from ssd_edge.structured.readable import Call, pretty, readable, tool_calls
from tui.widgets.structured import readable_text
from test_chat import one_word_engine
from test_cli import clean_env, one_error, run  # noqa: F401  (clean_env: an autouse fixture)

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
ANSWER = '{"name": "Ada", "age": 36}'
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>'


# ---------------------------------------------------------------- the flags, read

def test_no_flag_is_no_constraint():
    assert constraint_from() is None


def test_a_schema_inline_or_from_a_file(tmp_path):
    inline = constraint_from(json_schema=json.dumps(SCHEMA))
    path = tmp_path / "person.json"
    path.write_text(json.dumps(SCHEMA, indent=2))
    from_file = constraint_from(json_schema=str(path), strict=True)
    assert inline == JsonSchema(SCHEMA, field="--json-schema")
    assert from_file == JsonSchema(SCHEMA, strict=True, field="--json-schema")


def test_the_other_kinds_and_gbnf_by_its_extension(tmp_path):
    assert constraint_from(json_object=True) == JsonObject(field="--json-object")
    assert constraint_from(regex=r"\d{3}-\d{4}") == Regex(r"\d{3}-\d{4}", field="--regex")
    (tmp_path / "yes.gbnf").write_text('root ::= "yes" | "no"\n')
    (tmp_path / "yes.lark").write_text('start: "yes" | "no"\n')
    assert constraint_from(grammar=str(tmp_path / "yes.gbnf")).syntax == "gbnf"
    assert constraint_from(grammar=str(tmp_path / "yes.lark")) == Grammar('start: "yes" | "no"\n', field="--grammar")


@pytest.mark.parametrize("flags,message", [
    (dict(json_schema="{}", regex="a"), "--json-schema and --regex: give at most one of"),
    (dict(json_object=True, grammar="g.lark"), "--json-object and --grammar: give at most one of"),
    (dict(regex="a", strict=True), "--strict applies to --json-schema, and none was given"),
])
def test_at_most_one_constraint(flags, message):
    with pytest.raises(ConfigError, match=message):
        constraint_from(**flags)


@pytest.mark.parametrize("flags,field,message", [
    (dict(json_schema='{"type": "objectx"}'), "--json-schema", "Invalid type: objectx"),
    (dict(json_schema='{"type": '), "--json-schema", "not valid JSON"),
    (dict(json_schema='{"type": "object", "if": {}}', strict=True), "--json-schema", 'Unimplemented keys: ["if"]'),
    (dict(json_schema="absent.json"), "--json-schema", "no such file: absent.json"),
    (dict(regex="a(b"), "--regex", "unclosed group"),
    (dict(regex=""), "--regex", "the pattern is empty"),
    (dict(grammar="absent.lark"), "--grammar", "no such file: absent.lark"),
])
def test_a_bad_constraint_names_its_flag(flags, field, message):
    with pytest.raises(ConstraintError) as e:
        constraint_from(**flags)
    assert e.value.field == field and message in str(e.value) and str(e.value).startswith(field + ": ")


def test_a_lenient_schema_keeps_what_strict_refuses():
    assert constraint_from(json_schema='{"type": "object", "if": {}}') is not None


def test_grammars_that_do_not_compile(tmp_path):
    (tmp_path / "bad.lark").write_text("start: foo\n")
    (tmp_path / "bad.gbnf").write_text('root ::= "a" | b\n')
    (tmp_path / "latin1.lark").write_bytes(b'start: "\xe9"\n')
    for name, message in (("bad.lark", 'unknown name: "foo"'), ("bad.gbnf", "GBNF: "),
                          ("latin1.lark", "is not UTF-8 text (byte 0xe9 at offset 8)")):
        with pytest.raises(ConstraintError, match=re.escape(message)):
            constraint_from(grammar=str(tmp_path / name))


# ---------------------------------------------------------------- generate and chat

@pytest.fixture
def fake_engine(monkeypatch):
    """test_chat's engine, answering ANSWER; `generate` records its keywords, the loader its config."""
    engine = one_word_engine(reply=ANSWER)
    engine.calls, engine.loaded = [], []
    play = engine.generate

    def generate(*args: Any, **kwargs: Any):
        engine.calls.append(kwargs)
        return play(*args, **kwargs)
    engine.generate = generate
    monkeypatch.setattr(loader, "load_engine", lambda cfg, s: engine.loaded.append(cfg) or engine)
    return engine


def test_generate_hands_the_constraint_to_the_engine(fake_engine, tmp_path):
    path = tmp_path / "person.json"
    path.write_text(json.dumps(SCHEMA))
    code, out, _ = run(["generate", "--chat", "Who wrote the first program?", "--json-schema", str(path), "-q"])
    assert code == 0 and json.loads(out) == {"name": "Ada", "age": 36}
    call = fake_engine.calls[0]
    assert call["constraint"] == JsonSchema(SCHEMA, field="--json-schema") and call["logprobs"] is None


@pytest.mark.parametrize("args,message", [
    (["--json-schema", '{"type": "objectx"}'], "error: --json-schema: Invalid type: objectx"),
    (["--regex", "a(b"], 'error: --regex: at 1(8): invalid regex "a(b" (in regex): regex parse error: a(b error: '
                         "unclosed group"),
    (["--grammar", "absent.gbnf"], "error: --grammar: no such file: absent.gbnf"),
    (["--json-object", "--regex", "x"], "error: --json-object and --regex: give at most one of --json-schema, "
                                        "--json-object, --regex, --grammar"),
    (["--logprobs", "3"], "error: --logprobs is written in the --json output: add --json"),
    (["--json", "--logprobs", "21"], "error: invalid --logprobs 21: must be from 0 to 20"),
    (["-l", "5~1"], "error: invalid -l/--logit-bias ['5~1']: '5~1' is not TOKEN_ID=BIAS (or TOKEN_ID+BIAS, "
                    "TOKEN_ID-BIAS)"),
    (["-l", "5=101"], "error: invalid -l/--logit-bias ['5=101']: the bias of token 5 is 101.0; a bias is from "
                      "-100 to 100"),
    (["--frequency-penalty", "2.5"], "error: invalid --frequency-penalty 2.5: must be at most 2.0"),
])
def test_bad_structured_flags_are_one_line_exit_2_before_a_load(fake_engine, args, message):
    code, out, err = run(["generate", "hi", *args])
    assert code == 2 and out == "" and one_error(err) == message
    assert not fake_engine.loaded  # refused before any model loads


def test_the_engines_own_refusal_is_exit_2_too(fake_engine):
    """What only the model's vocabulary can refuse is refused by engine.generate: the same line."""
    def refuse(*args: Any, **kwargs: Any):
        raise ConstraintError("--grammar", "token <tool_call> is not in this model's vocabulary")
    fake_engine.generate = refuse
    code, _, err = run(["generate", "hi", "--json-object"])
    assert code == 2 and one_error(err) == "error: --grammar: token <tool_call> is not in this model's vocabulary"


def test_penalties_and_bias_reach_the_sampling_config(fake_engine, monkeypatch, tmp_path):
    code, _, _ = run(["generate", "hi", "-q", "--presence-penalty", "0.5", "--frequency-penalty", "-0.25",
                      "-l", "15043+1", "--logit-bias", "7=-2.5", "-l", "9-inf"])
    assert code == 0
    s = fake_engine.loaded[0].sampling
    assert (s.presence_penalty, s.frequency_penalty) == (0.5, -0.25)
    assert s.logit_bias == {15043: 1.0, 7: -2.5, 9: -100.0}
    # the same settings from the environment and the config file (flat keys, as every other)
    config = tmp_path / "config.toml"
    config.write_text('logit-bias = ["5=3"]\nfrequency-penalty = 1\n')
    monkeypatch.setenv("SSD_EDGE_PRESENCE_PENALTY", "-1")
    assert run(["generate", "hi", "-q", "--config", str(config)])[0] == 0
    s = fake_engine.loaded[1].sampling
    assert (s.presence_penalty, s.frequency_penalty, s.logit_bias) == (-1.0, 1.0, {5: 3.0})


def test_generate_json_carries_logprobs_when_asked(fake_engine):
    code, out, _ = run(["generate", "hi", "--json", "--logprobs", "2", "-q", "--regex", ".*"])
    assert code == 0 and fake_engine.calls[0]["logprobs"] == 2
    assert "logprobs" in json.loads(out)
    code, out, _ = run(["generate", "hi", "--json", "-q"])
    assert "logprobs" not in json.loads(out)


def test_logprobs_in_openais_shape_with_token_ids():
    pieces = {1: b" Ada", 2: b"\xe2\x80", 3: b" Bob"}
    lp = [SimpleNamespace(token=1, logprob=-0.25, top=((1, -0.25), (3, -1.5))),
          SimpleNamespace(token=2, logprob=-2.0, top=())]
    got = logprobs_json(lp, pieces.__getitem__)
    assert got[0] == {"id": 1, "token": " Ada", "bytes": list(b" Ada"), "logprob": -0.25, "top_logprobs": [
        {"id": 1, "token": " Ada", "bytes": list(b" Ada"), "logprob": -0.25},
        {"id": 3, "token": " Bob", "bytes": list(b" Bob"), "logprob": -1.5}]}
    assert got[1]["token"] == "\ufffd" and got[1]["bytes"] == [0xe2, 0x80] and got[1]["top_logprobs"] == []
    assert logprobs_json(None, pieces.__getitem__) is None


def test_chat_holds_every_answer_to_the_constraint_and_lays_out_json(fake_engine):
    code, out, _ = run(["chat", "--json-object"], input="Who?\nAnd again?\n")
    assert code == 0
    assert [c["constraint"] for c in fake_engine.calls] == [JsonObject(field="--json-object")] * 2
    assert out.count(ANSWER) == 2  # the raw answer streamed, then laid out:
    assert out.count('json:\n{\n  "name": "Ada",\n  "age": 36\n}') == 2


def chat_output(reply: str) -> str:
    out = io.StringIO()
    console = Console(file=out, width=100, soft_wrap=True, color_system=None)
    session = ChatSession(one_word_engine(reply=reply), console, max_tokens=256)
    session.run(stream_reader(io.StringIO("go\n"), console))
    return out.getvalue()


def test_chat_shows_a_tool_call_by_name_and_arguments():
    out = chat_output("Let me look. " + CALL)
    assert CALL in out  # streamed as written
    assert 'tool call get_weather\n{\n  "city": "Paris",\n  "unit": "C"\n}' in out


def test_chat_adds_nothing_to_plain_text_or_json_already_laid_out():
    laid_out = pretty({"a": [1, 2]})
    for reply in ("Plain words, {not JSON}.", laid_out, "[1, 2", f"```json\n{laid_out}\n```"):
        out = chat_output(reply)
        assert "json:" not in out and "tool call" not in out and out.count(reply) == 1


# ---------------------------------------------------------------- what an answer holds

def test_readable_finds_json_and_nothing_in_plain_text():
    assert readable(ANSWER).value == {"name": "Ada", "age": 36}
    assert readable(' \n[{"a": 1}, 2]\n').value == [{"a": 1}, 2]
    assert readable('```json\n{"a": 1}\n```').value == {"a": 1}  # one fenced block, the whole answer
    assert readable('```\n[1]\n```\n').value == [1]
    assert readable('```json\n{"a": 1}\n```\nand ```json\n{}\n```') is None  # two blocks: text
    for plain in ("Hello.", "42", '"a string"', '{"cut": ', "{not json}", ""):
        assert readable(plain) is None, plain


def test_readable_finds_tool_calls_and_the_text_around_them():
    two = CALL + '\n<tool_call>\n{"name": "get_time", "arguments": "{\\"zone\\": \\"CET\\"}"}\n</tool_call>'
    shape = readable("Checking both.\n" + two)
    assert shape.calls == (Call("get_weather", {"city": "Paris", "unit": "C"}), Call("get_time", {"zone": "CET"}))
    assert shape.text == "Checking both."
    # cut short by max_tokens after a whole object: still a call; a broken one is left as text
    assert tool_calls('<tool_call>\n{"name": "f", "arguments": {}}') == (Call("f", {}),)
    assert tool_calls('<tool_call>\n{"name": "f", "argu') == ()
    assert tool_calls('<tool_call>\n{"arguments": {}}\n</tool_call>') == ()
    assert readable('<tool_call>\n["not", "a call"]\n</tool_call>') is None


def test_the_tui_draws_json_and_tool_calls_readably():
    label = Style(dim=True)
    assert readable_text("Just words.", label) is None
    assert readable_text(ANSWER, label).plain == '{\n  "name": "Ada",\n  "age": 36\n}'
    drawn = readable_text("Let me look.\n" + CALL, label)
    assert drawn.plain == 'Let me look.\n⚙ tool call get_weather\n{\n  "city": "Paris",\n  "unit": "C"\n}'
    assert any(span.style == label for span in drawn.spans)  # the label is styled, the JSON highlighted
    assert len({str(span.style) for span in drawn.spans}) > 2


async def test_a_finished_reply_in_the_tui_shows_its_json_laid_out(tmp_path, monkeypatch):
    """While it streams the reply is the raw text; once it ends, its rows are the laid-out JSON (the raw
    text is kept: saved, and sent back as the conversation); with provenance colours on, the raw text."""
    from pilot import SIZE, make_app, send
    from scripted import factory
    from tui.widgets.chat import MessageView

    monkeypatch.setenv("SSD_EDGE_CHATS", str(tmp_path / "chats"))
    app = make_app(factory(reply=ANSWER))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "who?")
        view = list(app.query(MessageView))[-1]
        rows = [strip.text.rstrip() for strip in view.rows()]
        assert rows[:5] == ["assistant", "{", '  "name": "Ada",', '  "age": 36', "}"]
        assert view.message.content == ANSWER
        await pilot.press("f3")
        assert [strip.text.rstrip() for strip in view.rows()][:2] == ["assistant", ANSWER]


async def test_grammar_forced_tokens_have_a_colour_and_another_proposers_the_targets(tmp_path, monkeypatch):
    from pilot import SIZE, make_app, wait_for
    from tui.chats import Message
    from tui.widgets.chat import PROVENANCE_COLOURS, ChatView

    monkeypatch.setenv("SSD_EDGE_CHATS", str(tmp_path / "chats"))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.phase == "ready")
        message = Message("assistant", "")
        for prov, piece in (("grammar", '{"name": "'), ("target", "Ada"), ("echo", '"}')):
            message.add(prov, piece)
        view = app.query_one(ChatView).add_message(message)
        view.show_provenance = True
        colours = {span.style.color.name if span.style.color else None
                   for span in view.body().spans if view.body().plain[span.start:span.end] == '{"name": "'}
        assert colours == {PROVENANCE_COLOURS["grammar"]}
        target = view.get_component_rich_style("message--target")
        assert [s.style for s in view.body().spans if view.body().plain[s.start:s.end] == '"}'] == [target]
