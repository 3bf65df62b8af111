"""-hf/-hfd with the small real pair served by the stand-in Hub (tests/standin_hub.py): a pull,
a split model that llama.cpp opens at its first shard, an answer, and a mismatched draft refused
before either model is loaded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import standin_hub
from ssd_edge import engine as engine_module

sys.path.insert(0, str(Path(__file__).parents[1] / "faces"))
from test_cli import run  # noqa: E402  (the faces' runner of `ssd-edge ARGS`)


@pytest.fixture(scope="module")
def served(small_pair, tmp_path_factory):
    from ssd_edge import paths

    repos = standin_hub.pair_repos(paths.home() / "test-models" / "standin-hub")
    with standin_hub.Serving(standin_hub.Hub(repos)) as s:
        yield s


@pytest.fixture
def hub_env(served, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", served.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("SSD_EDGE_MODELS", str(tmp_path / "models"))
    for key in ("HF_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    return served


def test_generate_answers_with_a_hub_pair_then_offline(hub_env, monkeypatch):
    args = ["generate", "-hf", f"{standin_hub.TARGET_REPO}:Q4_1", "-hfd", standin_hub.DRAFT_REPO, "-n", "12",
            "--mode", "sd", "--temp", "0", "--no-calibrate", "def fib(n):"]
    code, out, err = run(args)
    assert code == 0, err
    assert len(out.strip()) > 0 and "12 tokens" in err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_env.hub.requests.clear()
    code, again, err = run(args)
    assert code == 0 and again == out, err  # greedy: the same answer, from the cache, with no request
    assert hub_env.hub.requests == []


def test_a_split_model_runs_from_its_first_shard(hub_env):
    code, out, err = run(["generate", "-hf", f"{standin_hub.SPLIT_REPO}:q4_1", "--no-draft", "--mode", "ar", "-n", "8",
                          "--temp", "0", "def fib(n):"])
    assert code == 0 and out.strip(), err


def test_a_mismatched_draft_is_refused_before_loading(hub_env, monkeypatch):
    loaded = []
    monkeypatch.setattr(engine_module, "Engine", lambda *a, **k: loaded.append(a))
    code, _, err = run(["generate", "-hf", f"{standin_hub.TARGET_REPO}:Q4_1", "-hfd", standin_hub.OTHER_VOCAB_REPO,
                        "hi"])
    assert code == 3 and loaded == []
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: draft SmolLM2-135M-othervocab-Q4_1.gguf (smollm vocabulary of 49,152 tokens #")
    assert "does not fit target SmolLM2-135M-Instruct-Q4_1.gguf (smollm vocabulary of 49,152 tokens #" in line
