"""The structured benchmark on the small real pair: a JSON-schema extraction and a required tool call
(SmolLM2's template knows no tool tags: the generic JSON call format), modes ar and auto, every answer
valid, the grammar's forced tokens counted, auto giving ar's tokens; and llama-server as the peer
under the same constraint where scripts/build_llama_tools.sh has built it."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from ssd_edge.bench import peer_server
from ssd_edge.bench.schema import BenchResult
from ssd_edge.cli import commands as cli

CITY = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12}, "country": {"type": "string", "enum": ["France", "Spain", "Italy"]},
    "population_millions": {"type": "integer", "minimum": 0, "maximum": 40}},
    "required": ["city", "country", "population_millions"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
PROMPTS = [
    {"id": "city", "category": "extraction", "max_tokens": 48,
     "messages": [{"role": "user", "content": "Paris is the capital of France; about 2 million people live there."}],
     "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}},
    {"id": "weather", "category": "tool-call", "max_tokens": 48,
     "messages": [{"role": "user", "content": "What is the weather in Rome, in celsius?"}],
     "tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False},
]


def bench(small_pair, tmp_path, *extra: str) -> BenchResult:
    target, draft = small_pair
    prompts = tmp_path / "structured.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    with CliRunner().isolation() as (_, err, _):
        code = cli.run(["bench", "-m", str(target), "-md", str(draft), "--prompts", str(prompts), "--settings",
                        "shared", "--no-calibrate", "--no-plot", "-o", str(tmp_path / "out"), *extra])
        sys.stderr.flush()
        log = err.getvalue().decode()
    assert code == 0, log
    return BenchResult.model_validate_json((tmp_path / "out" / "bench.json").read_text())


def test_structured_bench_on_the_small_pair(small_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_EDGE_HOME", str(tmp_path / "home"))
    result = bench(small_pair, tmp_path, "--modes", "ar,auto", "--no-peer")
    runs = {(r.mode, r.prompt_id): r for r in result.runs if r.rep >= 0}
    assert set(runs) == {(m, p["id"]) for m in ("ar", "auto") for p in PROMPTS}
    for r in runs.values():
        assert r.valid, (r.mode, r.prompt_id, r.invalid)
        assert r.stop_reason == "eos"
        assert (0 < r.forced < r.tokens) if r.mode == "auto" else r.forced == 0  # ar's plain steps take none
        assert r.output_sha == runs[("ar", r.prompt_id)].output_sha  # the small pair's logits are bitwise equal
    rows = {r.mode: r for r in result.summary if r.category == "all"}
    assert rows["auto"].valid_share == 1.0 and 0 < rows["auto"].forced_share < 1 and rows["auto"].answer_s > 0
    assert any(g.name == "shared, structured: auto vs ar under the same constraint" for g in result.goals)


@pytest.mark.skipif(peer_server.find() is None, reason="llama-server is not built: scripts/build_llama_tools.sh "
                    "builds it (about 20 minutes on 2 cores); the bench then runs it as the structured peer")
def test_llama_server_runs_as_the_structured_peer(small_pair, tmp_path, monkeypatch):
    built = peer_server.find()  # in the real home: the test's own home holds no llama.cpp tools
    monkeypatch.setenv("SSD_EDGE_HOME", str(tmp_path / "home"))
    result = bench(small_pair, tmp_path, "--modes", "ar", "--llama-tools", str(built.parent))
    assert not result.peer.errors, result.peer.errors
    peer = {(r.kind, r.prompt_id): r for r in result.peer.runs}
    assert set(peer) == {(k, p["id"]) for k in peer_server.KINDS for p in PROMPTS}
    for r in peer.values():
        assert r.tokens > 0 and r.answer_s > 0 and r.valid is not None
        assert r.prompt_tokens == next(x.prompt_tokens for x in result.runs if x.prompt_id == r.prompt_id)
    for p in PROMPTS:  # its GBNF with the rigid separators holds it as llguidance holds ssd-edge
        assert peer[("grammar", p["id"])].valid, peer[("grammar", p["id"])].invalid
