"""`ssd-edge serve` on the fake backend: the OpenAI wire format (chat and completions, whole and
streamed), the answers equal to the engine's own, per-request settings, every malformed request
answered with a 4xx in OpenAI's error shape, the API key, the bounded queue (503 + Retry-After),
cancellation when a client disconnects, graceful shutdown, /metrics agreeing with what clients
saw, and a load test. The concurrent cases run a real uvicorn on 127.0.0.1 with a free port.
The last test serves the small real pair through the console script and the `openai` client."""

from __future__ import annotations

import concurrent.futures as cf
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from fakes import FakeContext, FakeModel
from ssd_edge.settings import resolve
from ssd_edge.config import EngineConfig
from ssd_edge.engine import Engine
from ssd_edge.events import FinishEvent
from ssd_edge.server import create_app
from ssd_edge.server import scheduler as scheduler_mod
from ssd_edge.server.runner import is_loopback, options

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "count"}]


def fake_engine(disagree_every: int = 3, *, delay: float = 0.0, draft_delay: float | None = None,
                threads: tuple[int, int] = (2, 2), n_ctx: int = 1024, mode: str = "auto") -> Engine:
    """A fake pair (tests/fakes.py); `delay` seconds per decode makes generations take time
    (`draft_delay`, where given, is the draft's)."""
    cfg = EngineConfig.build(target=dict(path="fake-target", threads=threads[0]),
                             draft=dict(path="fake-draft", threads=threads[1]), n_ctx=n_ctx, mode=mode)
    target, draft = FakeModel("target"), FakeModel("draft", disagree_every=disagree_every)
    return Engine.from_parts(cfg, target, FakeContext(target, n_ctx=n_ctx, decode_delay=delay), draft,
                             FakeContext(draft, n_ctx=2 * n_ctx, n_seq_max=cfg.prespec.fanout_max + 1,
                                         decode_delay=delay if draft_delay is None else draft_delay))


def reference(eng: Engine, *, prompt: str | None = None, messages=None, n: int = 24, **kw) -> FinishEvent:
    """What the engine itself answers (before the server runs it; plain-text prompts as the server
    tokenizes them)."""
    tokens = eng.prompt_tokens(None, messages) if messages else eng.target.tokenize(prompt, parse_special=True)
    fin = None
    for ev in eng.generate(tokens=tokens, max_tokens=n, **kw):
        fin = ev if isinstance(ev, FinishEvent) else fin
    return fin


@pytest.fixture(autouse=True)
def two_cores(monkeypatch):
    monkeypatch.setattr("ssd_edge.planning.rounds.usable_cores", lambda: 2)


@pytest.fixture
def client():
    eng = fake_engine()
    with TestClient(create_app(eng, model_id="fake")) as c:
        c.engine = eng
        yield c


def sse(text: str) -> list[Any]:
    """The data fields of an event stream: JSON objects, and the final '[DONE]'."""
    out = []
    for line in text.splitlines():
        if line.startswith("data:"):
            data = line[5:].strip()
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def wait_until(cond: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll until cond() holds. The limit stops a hang (it returns as soon as cond holds), so it is
    generous: never a bound on how fast the server is."""
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


class Live:
    """A real uvicorn serving `app` on 127.0.0.1 and a free port, in a thread."""

    def __init__(self, app) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started)

    @property
    def scheduler(self):
        return self.app.state.api.scheduler

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics").text

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        assert not self.thread.is_alive()


@pytest.fixture
def live():
    started = []

    def start(eng: Engine | None = None, **kw) -> Live:
        eng = eng or fake_engine(delay=0.002)
        srv = Live(create_app(eng, model_id="fake", **kw))
        srv.engine = eng
        started.append(srv)
        return srv
    yield start
    for srv in started:
        srv.stop()


# ---------------------------------------------------------------- the wire format

def test_chat_completion_is_the_engines_answer(client):
    ref = reference(client.engine, messages=MESSAGES, n=20, mode="auto")
    r = client.post("/v1/chat/completions", json={"model": "fake", "messages": MESSAGES, "max_tokens": 20})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["model"] == "fake"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": ref.text}
    assert choice["finish_reason"] == "length"
    n_prompt = len(client.engine.prompt_tokens(None, MESSAGES))
    assert body["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 20, "total_tokens": n_prompt + 20}
    spec = body["speculation"]
    assert spec["mode"] == "auto" and sum(spec["tokens_by_source"].values()) == 20
    assert sum(spec["rounds_by_proposer"].values()) == spec["rounds"] > 0
    assert set(spec["planner_decisions"]) <= {"plain", "ngram", "draft", "prepared"}


def test_completion_whole_and_streamed_agree(client):
    ref = reference(client.engine, prompt="def f(x):", n=16, mode="sd")
    req = {"prompt": "def f(x):", "max_tokens": 16, "mode": "sd"}
    whole = client.post("/v1/completions", json=req).json()
    assert whole["object"] == "text_completion" and whole["choices"][0]["text"] == ref.text
    r = client.post("/v1/completions", json={**req, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == ref.text
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["speculation"]["mode"] == "sd" and chunks[-1]["speculation"]["drafted"] > 0
    assert len({c["id"] for c in chunks}) == 1


def test_chat_stream_opens_with_the_role_and_can_carry_usage(client):
    ref = reference(client.engine, messages=MESSAGES, n=12, mode="auto")
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 12, "stream": True,
                                                  "stream_options": {"include_usage": True}})
    events = sse(r.text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-1] == "[DONE]"
    usage_chunk, last = events[-2], events[-3]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 12
    assert last["choices"][0]["finish_reason"] == "length" and "speculation" in last
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[1:-2]) == ref.text


def test_stop_strings_cut_the_answer(client):
    ref = reference(client.engine, prompt="abc", n=16, mode="ar")
    piece = ref.text.split(">")[5] + ">"  # the sixth token's text, e.g. '<17>'
    cut = ref.text[:ref.text.index(piece)]
    for stream in (False, True):
        r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 16, "stop": [piece, "never"],
                                                 "stream": stream})
        if stream:
            chunks = sse(r.text)[:-1]
            text = "".join(c["choices"][0]["text"] for c in chunks)
            reason = chunks[-1]["choices"][0]["finish_reason"]
        else:
            text, reason = r.json()["choices"][0]["text"], r.json()["choices"][0]["finish_reason"]
        assert (text, reason) == (cut, "stop")


def test_a_seed_replays_the_same_sample_in_every_mode(client):
    req = {"prompt": "xyz", "max_tokens": 24, "temperature": 0.9, "seed": 11}
    texts = {m: client.post("/v1/completions", json={**req, "mode": m}).json()["choices"][0]["text"]
             for m in ("ar", "sd", "ssd", "auto")}
    assert len(set(texts.values())) == 1, texts
    greedy = client.post("/v1/completions", json={**req, "temperature": 0}).json()["choices"][0]["text"]
    assert greedy != texts["ar"]  # the sample is not simply the greedy answer
    # without a seed the answer reports the one it drew, and that seed replays it
    drawn = client.post("/v1/completions", json={**req, "seed": None}).json()
    seed = drawn["speculation"]["seed"]
    assert isinstance(seed, int)
    again = client.post("/v1/completions", json={**req, "seed": seed}).json()
    assert again["choices"][0]["text"] == drawn["choices"][0]["text"]


def test_per_request_draft_settings_apply_once(client):
    eng = client.engine
    before = eng.config
    rounds = {}
    for n_max in (1, 6):
        r = client.post("/v1/completions", json={"prompt": "q", "max_tokens": 42, "mode": "sd",
                                                 "speculative": {"n_max": n_max, "n_min": 0, "p_min": 0.0}})
        spec = r.json()["speculation"]
        rounds[n_max] = spec["rounds"]
        assert spec["drafted"] <= n_max * spec["rounds"]
        assert eng.config == before  # the server's own settings are back after each request
    assert rounds[6] < rounds[1]


def test_token_ids_as_the_prompt(client):
    ids = client.engine.target.tokenize("hello", parse_special=True)
    a = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 8}).json()
    b = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 8}).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


def test_models_and_health(client):
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["fake"]
    assert models["data"][0]["meta"]["draft"] == "fake-draft"
    assert client.get("/v1/models/fake").json()["id"] == "fake"
    assert client.get("/v1/models/gpt-4").status_code == 404
    health = client.get("/health").json()
    assert health == {"status": "ok", "model": "fake", "busy": False, "queue_depth": 0, "queue_capacity": 8}


# ---------------------------------------------------------------- bad input

CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
OK_CHAT = {"messages": [{"role": "user", "content": "hi"}]}

BAD = [  # (path, body: dict or raw bytes, status, param)
    (CHAT, b'{"messages": [', 400, None),
    (CHAT, b"", 400, None),
    (CHAT, b"[1, 2]", 400, None),
    (CHAT, b'{"messages": "\xff\xfe"}', 400, None),
    (CHAT, b"[" * 100_000, 400, None),
    (CHAT, {**OK_CHAT, "max_tokens": "5"}, 400, "max_tokens"),
    (CHAT, {**OK_CHAT, "max_tokens": -1}, 400, "max_tokens"),
    (CHAT, {**OK_CHAT, "max_tokens": 0}, 400, "max_tokens"),
    (CHAT, {**OK_CHAT, "temperature": "hot"}, 400, "temperature"),
    (CHAT, {**OK_CHAT, "temperature": -1}, 400, "temperature"),
    (CHAT, {**OK_CHAT, "top_p": 0}, 400, "top_p"),
    (CHAT, {**OK_CHAT, "stream": "yes"}, 400, "stream"),
    (CHAT, {**OK_CHAT, "n": 0}, 400, "n"),
    (CHAT, {**OK_CHAT, "n": 99}, 400, "n"),
    (CHAT, {**OK_CHAT, "model": "gpt-4"}, 404, "model"),
    (CHAT, {**OK_CHAT, "mode": "turbo"}, 400, "mode"),
    (CHAT, {**OK_CHAT, "speculative": {"n_max": 0}}, 400, "speculative.n_max"),
    (CHAT, {**OK_CHAT, "speculative": {"p_min": 1.5}}, 400, "speculative.p_min"),
    (CHAT, {**OK_CHAT, "stop": 5}, 400, "stop"),
    (CHAT, {**OK_CHAT, "stop": [str(i) for i in range(17)]}, 400, "stop"),
    (CHAT, {**OK_CHAT, "logprobs": 5}, 400, "logprobs"),
    (CHAT, {**OK_CHAT, "frequency_penalty": 2.5}, 400, "frequency_penalty"),
    (CHAT, {**OK_CHAT, "tools": [{"type": "function"}]}, 400, "tools[0].function"),
    (CHAT, {}, 400, "messages"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages.0.content"),
    (CHAT, {"messages": [{"role": "user", "content": "x" * 2000}]}, 400, "messages"),  # longer than the context
    (TEXT, {"prompt": ""}, 400, "prompt"),
    (TEXT, {"prompt": ["a", "b"]}, 400, "prompt"),
    (TEXT, {"prompt": [1, 99999]}, 400, "prompt"),
    (TEXT, {"prompt": "x", "echo": True}, 400, "echo"),
    (TEXT, {"prompt": "x", "suffix": "y"}, 400, "suffix"),
    (TEXT, {"prompt": "x" * 2000}, 400, "prompt"),
    (TEXT, {"prompt": "x", "n": -3}, 400, "n"),
]


@pytest.mark.parametrize("path,body,status,param", BAD, ids=[f"{i}-{b[3]}" for i, b in enumerate(BAD)])
def test_a_malformed_request_gets_a_4xx_in_openais_shape(client, path, body, status, param):
    r = client.post(path, **({"content": body} if isinstance(body, bytes) else {"json": body}))
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param
    if isinstance(body, dict) and "x" * 2000 in json.dumps(body):
        assert err["code"] == "context_length_exceeded"
    ok = client.post(CHAT, json={**OK_CHAT, "max_tokens": 4})  # and the server keeps serving
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4


def test_a_10_mb_body_is_refused_before_it_is_read(client):
    big = b'{"prompt": "' + b"x" * (10 << 20) + b'"}'
    r = client.post(TEXT, content=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunked():  # no Content-Length: the limit applies while reading
        for _ in range(10):
            yield b"x" * (1 << 20)
    r = client.post(TEXT, content=chunked())
    assert r.status_code == 413
    assert client.post(TEXT, json={"prompt": "a", "max_tokens": 2}).status_code == 200


@pytest.mark.parametrize("api_key", [None, "k"])
def test_every_client_sees_the_413_even_one_that_sends_its_whole_body_first(live, api_key):
    """urllib writes the whole body before it reads a byte: an answer sent (and the socket closed)
    while the body still arrives reached it as "connection reset by peer". The server reads and
    drops a refused body (up to DRAIN_MOST) before it answers, also where the API key is wrong."""
    import urllib.error
    import urllib.request

    from openai import APIStatusError, OpenAI

    srv = live(max_body=2048, api_key=api_key)
    big = json.dumps({"model": "fake", "prompt": "x" * (12 << 20)}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key or 'none'}"}
    req = urllib.request.Request(srv.url + TEXT, data=big, headers=headers)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=60)
    assert err.value.code == 413 and json.loads(err.value.read())["error"]["code"] == "request_too_large"
    client = OpenAI(base_url=srv.url + "/v1", api_key=api_key or "none", max_retries=0)
    with pytest.raises(APIStatusError) as err:
        client.completions.create(model="fake", prompt="x" * (12 << 20), max_tokens=2)
    assert err.value.status_code == 413
    ok = client.completions.create(model="fake", prompt="a", max_tokens=2)  # and it keeps serving
    assert ok.usage.completion_tokens == 2


def test_unknown_routes_and_methods_answer_in_the_same_shape(client):
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = client.get(CHAT)
    assert r.status_code == 405 and r.json()["error"]["message"]


def test_the_api_key():
    with TestClient(create_app(fake_engine(), model_id="fake", api_key="s3cret")) as c:
        assert c.post(CHAT, json=OK_CHAT).status_code == 401
        r = c.post(CHAT, json=OK_CHAT, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert c.post(CHAT, json=OK_CHAT, headers={"Authorization": "Basic s3cret"}).status_code == 401
        assert c.get("/metrics").status_code == 401 and c.get("/v1/models").status_code == 401
        assert c.get("/health").status_code == 200
        ok = c.post(CHAT, json={**OK_CHAT, "max_tokens": 3}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200


def test_opening_the_server_needs_an_api_key():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
    env: dict[str, str] = {}
    assert options(resolve({}, env))["host"] == "127.0.0.1"
    with pytest.raises(Exception, match="--api-key"):
        options(resolve({"host": "0.0.0.0"}, env))
    assert options(resolve({"host": "0.0.0.0"}, {"SSD_EDGE_API_KEY": "k"}))["api_key"] == "k"
    with pytest.raises(Exception, match="max-queue"):
        options(resolve({"max_queue": -1}, env))


# ---------------------------------------------------------------- the queue, disconnects, shutdown

def long_stream(url: str, opened: list, **extra) -> threading.Thread:
    """A streaming completion held open in a thread; `opened` gets its first content chunk."""
    def run():
        with httpx.Client(timeout=30) as c:
            with c.stream("POST", url + TEXT, json={"prompt": "abc", "max_tokens": 900, "mode": "ar",
                                                   "stream": True, **extra}) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        opened.append(line)
                        return  # leaving the block closes the connection mid-stream
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_client_that_disconnects_mid_stream_cancels_its_generation(live):
    srv = live(fake_engine(delay=0.01))  # 900 tokens in mode ar would take 9 s
    opened: list = []
    long_stream(srv.url, opened).join(60)
    assert opened
    wait_until(lambda: not srv.scheduler.busy)  # returns once idle; the limit only stops a hang
    m = srv.metrics()
    assert metric(m, "ssd_edge_generations_total", reason="cancelled") == 1
    assert metric(m, "ssd_edge_completion_tokens_total") < 900  # it ended before its 900 tokens


def test_a_non_streaming_client_that_gives_up_cancels_too(live):
    srv = live(fake_engine(delay=0.01))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + TEXT, json={"prompt": "abc", "max_tokens": 900, "mode": "ar"}, timeout=0.5)
    wait_until(lambda: not srv.scheduler.busy)
    assert metric(srv.metrics(), "ssd_edge_generations_total", reason="cancelled") == 1


def held_stream(srv, opened: list, hold: threading.Event) -> threading.Thread:
    """A client on its own thread whose long stream stays open (its lines in `opened`) until `hold` is set."""
    def run():
        with httpx.Client(timeout=30) as c:
            with c.stream("POST", srv.url + TEXT, json={"prompt": "abc", "max_tokens": 900, "mode": "ar",
                                                       "stream": True}) as r:
                for line in r.iter_lines():
                    opened.append(line)
                    if hold.is_set():
                        return
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_full_queue_answers_503_with_retry_after(live):
    srv = live(fake_engine(delay=0.01), max_queue=1)
    hold = threading.Event()
    first, second = [], []
    a = held_stream(srv, first, hold)
    wait_until(lambda: srv.scheduler.busy)
    b = held_stream(srv, second, hold)
    wait_until(lambda: srv.scheduler.depth == 1)
    r = httpx.post(srv.url + TEXT, json={"prompt": "x", "max_tokens": 2}, timeout=5)
    assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
    assert int(r.headers["Retry-After"]) >= 1
    health = httpx.get(srv.url + "/health").json()
    assert health["busy"] and health["queue_depth"] == 1
    hold.set()
    a.join(5)
    b.join(5)
    wait_until(lambda: not srv.scheduler.busy and srv.scheduler.depth == 0)
    m = srv.metrics()
    assert metric(m, "ssd_edge_requests_total", status="503") == 1
    assert metric(m, "ssd_edge_queue_depth") == 0


def test_a_queued_client_that_leaves_is_withdrawn(live):
    srv = live(fake_engine(delay=0.01), max_queue=4)
    opened: list = []
    hold = threading.Event()
    t = held_stream(srv, opened, hold)
    wait_until(lambda: srv.scheduler.busy)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + TEXT, json={"prompt": "x", "max_tokens": 2}, timeout=0.3)
    wait_until(lambda: srv.scheduler.depth == 0)  # withdrawn while the first still runs
    assert srv.scheduler.busy
    hold.set()
    t.join(5)
    wait_until(lambda: not srv.scheduler.busy)
    m = srv.metrics()
    assert metric(m, "ssd_edge_generations_total", reason="withdrawn") == 1
    assert metric(m, "ssd_edge_generations_total", reason="cancelled") == 1


def test_shutdown_stops_the_running_generation_and_refuses_the_queue(live):
    srv = live(fake_engine(delay=0.01))
    with cf.ThreadPoolExecutor(3) as pool:
        running = pool.submit(httpx.post, srv.url + TEXT, json={"prompt": "a", "max_tokens": 900, "mode": "ar"},
                              timeout=10)
        wait_until(lambda: srv.scheduler.busy)
        streaming_queued = pool.submit(lambda: httpx.post(srv.url + CHAT, json={**OK_CHAT, "stream": True},
                                                          timeout=10))
        wait_until(lambda: srv.scheduler.depth == 1)
        srv.scheduler.shutdown()
        r = running.result(5)
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        assert "stopped after" in r.json()["error"]["message"]
        events = sse(streaming_queued.result(5).text)
        assert events[-1]["error"]["code"] == "shutting_down"  # the stream had started: an error event
    r = httpx.post(srv.url + TEXT, json={"prompt": "a", "max_tokens": 2}, timeout=5)
    assert r.status_code == 503
    assert srv.scheduler.join(5)


# ---------------------------------------------------------------- /metrics

def test_metrics_agree_with_the_answers(live):
    # a verify slower than a drafted token, so the worker has prepared rounds ready on a loaded
    # machine too (with no delays at all, CI once saw none of ssd's rounds prepared)
    srv = live(fake_engine(3, delay=0.02, draft_delay=0.001, threads=(1, 1)))
    answers = [httpx.post(srv.url + TEXT, json={"prompt": p, "max_tokens": 30, "mode": mode}, timeout=10).json()
               for p, mode in (("aa", "ssd"), ("bb", "auto"), ("cc", "sd"))]
    httpx.post(srv.url + TEXT, json={"prompt": "x", "n": 0})
    m = srv.metrics()
    specs = [a["speculation"] for a in answers]
    assert metric(m, "ssd_edge_requests_total", endpoint=TEXT, status="200") == 3
    assert metric(m, "ssd_edge_requests_total", endpoint=TEXT, status="400") == 1
    assert metric(m, "ssd_edge_generations_total", reason="length") == 3
    assert metric(m, "ssd_edge_completion_tokens_total") == sum(a["usage"]["completion_tokens"] for a in answers)
    assert metric(m, "ssd_edge_prompt_tokens_total") == sum(a["usage"]["prompt_tokens"] for a in answers)
    for source in ("target", "draft", "prespec", "ngram"):
        assert metric(m, "ssd_edge_completion_tokens_total", source=source) == \
            sum(s["tokens_by_source"].get(source, 0) for s in specs)
    assert metric(m, "ssd_edge_rounds_total") == sum(s["rounds"] for s in specs)
    assert metric(m, "ssd_edge_rounds_total", proposer="prepared") == \
        sum(s["rounds_by_proposer"].get("prepared", 0) for s in specs) > 0
    assert metric(m, "ssd_edge_draft_tokens_total") == sum(s["drafted"] for s in specs)
    assert metric(m, "ssd_edge_accepted_tokens_total") == sum(s["accepted"] for s in specs)
    for outcome, key in (("hit", "hits"), ("partial", "partial_hits"), ("miss", "misses")):
        assert metric(m, "ssd_edge_prespec_lookups_total", outcome=outcome) == sum(s["prespec"][key] for s in specs)
    lookups = sum(s["prespec"]["lookups"] for s in specs)
    assert lookups > 0
    assert metric(m, "ssd_edge_prespec_hit_rate") == pytest.approx(sum(s["prespec"]["hits"] for s in specs) / lookups)
    assert metric(m, "ssd_edge_acceptance_rate") == pytest.approx(
        sum(s["accepted"] for s in specs) / sum(s["drafted"] for s in specs))
    assert metric(m, "ssd_edge_token_latency_seconds_count") == metric(m, "ssd_edge_completion_tokens_total")
    assert metric(m, "ssd_edge_token_latency_seconds_count", prespec="hit") > 0
    assert metric(m, "ssd_edge_auto_decisions_total") == sum(specs[1]["planner_decisions"].values()) > 0
    assert metric(m, "ssd_edge_busy_seconds_total", role="draft") > 0
    assert metric(m, "ssd_edge_busy_seconds_total", role="target") > 0
    assert 0 < metric(m, "ssd_edge_utilization", role="target") <= 1
    assert metric(m, "ssd_edge_queue_wait_seconds_count") == 3
    assert metric(m, "ssd_edge_time_to_first_token_seconds_count") == 3
    assert metric(m, "ssd_edge_queue_depth") == 0 and metric(m, "ssd_edge_queue_capacity") == 8
    assert metric(m, "ssd_edge_generations_in_progress") == 0
    # memory by part (the fake models allocate nothing through llama.cpp: the process is all there is)
    assert metric(m, "ssd_edge_memory_bytes", part="rss") > 0
    assert metric(m, "ssd_edge_memory_bytes", part="total") == metric(m, "ssd_edge_memory_bytes", part="other") > 0
    assert metric(m, "ssd_edge_memory_bytes", part="target_weights") == 0


# ---------------------------------------------------------------- load

def ours() -> int:
    """Live threads, not counting anyio's pool (its idle workers linger 10 s by design)."""
    return sum(1 for t in threading.enumerate() if t.name != "AnyIO worker thread")


def test_load_20_clients_100_requests_some_leaving(live, monkeypatch):
    jobs: weakref.WeakSet = weakref.WeakSet()
    init = scheduler_mod.Job.__init__

    def tracked(self, *a, **kw):
        init(self, *a, **kw)
        jobs.add(self)
    monkeypatch.setattr(scheduler_mod.Job, "__init__", tracked)

    eng = fake_engine(3, delay=0.001)
    prompts = [f"p{i:03d}" for i in range(100)]
    expected = {p: reference(eng, prompt=p, n=12, mode="auto").text for p in prompts}
    srv = live(eng, max_queue=8)
    threads_before = ours()

    def one(i: int) -> tuple[str, Any]:
        p = prompts[i]
        leave = i % 7 == 3
        stream = leave or i % 2 == 0
        body = {"prompt": p, "max_tokens": 2000 if leave else 12, "stream": stream}
        with httpx.Client(timeout=30) as c:
            if not stream:
                r = c.post(srv.url + TEXT, json=body)
                if r.status_code == 503:
                    return "refused", None
                assert r.status_code == 200, r.text
                return "ok", (p, r.json()["choices"][0]["text"], r.json()["id"], r.json()["usage"])
            with c.stream("POST", srv.url + TEXT, json=body) as r:
                if r.status_code == 503:
                    r.read()
                    return "refused", None
                assert r.status_code == 200
                chunks = []
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunks.append(json.loads(data))
                    if leave and chunks[-1]["choices"][0]["text"]:
                        return "left", None
            text = "".join(ch["choices"][0]["text"] for ch in chunks)
            return "ok", (p, text, chunks[0]["id"], None)

    def client(k: int) -> list:
        return [one(i) for i in range(k, 100, 20)]
    with cf.ThreadPoolExecutor(20) as pool:
        results = [r for rs in pool.map(client, range(20)) for r in rs]
    assert len(results) == 100
    kinds = [k for k, _ in results]
    ok = [v for k, v in results if k == "ok"]
    assert kinds.count("ok") + kinds.count("refused") + kinds.count("left") == 100
    assert kinds.count("ok") >= 20 and kinds.count("left") > 0
    for p, text, _, _ in ok:
        assert text == expected[p], p  # each answer is its own prompt's: nothing crossed or duplicated
    assert len({rid for _, _, rid, _ in ok}) == len(ok)
    wait_until(lambda: not srv.scheduler.busy and srv.scheduler.depth == 0)
    m = srv.metrics()
    assert metric(m, "ssd_edge_requests_total", endpoint=TEXT, status="200") == kinds.count("ok") + kinds.count("left")
    assert metric(m, "ssd_edge_requests_total", endpoint=TEXT, status="503") == kinds.count("refused")
    assert metric(m, "ssd_edge_generations_total", reason="length") == kinds.count("ok")
    assert metric(m, "ssd_edge_generations_total", reason="cancelled") + \
        metric(m, "ssd_edge_generations_total", reason="withdrawn") == kinds.count("left")
    assert metric(m, "ssd_edge_completion_tokens_total") < 12 * kinds.count("ok") + 400 * kinds.count("left")
    wait_until(lambda: ours() <= threads_before)
    gc.collect()
    assert len(jobs) == 0  # no request's state outlives it


# ---------------------------------------------------------------- SIGTERM and Ctrl-C, through the runner

RUNNER = """
import sys, threading
sys.path[:0] = {paths!r}
from {module} import fake_engine
from ssd_edge.settings import resolve
from ssd_edge.cli.signals import terminate_as_interrupt
from ssd_edge.server.runner import serve
with terminate_as_interrupt():
    code = serve(resolve({{"port": 0}}, {{}}), lambda cfg, s: fake_engine(delay=0.01), "fake",
                 lambda line: print(line, file=sys.stderr, flush=True))
print("threads left:", [t.name for t in threading.enumerate()], file=sys.stderr, flush=True)
sys.exit(code)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_server_gracefully_with_exit_0(sig, tmp_path):
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}
    import fakes  # wherever the tests live, the runner imports this file and the fakes as they were found

    paths = [str(Path(__file__).parent), str(Path(fakes.__file__).parent)]
    proc = subprocess.Popen([sys.executable, "-c", RUNNER.format(paths=paths, module=Path(__file__).stem)],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        url, said = None, []
        for line in proc.stderr:
            said.append(line)
            if "serving fake" in line:
                url = line.split(" at ")[1].split("/v1")[0]
                break
        assert url, f"the server did not announce itself (exit {proc.wait(10)}): {''.join(said)[-2000:]}"
        with cf.ThreadPoolExecutor(1) as pool:
            inflight = pool.submit(httpx.post, url + TEXT, json={"prompt": "a", "max_tokens": 900, "mode": "ar"},
                                   timeout=10)
            wait_until(lambda: httpx.get(url + "/health").json()["busy"])
            proc.send_signal(sig)
            r = inflight.result(10)
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        assert proc.wait(15) == 0
        left = proc.stderr.read().split("threads left: ")[1]
        assert "ssd-edge-serve" not in left and "MainThread" in left  # the worker thread was joined
    finally:
        if proc.poll() is None:
            proc.kill()


# ---------------------------------------------------------------- the real small pair

@pytest.mark.real
def test_real_server_with_the_openai_client(small_pair, tmp_path):
    """The console script serves the small real pair; the `openai` client talks to it; greedy
    answers equal `ssd-edge generate`'s on the same prompt and mode; SIGTERM exits 0."""
    from openai import OpenAI

    script = Path(sys.executable).with_name("ssd-edge")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSD_EDGE_") or k in ("SSD_EDGE_HOME",
                                                                                          "SSD_EDGE_MODELS")}
    env["XDG_CONFIG_HOME"] = str(tmp_path)
    flags = ["-m", str(small_pair[0]), "-md", str(small_pair[1]), "-c", "512", "--temp", "0"]
    prompt = "The capital of France is"
    gen = subprocess.run([str(script), "generate", prompt, *flags, "-n", "16", "--mode", "sd", "--json", "-q"],
                         capture_output=True, timeout=300, env=env)
    assert gen.returncode == 0, gen.stderr.decode()
    expected = json.loads(gen.stdout)["text"]
    proc = subprocess.Popen([str(script), "serve", *flags, "--port", "0", "--api-key", "k"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = None
        for line in proc.stderr:
            if line.startswith("serving "):
                url = line.split(" at ")[1].split(" ")[0]
                break
        assert url, "the server did not announce itself"
        client = OpenAI(base_url=url, api_key="k", max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        assert model == small_pair[0].name
        text = client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0,
                                         extra_body={"mode": "sd"})
        assert text.choices[0].text == expected
        assert text.usage.completion_tokens <= 16
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model=model, prompt=prompt, max_tokens=16, temperature=0, stream=True, extra_body={"mode": "sd"}))
        assert streamed == expected
        chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}],
                                              max_tokens=12, seed=5, temperature=0.8)
        again = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}],
                                               max_tokens=12, seed=5, temperature=0.8, extra_body={"mode": "ssd"})
        assert chat.choices[0].message.content == again.choices[0].message.content
        assert chat.model_extra["speculation"]["mode"] == "auto"
        ask = [{"role": "user", "content": "Name three colours."}]
        full = client.chat.completions.create(model=model, messages=ask, max_tokens=24, temperature=0)
        words = full.choices[0].message.content.split()
        assert len(words) >= 3, full
        stop_at = words[2]  # a stop string the greedy answer is known to contain
        chunks = list(client.chat.completions.create(model=model, messages=ask, max_tokens=24, temperature=0,
                                                     stop=[stop_at], stream=True))
        text = full.choices[0].message.content
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text[:text.index(stop_at)]
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        import openai
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], n=99)
        with pytest.raises(openai.AuthenticationError):
            OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
