"""Fill in the middle on the small real pair (SmolLM2-135M), whose vocabulary has no FIM tokens: llama.cpp
finds none (fim_tokens() is None), /infill and /v1/completions' suffix answer a 400 saying so and the server
goes on serving, and `ssd-edge generate --suffix` exits 2 with one line (the default pair, which has them,
fills in the middle in tests/default_pair/test_infill_qwen.py). And --cache-reuse's move on a real cache
(llama_memory_seq_add): the cache then holds the new sequence at the right positions, and its next row is
close to a cold read's (the moved keys were computed beside tokens that are gone: not equal)."""

from __future__ import annotations

import numpy as np
import pytest
from starlette.testclient import TestClient

from ssd_edge.llama.backend import Context
from ssd_edge.llama.kvseq import KVSeq
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


def test_a_chunk_moved_on_a_real_cache(small_engine):
    model = small_engine.target
    text = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(12))
    first = model.tokenize(text)
    second = first[:1] + first[30:] + model.tokenize("def g(", add_special=False)
    ctx, cold = Context(model, 512, 64, 1), Context(model, 512, 64, 1)
    try:
        assert ctx.can_shift()
        kv = KVSeq(ctx)
        kv.reuse = 16
        kv.feed(first)
        assert kv.held_for(second) == len(first) - 29
        moved = np.array(kv.feed(second, 1)[-1])
        assert list(kv.tokens) == second and ctx.seq_pos_max(0) == len(second) - 1
        fresh = np.array(KVSeq(cold).feed(second, 1)[-1])
        print(f"moved vs cold: max |logit difference| {np.abs(moved - fresh).max():.3f}, "
              f"top token {int(moved.argmax())} vs {int(fresh.argmax())}")
        assert np.isfinite(moved).all() and np.abs(moved - fresh).max() < 0.5 * np.abs(fresh).max()
    finally:
        ctx.close()
        cold.close()
