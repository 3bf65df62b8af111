"""The editors' endpoints on the fake backend, what goes wrong: a 400 naming each bad field (the server then
answering the next request), a model without FIM tokens refused, and a client that drops its request (a
completion, a warm-up, a stream) stopping the generation (real uvicorn)."""

from __future__ import annotations

import httpx
import pytest

from ssd_edge.server import create_app
from test_serve import Live, fake_engine, metric, wait_until
from test_serve_infill import VIM_WARMUP, fim_engine, served, two_cores  # noqa: F401  (fixtures)


# ---------------------------------------------------------------- bad requests

BAD = [
    ("/infill", {"input_suffix": ""}, "input_prefix"),
    ("/infill", {"input_prefix": ""}, "input_suffix"),
    ("/infill", {"input_prefix": "", "input_suffix": "", "input_extra": {"text": "x"}}, "input_extra"),
    ("/infill", {"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a.py"}]}, "input_extra.0.text"),
    ("/infill", {"input_prefix": "", "input_suffix": "", "input_extra": ["x"]}, "input_extra.0"),
    ("/infill", {"input_prefix": "", "input_suffix": "", "input_extra": [{"text": 3}]}, "input_extra.0.text"),
    ("/infill", {"input_prefix": "", "input_suffix": "", "n_predict": -5}, "n_predict"),
    ("/infill", {"input_prefix": "", "input_suffix": "", "n_indent": -1}, "n_indent"),
    ("/infill", {"input_prefix": "", "input_suffix": "", "t_max_predict_ms": -1}, "t_max_predict_ms"),
    ("/infill", {"input_prefix": "", "input_suffix": "", "samplers": ["top_k", "mirostat9"]}, "samplers"),
    ("/infill", {"input_prefix": "", "input_suffix": "", "prompt": 3}, "prompt"),
    ("/infill", {"input_prefix": 1, "input_suffix": ""}, "input_prefix"),
    ("/infill", {"input_prefix": "", "input_suffix": "", "top_p": 0}, "top_p"),
    ("/infill", {"input_prefix": "", "input_suffix": "", "mode": "fast"}, "mode"),
    ("/infill", {"input_prefix": "", "input_suffix": "", "n_cmpl": 0}, "n_cmpl"),
    ("/infill", {"input_prefix": "", "input_suffix": "", "n_cmpl": 2, "stream": True}, "n_cmpl"),
    ("/completion", {"prompt": "a", "repeat_penalty": 1.1}, "repeat_penalty"),
    ("/completion", {"prompt": "a", "mirostat": 2}, "mirostat"),
    ("/completion", {"prompt": "a", "ignore_eos": True}, "ignore_eos"),
    ("/infill", {"input_prefix": "", "input_suffix": "", "n_probs": 5}, "n_probs"),
    ("/completion", {"n_predict": 3}, "prompt"),
    ("/completion", {"prompt": [1, 99]}, "prompt"),
    ("/completion", {"prompt": ""}, "prompt"),
    ("/v1/completions", {"prompt": [1, 2], "suffix": "x"}, "suffix"),
]


@pytest.mark.parametrize("path, body, param", BAD, ids=[f"{p}-{param}" for p, _, param in BAD])
def test_each_bad_field_is_a_400_naming_it_and_the_server_goes_on(served, path, body, param):
    c = served(fim_engine())
    r = c.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
    assert c.post("/infill", json={"input_prefix": "a", "input_suffix": "b", "n_predict": 2}).status_code == 200


def test_llama_servers_other_fields_pass_at_their_neutral_values(served):
    c = served(fim_engine())
    neutral = {"repeat_penalty": 1.0, "mirostat": 0, "typical_p": 1, "dry_multiplier": 0.0, "xtc_probability": 0,
               "top_n_sigma": -1, "ignore_eos": False, "n_probs": 0, "penalty_last_n": 0, "mirostat_tau": 5.0}
    assert c.post("/completion", json={"prompt": "a", "n_predict": 2, **neutral}).status_code == 200


def test_a_model_without_fim_tokens_is_a_400_saying_so(served):
    c = served(fake_engine())
    r = c.post("/infill", json={"input_prefix": "a", "input_suffix": "b"})
    assert r.status_code == 400 and "no fill-in-the-middle tokens" in r.json()["error"]["message"]
    r = c.post("/v1/completions", json={"prompt": "a", "suffix": "b"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    assert c.post("/completion", json={"prompt": "a", "n_predict": 2}).status_code == 200  # no FIM needed there


# ---------------------------------------------------------------- a client that goes away

def test_a_dropped_infill_stops_its_generation():
    srv = Live(create_app(fim_engine(delay=0.01), model_id="fake"))
    try:
        with pytest.raises(httpx.ReadTimeout):  # 900 tokens in mode ar would take 9 s
            httpx.post(srv.url + "/infill", json={"input_prefix": "a", "input_suffix": "b", "n_predict": 900,
                                                  "mode": "ar"}, timeout=0.5)
        wait_until(lambda: not srv.scheduler.busy)  # the limit only stops a hang
        m = srv.metrics()
        assert metric(m, "ssd_edge_generations_total", reason="cancelled") == 1
        assert metric(m, "ssd_edge_completion_tokens_total") < 900
    finally:
        srv.stop()


def test_a_dropped_warm_up_stops_between_prompt_batches():
    srv = Live(create_app(fim_engine(delay=0.05), model_id="fake"))  # 64 tokens a batch, 50 ms each
    try:
        long = [{"text": "x" * 1500, "filename": "big.py"}]  # ~24 batches: over a second
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/infill", json={**VIM_WARMUP, "input_extra": long}, timeout=0.3)
        wait_until(lambda: not srv.scheduler.busy)
        assert metric(srv.metrics(), "ssd_edge_generations_total", reason="cancelled") == 1
        assert srv.app.state.api.engine.target_ctx.decodes < 20  # stopped well before the prompt's end
    finally:
        srv.stop()


def test_a_stream_dropped_mid_answer_stops_its_generation():
    srv = Live(create_app(fim_engine(delay=0.01), model_id="fake"))
    try:
        with httpx.Client(timeout=30) as client:
            with client.stream("POST", srv.url + "/infill", json={"input_prefix": "a", "input_suffix": "b",
                                                                  "n_predict": 900, "mode": "ar", "stream": True}) as r:
                first = next(line for line in r.iter_lines() if line.startswith("data:"))
        assert '"stop": false' in first  # one chunk read, then the connection closed
        wait_until(lambda: not srv.scheduler.busy)
        m = srv.metrics()
        assert metric(m, "ssd_edge_generations_total", reason="cancelled") == 1
        assert metric(m, "ssd_edge_completion_tokens_total") < 900
    finally:
        srv.stop()
