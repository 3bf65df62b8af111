"""Fill in the middle on the small real pair (SmolLM2-135M), whose vocabulary has no FIM tokens: llama.cpp
finds none (fim_tokens() is None), /infill and /v1/completions' suffix answer a 400 saying so and the server
goes on serving, and `ssd-edge generate --suffix` exits 2 with one line (the default pair, which has them,
fills in the middle in tests/default_pair/test_infill_qwen.py)."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from ssd_edge.server import create_app
from test_cli_real import pair_args, ssd_edge

pytestmark = pytest.mark.real


def test_a_model_without_fim_tokens_is_refused_by_the_server(small_engine):
    assert small_engine.target.fim_tokens() is None
    with TestClient(create_app(small_engine, model_id="small")) as c:
        r = c.post("/infill", json={"input_prefix": "def f(", "input_suffix": "):\n", "n_predict": 4})
        assert r.status_code == 400 and "no fill-in-the-middle tokens" in r.json()["error"]["message"]
        r = c.post("/v1/completions", json={"prompt": "def f(", "suffix": "):\n", "max_tokens": 4})
        assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
        r = c.post("/completion", json={"prompt": "def f(", "n_predict": 4, "mode": "ar"})
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 4


def test_generate_with_a_suffix_on_a_model_without_fim_tokens_exits_2(small_pair):
    p = ssd_edge("generate", "def f(", "--suffix", "):\n", *pair_args(small_pair), "-n", "4", "--mode", "ar")
    err = p.stderr.decode()
    assert p.returncode == 2, err
    assert [ln for ln in err.splitlines() if ln.strip()] == [ln for ln in err.splitlines() if "error:" in ln]
    assert "has no fill-in-the-middle tokens" in err
