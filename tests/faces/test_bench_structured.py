"""The structured benchmark without a model: the shipped suite (`--prompts structured`), a bad prompt
file named by prompt and field, answers checked against their schemas and tool parameters, llama.cpp's
grammar with rigid separators, llama-server driven as a peer (a script that answers as it does), and a
whole `ssd-edge bench` run on the fake pair under real grammars (tests/fakes.ALPHABET), whose bench.json
carries forced, valid and the structured summary. (On real models: tests/real/test_bench_structured_real.py.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ssd_edge.bench import answers, args as bench_args, peer_server, report_structured, run as bench, schema
from ssd_edge.bench.report import summarize
from ssd_edge.bench.schema import BenchResult, PeerRecord, RunRecord
from ssd_edge.cli import commands as cli
from ssd_edge.config import EngineConfig
from ssd_edge.engine import Engine
from ssd_edge.errors import ConfigError
from ssd_edge.llama import backend
from ssd_edge.structured.request import read as read_shape
from ssd_edge.structured.template import ChatTemplate
from tests.fakes import ALPHABET, FakeContext, FakeModel

TAGS = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}<tool_call></tool_call>")
OBJ = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}, "b": {"type": "string"}},
       "required": ["a", "b"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "head", "parameters": {
    "type": "object", "properties": {"c": {"type": "integer"}}, "required": ["c"], "additionalProperties": False}}}


def ssd_edge(argv: list[str]) -> tuple[int, str, str]:
    with CliRunner().isolation() as (out, err, _):
        code = cli.run(argv)
        sys.stdout.flush()
        sys.stderr.flush()
        return code, out.getvalue().decode(), err.getvalue().decode()


# ---------------------------------------------------------------- the suite and its file

def test_the_shipped_structured_suite_covers_its_four_categories():
    prompts = bench_args.load_prompts("structured")
    assert [p.category for p in prompts] == list(schema.STRUCTURED_CATEGORIES)
    assert all(p.structured for p in prompts)
    call = next(p for p in prompts if p.category == "tool-call")
    assert call.tool_choice == "required" and call.parallel_tool_calls is False
    for p in prompts:
        shape = bench_args.shape_of(p, TAGS)
        assert shape is not None and shape.constraint is not None
        schemas = [t.parameters for t in shape.choice.tools] if shape.choice else [shape.constraint.schema]
        for s in schemas:  # strict as OpenAI wants it: every object closed and every property required
            assert s["additionalProperties"] is False and set(s["required"]) == set(s["properties"])
    assert bench_args.load_prompts(None)[0].structured is False  # the text suite stays free


@pytest.mark.parametrize("line, message", [
    ({"response_format": {"type": "yaml"}}, "prompt 'x': response_format.type: choose text, json_object or json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}},
     "prompt 'x': response_format.json_schema.schema: give the JSON schema"),
    ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "prompt 'x': tools[0].function.name"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "tail"}}},
     "prompt 'x': tool_choice.function.name: no tool is named 'tail'"),
    ({"tool_choice": "required"}, "prompt 'x': tool_choice: there are no tools"),
])
def test_a_bad_prompt_file_exits_2_naming_the_prompt_and_the_field(tmp_path, monkeypatch, line, message):
    f = tmp_path / "bad.jsonl"
    ok = {"id": "ok", "category": "chat", "messages": [{"role": "user", "content": "hi"}]}
    f.write_text(json.dumps(ok) + "\n" + json.dumps({**ok, "id": "x", "category": "extraction", **line}) + "\n")
    with pytest.raises(ConfigError, match="line 2"):
        bench_args.load_prompts(f)
    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    for p in (t, d):
        p.write_bytes(b"GGUF" + b"\0" * 12)
    monkeypatch.setattr(backend, "system_info", lambda: "fake llama.cpp")
    code, _, err = ssd_edge(["bench", "-m", str(t), "-md", str(d), "--prompts", str(f), "-o", str(tmp_path / "o")])
    assert code == 2 and message in err and "line 2" in err, err


def test_the_help_of_prompts_names_the_structured_suite():
    code, out, _ = ssd_edge(["bench", "--help"])
    text = " ".join(out.split())
    assert code == 0 and "'structured'" in text and "response_format" in text and "tool_choice" in text


# ---------------------------------------------------------------- answers checked

def test_json_answers_are_checked_against_their_schema():
    shape = read_shape({"type": "json_schema", "json_schema": {"name": "o", "schema": OBJ}}, None, None, None)
    assert answers.check(shape, '{"a": 1, "b": "x"}') == (True, None)
    ok, why = answers.check(shape, '{"a": -1, "b": "x"}')
    assert not ok and why.startswith("the answer['a']:") and "minimum" in why
    assert not answers.check(shape, '{"a": 1, "b": "x", "z": 0}')[0]        # additionalProperties: false
    ok, why = answers.check(shape, '{"a": 1, "b": ')                          # cut by max_tokens
    assert not ok and why.startswith("not JSON")
    any_object = read_shape({"type": "json_object"}, None, None, None)
    assert answers.check(any_object, '{"k": [1, 2]}')[0] and not answers.check(any_object, "[1, 2]")[0]


@pytest.mark.parametrize("template", [TAGS, None])
def test_tool_calls_are_checked_call_by_call_against_their_tools_parameters(template):
    shape = read_shape(None, [TOOL], "required", template, False)
    def call(args: str, n: int = 1) -> str:
        if shape.fmt == "tags":
            return "\n".join(f'<tool_call>\n{{"name": "head", "arguments": {args}}}\n</tool_call>' for _ in range(n))
        return json.dumps({"tool_calls": [{"name": "head", "arguments": json.loads(args)}] * n})
    assert answers.check(shape, call('{"c": 3}'), parallel=False) == (True, None)
    ok, why = answers.check(shape, call('{"c": "3"}'), parallel=False)
    assert not ok and why.startswith("call 0 (head) arguments['c']")
    assert answers.check(shape, call('{"c": 3}', 2), parallel=False) == (False, "2 tool calls (parallel_tool_calls is false)")
    assert answers.check(shape, call('{"c": 3}', 2), parallel=True)[0]
    assert answers.check(shape, "I cannot call tools.")[1].startswith("no tool call")


# ---------------------------------------------------------------- llama.cpp's grammar, rigid

# llama.cpp's conversion of OBJ, as its server gives it back (shape of json-schema-to-grammar.cpp's output)
LLAMA_GBNF = r'''a-kv ::= "\"a\"" space ":" space integer
b-kv ::= "\"b\"" space ":" space string
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
integer ::= ("-"? integral-part) space
root ::= "{" space a-kv "," space b-kv "}" space
space ::= | " " | "\n"{1,2} [ \t]{0,20}
string ::= "\"" char* "\"" space
'''


def test_rigid_pins_llamas_whitespace_to_json_dumps_separators():
    g = peer_server.rigid(LLAMA_GBNF)
    assert 'root ::= "{" space a-kv ", " b-kv "}" space' in g
    assert r'a-kv ::= "\"a\"" space ": " integer' in g
    assert 'space ::= ""' in g and '"\\n"{1,2}' not in g
    with pytest.raises(ValueError, match="no `space` rule"):
        peer_server.rigid('root ::= "x"')


class GbnfOf:
    """A server that converts any schema to LLAMA_GBNF."""

    def __init__(self) -> None:
        self.asked: list[dict] = []

    def gbnf(self, schema: dict) -> str:
        self.asked.append(schema)
        return LLAMA_GBNF


def test_each_kind_sends_its_constraint():
    server = GbnfOf()
    shape = read_shape({"type": "json_schema", "json_schema": {"name": "o", "schema": OBJ}}, None, None, None)
    assert peer_server.constrain(shape, "json_schema", server) == {"json_schema": OBJ}
    assert peer_server.constrain(shape, "grammar", server) == {"grammar": peer_server.rigid(LLAMA_GBNF)}
    calls = read_shape(None, [TOOL], "required", TAGS, False)
    one = peer_server.constrain(calls, "grammar", server, parallel=False)["grammar"]
    assert one.startswith('root ::= <tool_call> "\\n" call "\\n" </tool_call>\n') and "call ::= \"{\"" in one
    assert server.asked[-1] == {"type": "object", "properties": {"name": {"const": "head"},
                                                                "arguments": TOOL["function"]["parameters"]},
                                "required": ["name", "arguments"], "additionalProperties": False}
    many = peer_server.constrain(calls, "json_schema", server, parallel=True)["grammar"]
    assert '("\\n" <tool_call> "\\n" call "\\n" </tool_call>)*' in many and '"\\n"{1,2}' in many  # its own space
    whole = peer_server.constrain(read_shape(None, [TOOL], "required", None, False), "json_schema", server, False)
    calls_schema = whole["json_schema"]["properties"]["tool_calls"]  # no tags: the json format's whole answer
    assert calls_schema["minItems"] == calls_schema["maxItems"] == 1 and calls_schema["items"] == server.asked[-1]
    with pytest.raises(ValueError, match="tool_choice auto"):
        peer_server.constrain(read_shape(None, [TOOL], "auto", TAGS, False), "grammar", server)


# ---------------------------------------------------------------- llama-server, played by a script

FAKE_SERVER = r'''#!PYTHON
"""Answers as llama-server does: /health, and /completion with content, timings, generation_settings."""
import json, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
open(sys.argv[0] + ".argv", "w").write(json.dumps(sys.argv[1:]))
GBNF = GBNF_TEXT
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self):
        self.reply(200, {"status": "ok"})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(sys.argv[0] + ".requests", "a") as f:
            f.write(json.dumps(body) + "\n")
        text = '{\n  "a": 7,\n  "b": "x"\n}' if "json_schema" in body else '{"a": -7, "b": "x"}'
        self.reply(200, {"content": text, "stop_type": "eos", "tokens_predicted": 9,
                         "generation_settings": {"grammar": GBNF},
                         "timings": {"prompt_n": len(body["prompt"]), "prompt_ms": 20.0, "predicted_n": 9,
                                     "predicted_ms": 300.0, "predicted_per_second": 30.0}})
time.sleep(0.3)  # loading
HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@pytest.fixture
def tools_dir(tmp_path) -> Path:
    d = tmp_path / "tools"
    d.mkdir()
    exe = d / peer_server.BINARY
    exe.write_text(FAKE_SERVER.replace("PYTHON", sys.executable).replace("GBNF_TEXT", repr(LLAMA_GBNF)))
    exe.chmod(0o755)
    return d


def test_llama_server_starts_answers_and_stops(tools_dir):
    binary = peer_server.find(tools_dir)
    with peer_server.LlamaServer(binary, Path("t.gguf"), threads=2, n_ctx=512) as server:
        proc = server.proc
        a = server.complete([5, 6, 7], {"json_schema": OBJ}, n_predict=32, temperature=0.0, seed=3)
        assert server.gbnf(OBJ) == LLAMA_GBNF and server.gbnf(OBJ) == LLAMA_GBNF   # asked once
    assert proc.poll() is not None, "stopped on leaving"
    assert (a.text, a.tokens, a.prompt_tokens, a.encode_s, a.decode_s, a.tokens_per_s) == \
        ('{\n  "a": 7,\n  "b": "x"\n}', 9, 3, 0.02, 0.3, 30.0)
    assert 0 < a.answer_s < 5
    argv = json.loads((tools_dir / (peer_server.BINARY + ".argv")).read_text())
    assert argv[:8] == ["-m", "t.gguf", "-t", "2", "-tb", "2", "-c", "512"] and "--port" in argv
    sent = [json.loads(x) for x in (tools_dir / (peer_server.BINARY + ".requests")).read_text().splitlines()]
    assert sent[0] == {"prompt": [5, 6, 7], "n_predict": 32, "temperature": 0.0, "seed": 3, "cache_prompt": False,
                       "stream": False, "json_schema": OBJ}
    assert len(sent) == 2 and sent[1]["json_schema"] == OBJ


def test_a_server_that_dies_is_reported_with_its_last_words(tmp_path):
    exe = tmp_path / peer_server.BINARY
    exe.write_text("#!/bin/sh\necho 'error: failed to load model' >&2\nexit 1\n")
    exe.chmod(0o755)
    with pytest.raises(RuntimeError, match="exited with 1: error: failed to load model"):
        with peer_server.LlamaServer(exe, Path("t.gguf"), threads=1, n_ctx=64):
            pass


# ---------------------------------------------------------------- a whole run on the fake pair

def fake_engine(cfg: EngineConfig) -> Engine:
    target, draft = FakeModel("target", alphabet=ALPHABET), FakeModel("draft", disagree_every=3, alphabet=ALPHABET)
    cfg = cfg.model_copy(update=dict(n_ctx=512))
    return Engine.from_parts(cfg, target, FakeContext(target, n_ctx=512), draft,
                             FakeContext(draft, n_ctx=1024, n_seq_max=cfg.prespec.fanout_max + 1))


def test_a_structured_bench_run_records_forced_valid_and_the_peer(tmp_path, monkeypatch, tools_dir):
    monkeypatch.setenv("SSD_EDGE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(backend, "system_info", lambda: "fake llama.cpp")
    monkeypatch.setattr(bench.Bench, "open_engine", lambda self, cfg: fake_engine(cfg))
    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    for p in (t, d):
        p.write_bytes(b"GGUF" + b"\0" * 12)
    f = tmp_path / "mine.jsonl"
    msg = [{"role": "user", "content": "abc"}]
    f.write_text("\n".join(json.dumps(x) for x in (
        {"id": "obj", "category": "extraction", "messages": msg, "max_tokens": 40,
         "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": OBJ, "strict": True}}},
        {"id": "any", "category": "config", "messages": msg, "max_tokens": 60,  # (the fake's alphabet has no "_":
         "response_format": {"type": "json_object"}},                          # a call is tested on real models)
        {"id": "free", "category": "chat", "messages": msg, "max_tokens": 8})) + "\n")
    out = tmp_path / "out"
    code, stdout, err = ssd_edge(["bench", "-m", str(t), "-md", str(d), "--prompts", str(f), "--modes", "ar,sd,auto",
                                  "--settings", "shared", "--no-calibrate", "--llama-tools", str(tools_dir),
                                  "--no-plot", "-o", str(out)])
    assert code == 0, err
    result = BenchResult.model_validate_json((out / "bench.json").read_text())
    runs = {(r.mode, r.prompt_id): r for r in result.runs if r.rep >= 0}
    assert runs[("ar", "free")].valid is None and runs[("ar", "free")].forced == 0
    for mode in ("ar", "sd", "auto"):
        obj, any_ = runs[(mode, "obj")], runs[(mode, "any")]
        assert obj.valid and any_.valid, (obj.invalid, any_.invalid)
        assert (obj.output_sha, any_.output_sha) == (runs[("ar", "obj")].output_sha, runs[("ar", "any")].output_sha)
        # forced tokens ride a drafting mode's rounds as free drafts; ar's plain steps draw every token
        assert (0 < obj.forced < obj.tokens) if mode != "ar" else obj.forced == 0
    peer = {(r.kind, r.prompt_id): r for r in result.peer.runs}
    assert set(peer) == {(k, p) for k in ("grammar", "json_schema") for p in ("obj", "any")}  # none on "free"
    assert peer[("json_schema", "obj")].valid and peer[("json_schema", "obj")].answer_s > 0
    assert peer[("grammar", "obj")].valid is False and "minimum" in peer[("grammar", "obj")].invalid
    assert peer[("grammar", "any")].valid and not result.peer.errors
    assert "llama-server" in result.peer.note
    rows = {(r.mode, r.category): r for r in result.summary if r.setting == "shared"}
    assert rows[("ar", "extraction")].valid_share == 1.0 and rows[("ar", "chat")].valid_share is None
    assert rows[("llama.cpp-grammar", "extraction")].valid_share == 0.0
    assert rows[("llama.cpp-grammar", "config")].valid_share == 1.0
    assert rows[("llama.cpp-json_schema", "extraction")].forced_share is None
    assert 0 < rows[("sd", "all")].forced_share < 1 and rows[("ar", "all")].forced_share == 0
    assert rows[("ar", "all")].answer_s > 0
    names = [g.name for g in result.goals if "structured" in g.name]
    assert names == ["shared, structured: auto vs ar under the same constraint",
                     "shared, structured: auto vs llama.cpp-grammar under the same constraint",
                     "shared, structured: auto's whole answer vs llama.cpp-json_schema's, and as many valid"]
    md = (out / "bench.md").read_text()
    assert "Structured output" in md and "| shared | llama.cpp-json_schema | 2 | 100% | – |" in md
    assert "| obj | extraction |" in md and "grammar · obj (rep 0): the answer['a']" in md


# ---------------------------------------------------------------- the arithmetic

def test_structured_rows_and_goals():
    def run(mode: str, wall: float, valid: bool, forced: int = 10) -> RunRecord:
        return RunRecord(setting="shared", mode=mode, prompt_id="p", category="extraction", rep=0, seed=0,
                         prompt_tokens=10, tokens=41, stop_reason="eos", wall_s=wall, ttft_s=0.2, decode_s=wall - 0.2,
                         tokens_per_s=40 / (wall - 0.2), latencies_ms=[], drafted=0, accepted=0, spec_rounds=0,
                         rounds=41, lookups=0, hits=0, partial_hits=0, draft_busy_s=0, target_busy_s=wall,
                         peak_rss_mib=1, modes_run={}, output_sha="x", forced=forced, valid=valid)
    runs = [run("ar", 2.2, True), run("auto", 1.8, True), run("auto", 1.8, False)]
    peer = [PeerRecord(setting="shared", prompt_id="p", category="extraction", k=0, kind=kind, rep=0,
                       prompt_tokens=10, tokens=t, decode_s=s, tokens_per_s=t / s, drafted=0, accepted=0, encode_s=0.2,
                       answer_s=s + 0.25, valid=True) for kind, t, s in (("grammar", 41, 2.0), ("json_schema", 90, 4.0))]
    rows = {r.mode: r for r in report_structured.rows(summarize(runs, peer))}
    assert all(r.category == "structured" for r in rows.values())
    assert rows["auto"].valid_share == 0.5 and rows["auto"].forced_share == pytest.approx(20 / 82)
    assert rows["auto"].answer_s == pytest.approx(1.8) and rows["llama.cpp-json_schema"].answer_s == pytest.approx(4.25)
    goals = {g.name.split(": ", 1)[1]: g for g in report_structured.goals(summarize(runs, peer))}
    assert goals["auto vs ar under the same constraint"].value == pytest.approx(2.0 / 1.6)
    assert goals["auto vs llama.cpp-grammar under the same constraint"].value == pytest.approx(25 / 20.5)
    whole = goals["auto's whole answer vs llama.cpp-json_schema's, and as many valid"]
    assert whole.value == pytest.approx(4.25 / 1.8) and whole.met is False  # faster, but fewer valid (1 of 2 vs 1 of 1)
    assert "valid 1 vs 1 of 2 and 1" in whole.detail
