"""The editors' endpoints on the fake backend (tests/fakes.py, with FIM tokens): /infill in llama.vim's exact
request bodies (its completion and its warm-up), /completion with a string or token prompt, /v1/completions
with `suffix`; each answer equal to the engine's own generation over the same layout (infill.py), the response
fields llama-server names (flattened by response_fields as it flattens them), the warm-up's cache reused by
the next request (tokens_cached, timings.prompt_n), --cache-reuse, n_indent, t_max_predict_ms and stop words
as llama-server applies them, streaming; llama.vscode's, Continue's and Tabby's request bodies. Bad requests
and dropped ones: test_serve_infill_faults.py.
The layout itself and the stop rules: tests/unit/test_infill.py."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from fakes import ALPHABET, FakeContext, FakeModel
from ssd_edge.config import EngineConfig
from ssd_edge.engine import Engine
from ssd_edge.events import FinishEvent
from ssd_edge.config import SamplingConfig
from ssd_edge.infill import Chunk, layout
from ssd_edge.llama.kvseq import common_prefix
from ssd_edge.server import create_app
from ssd_edge.server.llama_protocol import flatten
from ssd_edge.stops import IndentLimit
from test_serve import metric, sse

# llama.vim's request bodies (autoload/llama.vim, ggml-org/llama.vim a1c8e6e), as it sends them: with "model": ""
# too (it means to send its model_fim setting only when set, but tests the length of the setting's name)
VIM_FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
              "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
              "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]
EXTRA = [{"text": "def helper(x):\n    return x + 1\n", "time": 12.5, "filename": "util.py"},
         {"text": "class Point:\n    pass\n", "time": 13.0, "filename": "geo.py"}]
VIM_INFILL = {"id_slot": 0, "model": "", "input_prefix": "def area(r):\n", "input_suffix": "\nprint(area(2))\n",
              "input_extra": EXTRA, "prompt": "    ret", "n_predict": 128, "stop": [], "n_indent": 4,
              "top_k": 40, "top_p": 0.90, "samplers": ["top_k", "top_p", "infill"], "stream": False,
              "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 250, "response_fields": VIM_FIELDS}
VIM_WARMUP = {"id_slot": 0, "model": "", "input_prefix": "", "input_suffix": "", "input_extra": EXTRA, "prompt": "",
              "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False, "cache_prompt": True,
              "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""]}

# llama.vscode's (src/llama-server.ts createRequestPayload, ggml-org/llama.vscode v0.0.63, its default settings)
CODE_EXTRA = [{"text": "def helper(x):\n    return x + 1\n", "time": 1765000000000, "filename": "/srv/proj/util.py"}]
CODE_INFILL = {"id_slot": 0, "input_prefix": "def area(r):\n", "input_suffix": "\nprint(area(2))\n",
               "input_extra": CODE_EXTRA, "prompt": "    ret", "n_predict": 128, "n_cmpl": 3, "top_k": 40,
               "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
               "n_indent": 4, "t_max_prompt_ms": 500, "t_max_predict_ms": 2500}
CODE_WARMUP = {"id_slot": 0, "input_prefix": "def area(r):\n", "input_suffix": "\nprint(area(2))\n",
               "input_extra": CODE_EXTRA, "prompt": "    ret", "n_predict": 0, "samplers": [], "cache_prompt": True,
               "t_max_prompt_ms": 500, "t_max_predict_ms": 1}

def fim_engine(*, delay: float = 0.0, alphabet: bool = False, n_ctx: int = 4096, cache_reuse: int = 0) -> Engine:
    """A fake pair whose vocabulary has FIM tokens (`alphabet`: one character a token, line breaks and
    spaces among them, so that n_indent and t_max_predict_ms have lines to read)."""
    cfg = EngineConfig.build(target=dict(path="fake-target", threads=2), draft=dict(path="fake-draft", threads=2),
                             n_ctx=n_ctx, mode="auto", cache_reuse=cache_reuse)
    chars = ALPHABET if alphabet else None
    target, draft = FakeModel("target", alphabet=chars, fim=True), FakeModel("draft", 3, alphabet=chars, fim=True)
    return Engine.from_parts(cfg, target, FakeContext(target, n_ctx=n_ctx, decode_delay=delay), draft,
                             FakeContext(draft, n_ctx=2 * n_ctx, n_seq_max=cfg.prespec.fanout_max + 1,
                                         decode_delay=delay))


def own(eng: Engine, tokens, n: int, **kw) -> FinishEvent:
    """The engine's own answer (before the server runs it)."""
    fin = None
    for ev in eng.generate(tokens=list(tokens), max_tokens=n, **kw):
        fin = ev if isinstance(ev, FinishEvent) else fin
    return fin


@pytest.fixture(autouse=True)
def two_cores(monkeypatch):
    monkeypatch.setattr("ssd_edge.planning.rounds.usable_cores", lambda: 2)


@pytest.fixture
def served():
    def start(eng: Engine) -> TestClient:
        c = TestClient(create_app(eng, model_id="fake"))
        c.__enter__()
        c.engine = eng
        clients.append(c)
        return c
    clients: list[TestClient] = []
    yield start
    for c in clients:
        c.__exit__(None, None, None)


# ---------------------------------------------------------------- /infill

def test_infill_answers_llama_vims_request_with_the_fields_it_reads(served):
    c = served(fim_engine())
    r = c.post("/infill", json=VIM_INFILL)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == set(VIM_FIELDS)  # flattened: each path is a key, nothing else
    assert isinstance(body["content"], str) and body["timings/predicted_n"] > 0
    assert body["timings/prompt_n"] + body["tokens_cached"] > 0 and body["truncated"] is False


def test_infill_answers_llama_vscodes_requests(served):
    """Its warm-up reads the prompt its completion then reuses; the completion asks n_cmpl 3 and reads a list
    of objects with `content` (one after another here, each on its own seed)."""
    eng = fim_engine()
    c = served(eng)
    warm = c.post("/infill", json=CODE_WARMUP)
    assert warm.status_code == 200 and warm.json()["tokens_predicted"] == 0 and warm.json()["content"] == ""
    r = c.post("/infill", json={**CODE_INFILL, "seed": 5})
    assert r.status_code == 200, r.text
    answers = r.json()
    assert [a["index"] for a in answers] == [0, 1, 2] and all(isinstance(a["content"], str) for a in answers)
    n = answers[0]["tokens_evaluated"]
    assert answers[0]["tokens_cached"] == n - 1  # the warm-up read all of it but the last token
    one = c.post("/infill", json={**CODE_INFILL, "n_cmpl": 1, "seed": 6}).json()
    assert one["content"] == answers[1]["content"]  # the second answer's seed is seed + 1


@pytest.mark.parametrize("seed", [8, 9])
def test_llama_vims_samplers_draw_under_llama_cpps_infill_sampler(served, seed):
    """llama.vim asks for samplers top_k, top_p and infill, without a temperature: the answer is the engine's
    own draw at temperature 1 under the infill sampler (structured/infill_filter.py), not the one without it."""
    eng = fim_engine()
    extra = [Chunk(e["text"], e["filename"]) for e in EXTRA]
    laid = layout(eng.target, "def f():\n", "\nf()\n", prompt="  ", extra=extra, n_batch=512, n_ctx=4096, n_predict=20)
    s = SamplingConfig(temperature=1.0, top_k=40, top_p=0.9, min_p=0.0, seed=seed)
    ref = own(eng, laid.tokens, 20, mode="ar", sampling=s.model_copy(update=dict(infill=True)))
    eng.reset()
    c = served(eng)
    body = {k: v for k, v in VIM_INFILL.items() if k not in ("response_fields", "n_indent", "t_max_predict_ms")}
    r = c.post("/infill", json={**body, "input_prefix": "def f():\n", "input_suffix": "\nf()\n", "prompt": "  ",
                                "n_predict": 20, "seed": seed, "mode": "sd"}).json()
    assert r["tokens"] == list(ref.tokens)
    eng.reset()
    assert own(eng, laid.tokens, 20, mode="ar", sampling=s).tokens != ref.tokens


def test_infill_is_the_engines_answer_over_the_layout(served):
    eng = fim_engine()
    extra = [Chunk(e["text"], e["filename"]) for e in EXTRA]
    laid = layout(eng.target, "def f():\n", "\nf()\n", prompt="  ", extra=extra, n_batch=512, n_ctx=4096, n_predict=20)
    ref = own(eng, laid.tokens, 20, mode="ar")
    eng.reset()
    c = served(eng)
    body = {k: v for k, v in VIM_INFILL.items() if k not in ("samplers", "response_fields", "n_indent",
                                                             "t_max_predict_ms")}
    r = c.post("/infill", json={**body, "input_prefix": "def f():\n", "input_suffix": "\nf()\n", "prompt": "  ",
                                "n_predict": 20, "mode": "sd"}).json()
    assert r["content"] == ref.text and r["tokens"] == list(ref.tokens)
    assert r["stop"] is True and r["stop_type"] == "limit" and r["stopping_word"] == ""
    assert r["tokens_evaluated"] == len(laid.tokens) and r["tokens_predicted"] == 20
    assert r["tokens_cached"] == 0 and r["timings"]["prompt_n"] == len(laid.tokens)
    t = r["timings"]
    assert t["predicted_n"] == 20 and t["prompt_ms"] > 0 and t["predicted_ms"] >= 0 and t["predicted_per_second"] >= 0
    gs = r["generation_settings"]
    assert gs["n_predict"] == 20 and gs["top_k"] == 40 and gs["mode"] == "sd" and gs["temperature"] == 0.0
    assert r["speculation"]["mode"] == "sd"


def test_the_warm_up_reads_the_prompt_and_the_next_request_reuses_it(served):
    eng = fim_engine()
    c = served(eng)
    r = c.post("/infill", json=VIM_WARMUP)
    assert r.status_code == 200 and r.json() == {}  # response_fields [""]: a path that is not there
    warm = layout(eng.target, "", "", extra=[Chunk(e["text"], e["filename"]) for e in EXTRA], n_predict=0)
    assert list(eng.target_kv.tokens) == list(warm.tokens)  # in the cache, nothing generated
    full = c.post("/infill", json={**VIM_WARMUP, "input_prefix": "x = ", "n_predict": 4, "response_fields": None})
    body = full.json()
    shared = len(warm.tokens) - 2  # the extra context and the prefix token (then the suffix and middle ones)
    assert body["tokens_cached"] == shared and body["timings"]["prompt_n"] == body["tokens_evaluated"] - shared
    assert metric(c.get("/metrics").text, "ssd_edge_generations_total", reason="prefill") == 1
    again = c.post("/infill", json={**VIM_WARMUP, "response_fields": ["tokens_cached", "timings/prompt_n",
                                                                      "stop_type"]}).json()
    # the cache holds that request's prompt and answer: the warm-up shares their extra context and prefix token
    assert again == {"tokens_cached": shared, "timings/prompt_n": len(warm.tokens) - shared, "stop_type": "limit"}


def test_a_warm_up_with_more_context_than_fits_is_cut_to_fit(served):
    """llama.vim's ring of 16 chunks of 64 lines is more than a small context holds: the oldest go, and the
    warm-up still fits with room for an answer's first token (not a 400)."""
    c = served(fim_engine(n_ctx=1024))  # n_batch 512: prefix and suffix take up to 513 of it
    ring = [{"text": f"chunk {i}\n" * 200, "time": float(i), "filename": f"f{i}.py"} for i in range(16)]
    r = c.post("/infill", json={**VIM_WARMUP, "input_prefix": "a" * 600, "input_suffix": "b" * 300,
                                "input_extra": ring, "response_fields": ["truncated", "tokens_evaluated"]})
    assert r.status_code == 200, r.text
    assert r.json() == {"truncated": True, "tokens_evaluated": 1023}


def test_a_warm_up_reads_with_every_core(served):
    """Where threads follow the mode (no -t/-td), the target reads a warm-up alone: mode ar's split, every
    core (2 here), not what the last generation's mode left it (ssd's 1)."""
    eng = fim_engine()
    eng.config = eng.config.model_copy(update={"threads_follow_mode": True})
    eng.use_threads(1, 1)
    served(eng).post("/infill", json=VIM_WARMUP)
    assert eng.threads[0] == 2


def test_n_indent_ends_the_answer_where_the_block_does(served):
    eng = fim_engine(alphabet=True)
    laid = layout(eng.target, "a", "b", n_predict=200)
    whole = own(eng, laid.tokens, 200, mode="ar").text
    cut = IndentLimit(3).cut(whole, 0)
    assert cut is not None, "the fake answer has a line to stop at"
    c = served(eng)
    r = c.post("/infill", json={"input_prefix": "a", "input_suffix": "b", "n_predict": 200, "n_indent": 3}).json()
    assert r["content"] == whole[:cut] and r["stop_type"] == "limit" and r["tokens_predicted"] < 200


def test_t_max_predict_ms_stops_at_a_line_break_after_its_time(served):
    eng = fim_engine(alphabet=True, delay=0.01)
    c = served(eng)
    r = c.post("/infill", json={"input_prefix": "a", "input_suffix": "b", "n_predict": 400, "t_max_predict_ms": 30,
                                "mode": "ar"}).json()
    assert r["stop_type"] == "limit" and "\n" in r["content"] and r["tokens_predicted"] < 400
    assert r["timings"]["predicted_ms"] > 30


def test_a_stop_word_is_named(served):
    eng = fim_engine(alphabet=True)
    laid = layout(eng.target, "a", "b", n_predict=60)
    whole = own(eng, laid.tokens, 60, mode="ar").text
    word = whole[20:23]
    c = served(eng)
    r = c.post("/infill", json={"input_prefix": "a", "input_suffix": "b", "n_predict": 60, "stop": [word]}).json()
    assert r["content"] == whole[:whole.index(word)] and r["stop_type"] == "word" and r["stopping_word"] == word


def test_a_streamed_infill_sends_the_answer_in_chunks_then_the_final_object(served):
    eng = fim_engine()
    c = served(eng)
    whole = c.post("/infill", json={"input_prefix": "ab", "input_suffix": "cd", "n_predict": 16}).json()
    r = c.post("/infill", json={"input_prefix": "ab", "input_suffix": "cd", "n_predict": 16, "stream": True})
    events = sse(r.text)
    assert "[DONE]" not in events and events[-1]["stop"] is True and events[-1]["content"] == ""
    assert all(e["stop"] is False for e in events[:-1])
    assert "".join(e["content"] for e in events[:-1]) == whole["content"]
    assert sum(len(e["tokens"]) for e in events[:-1]) == 16 and events[-1]["timings"]["predicted_n"] == 16


def test_samplers_turn_off_the_filters_they_leave_out(served):
    c = served(fim_engine())
    gs = c.post("/infill", json={**VIM_INFILL, "response_fields": ["generation_settings"], "n_predict": 2}).json()
    gs = gs["generation_settings"]
    assert (gs["top_k"], gs["top_p"], gs["min_p"], gs["temperature"]) == (40, 0.9, 0.0, 1.0)


@pytest.mark.parametrize("reuse", [0, 16])
def test_cache_reuse_reads_only_what_moved_in(served, reuse):
    """The editor's window loses lines at the top: with --cache-reuse the rest of the prompt is moved, not
    read (the fake's logits come from the tokens each position holds, so its answer is a cold read's; a
    real model's is an approximation); without it, everything after the first token is read again."""
    lines = [f"line{i} = {i} * {i}\n" for i in range(20)]  # ~300 tokens: under the prefix cut (384)
    body = {"input_suffix": "\nend\n", "n_predict": 8, "mode": "ar"}
    cold = fim_engine()
    later = "".join(lines[5:]) + "x"
    laid = layout(cold.target, later, "\nend\n", n_predict=8)
    want = own(cold, laid.tokens, 8, mode="ar")
    c = served(fim_engine(cache_reuse=reuse))
    c.post("/infill", json={**body, "input_prefix": "".join(lines) + "x"})
    r = c.post("/infill", json={**body, "input_prefix": later}).json()
    n = r["tokens_evaluated"]
    assert r["content"] == want.text
    if reuse:
        assert r["timings"]["prompt_n"] <= n / 4 and r["tokens_cached"] == n - r["timings"]["prompt_n"]
    else:
        first = layout(cold.target, "".join(lines) + "x", "\nend\n", n_predict=8).tokens
        shared = common_prefix(list(first), list(laid.tokens))  # the extra context's lines, "line"
        assert r["tokens_cached"] == shared < n / 8 and r["timings"]["prompt_n"] == n - shared


# ---------------------------------------------------------------- /completion and /v1/completions' suffix

def test_completion_takes_a_string_or_token_ids(served):
    eng = fim_engine()
    ids = eng.tokenize("hello", parse_special=True)
    ref = own(eng, ids, 10, mode="ar")
    c = served(eng)
    for prompt in ("hello", ids):
        r = c.post("/completion", json={"prompt": prompt, "n_predict": 10}).json()
        assert r["content"] == ref.text and r["tokens_evaluated"] == len(ids) and r["stop_type"] == "limit"
    assert c.post("/completion", json={"prompt": "hello", "n_predict": 10,
                                       "response_fields": ["content", "timings/predicted_n"]}).json() == {
        "content": ref.text, "timings/predicted_n": 10}


def test_completion_in_continues_llama_cpp_shape(served):
    """Continue's llama.cpp provider (core/llm/llms/LlamaCpp.ts): a templated prompt, streamed, its options
    under llama-server's names; it reads each event's `content`, and sends `Authorization: Bearer undefined`
    when no key is set."""
    eng = fim_engine()
    ids = eng.tokenize("<pre>def f(<suf>):<mid>", parse_special=True)
    ref = own(eng, ids, 12, mode="auto", stop=["\n\n"])
    c = served(eng)
    body = {"prompt": "<pre>def f(<suf>):<mid>", "stream": True, "n_predict": 12, "frequency_penalty": 0,
            "presence_penalty": 0, "min_p": 0.05, "stop": ["\n\n"], "top_k": 40, "top_p": 0.95, "temperature": 0}
    r = c.post("/completion", json=body, headers={"Authorization": "Bearer undefined"})
    events = sse(r.text)
    assert "".join(e["content"] for e in events) == ref.text and events[-1]["stop"] is True


@pytest.mark.parametrize("seed", [7, 2**64 - 1])
def test_completion_in_tabbys_llama_cpp_shape(served, seed):
    """Tabby's llama.cpp binding (crates/http-api-bindings/src/completion/llama.rs): a u64 seed, streamed; it
    reads each event's `content` and `stop`, and stops at the first with `stop` true."""
    c = served(fim_engine())
    body = {"seed": seed, "prompt": "<pre>def f(<suf>):<mid>", "n_predict": 12, "temperature": 0.2, "stream": True,
            "penalty_last_n": 0, "presence_penalty": 0.0}
    events = sse(c.post("/completion", json=body).text)
    assert all(set(e) >= {"content", "stop"} for e in events) and [e["stop"] for e in events][-1] is True
    whole = c.post("/completion", json={**body, "stream": False}).json()
    assert "".join(e["content"] for e in events) == whole["content"] and whole["tokens_predicted"] == 12


def test_completion_holds_to_llama_servers_json_schema_and_grammar_fields(served):
    import json
    import re

    c = served(fim_engine(alphabet=True))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    r = c.post("/completion", json={"prompt": "ab", "n_predict": 40, "json_schema": schema}).json()
    assert isinstance(json.loads(r["content"])["a"], int) and r["stop_type"] == "eos"
    r = c.post("/completion", json={"prompt": "ab", "n_predict": 8, "grammar": 'root ::= "ab" [0-9]+'}).json()
    assert re.fullmatch(r"ab[0-9]+", r["content"]), r["content"]
    bad = c.post("/completion", json={"prompt": "ab", "grammar": "root ::= ("})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "grammar"


def test_v1_completions_with_a_suffix_fills_in_the_middle(served):
    eng = fim_engine()
    laid = layout(eng.target, "def f(", "):\n", n_batch=512, n_ctx=4096, n_predict=12)
    ref = own(eng, laid.tokens, 12, mode="ar")
    c = served(eng)
    r = c.post("/v1/completions", json={"prompt": "def f(", "suffix": "):\n", "max_tokens": 12})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == ref.text
    assert r.json()["usage"]["prompt_tokens"] == len(laid.tokens)


def test_flatten_keeps_the_paths_there_under_their_own_names():
    body = {"content": "x", "timings": {"prompt_n": 3}, "stop": True}
    assert flatten(body, ["content", "timings/prompt_n", "timings/nope", "nope/x"]) == {
        "content": "x", "timings/prompt_n": 3}
    assert flatten(body, None) == body and flatten(body, []) == body and flatten(body, [""]) == {}


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_cache_reuse_moves_the_drafts_chunks_too(served, mode):
    """With --cache-reuse the draft's cache moves its chunks as the target's does: after the window lost lines
    at the top, the draft reads only what is new (its decodes' tokens), and the answer is ar's cold one."""
    lines = [f"line{i} = {i} * {i}\n" for i in range(20)]
    body = {"input_suffix": "\nend\n", "n_predict": 8, "mode": mode}
    later = "".join(lines[5:]) + "x"
    cold = fim_engine()
    want = own(cold, layout(cold.target, later, "\nend\n", n_predict=8).tokens, 8, mode="ar")
    eng = fim_engine(cache_reuse=16)
    c = served(eng)
    c.post("/infill", json={**body, "input_prefix": "".join(lines) + "x"})
    before = sum(eng.draft_ctx.batch_sizes)
    r = c.post("/infill", json={**body, "input_prefix": later}).json()
    read = sum(eng.draft_ctx.batch_sizes) - before
    assert r["content"] == want.text
    assert r["timings"]["prompt_n"] <= r["tokens_evaluated"] / 4
    assert read <= r["tokens_evaluated"] / 4 + 8 * 8  # what moved in, and its drafts (8 tokens at most a round)
