"""Documented features that no other test exercised, each with a test that fails when the feature is
removed: the server's max_completion_tokens, per-request top_k and min_p, --max-body (the flag),
the ssd_edge_generation_seconds_total metric (docs/server.md); --rpc reaching chat, serve and the
TUI (docs/rpc.md); models derive-draft --type (docs/models.md). On the fake backend (tests/fakes.py)
and the CLI's own entry point; the first test checks that the pages still document them."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from ssd_edge.settings import resolve
from ssd_edge.server import create_app
from ssd_edge.server.runner import options
from test_cli import clean_env, one_error, run  # noqa: F401  (clean_env: an autouse fixture)
from test_serve import client, fake_engine, metric  # noqa: F401  (client: test_serve's fixture)

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "count"}]
DOCS = Path(__file__).resolve().parents[2] / "docs"

# The page that documents each feature tested below, and the words it documents it by.
DOCUMENTED = {
    "server.md": ["`max_completion_tokens`", "`top_k`", "`min_p`", "`--max-body`",
                  "`ssd_edge_generation_seconds_total`"],
    "rpc.md": ["works in `generate`, `chat`, `tui`, `serve` and `bench`"],
    "models.md": ["`ssd-edge models derive-draft`", "`--type q4_1|q8_0`"],
}


@pytest.mark.parametrize("page", sorted(DOCUMENTED))
def test_the_pages_document_the_features_tested_here(page):
    text = " ".join((DOCS / page).read_text().split())  # a phrase may wrap across lines
    missing = [words for words in DOCUMENTED[page] if words not in text]
    assert not missing, f"docs/{page} no longer documents {missing}: move the test with the text"


def test_max_completion_tokens_caps_the_answer_and_wins_over_max_tokens(client):
    r = client.post(CHAT, json={"messages": MESSAGES, "max_completion_tokens": 5, "max_tokens": 40})
    assert r.status_code == 200
    body = r.json()
    assert body["usage"]["completion_tokens"] == 5 and body["choices"][0]["finish_reason"] == "length"


def test_per_request_top_k_and_min_p_shape_the_sample(client):
    """At temperature 1.5 and one seed the sample differs from the greedy answer; top_k 1, or a min_p
    that keeps only the likeliest token, turns the same request into the greedy answer."""
    base = {"messages": MESSAGES, "max_tokens": 24, "temperature": 1.5, "seed": 3, "top_p": 1.0}
    text = lambda **kw: client.post(CHAT, json={**base, **kw}).json()["choices"][0]["message"]["content"]
    greedy = client.post(CHAT, json={**base, "temperature": 0}).json()["choices"][0]["message"]["content"]
    assert text(top_k=0, min_p=0.0) != greedy
    assert text(top_k=1, min_p=0.0) == greedy
    assert text(top_k=0, min_p=0.9) == greedy  # the fake's runner-up has e^-1.5 (0.22) of the top's mass


def test_max_body_flag_reaches_the_server(tmp_path):
    assert options(resolve({"max_body": 2048}, {}))["max_body"] == 2048
    code, _, err = run(["serve", "-m", str(tmp_path / "t.gguf"), "--max-body", "100"])
    assert code == 2 and "--max-body" in one_error(err) and "at least 1024" in err
    with TestClient(create_app(fake_engine(), model_id="fake", max_body=2048)) as c:
        small = c.post(CHAT, json={"messages": MESSAGES, "max_tokens": 2})
        big = c.post(CHAT, json={"messages": [{"role": "user", "content": "x" * 3000}], "max_tokens": 2})
    assert small.status_code == 200
    assert big.status_code == 413 and "--max-body" in big.json()["error"]["message"]


def test_generation_seconds_metric_counts_the_generations_time(client):
    def seconds() -> float:
        return metric(client.get("/metrics").text, "ssd_edge_generation_seconds_total")

    assert seconds() == 0
    client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 8})
    after_one = seconds()
    assert after_one > 0
    client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 8})
    assert seconds() > after_one  # a counter: it grows with each generation


def closed_port_and_gguf(tmp_path) -> tuple[int, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends
    gguf = tmp_path / "t.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    return port, str(gguf)


@pytest.mark.parametrize("command", ["chat", "serve"])
def test_rpc_reaches_chat_and_serve(command, tmp_path):
    """--rpc on each face: the endpoint is probed before llama.cpp loads (a closed port: exit 7
    naming it), so the option reached the face's engine config."""
    from ssd_edge.errors import RPCError

    port, gguf = closed_port_and_gguf(tmp_path)
    code, out, err = run([command, "-m", gguf, "--no-draft", "--no-calibrate", "--rpc", f"127.0.0.1:{port}"],
                         input="")
    assert code == RPCError.exit_code, err
    assert f"rpc server 127.0.0.1:{port} is unreachable" in err


def test_rpc_reaches_the_tui(tmp_path, monkeypatch):
    """`ssd-edge tui --rpc`: the app loads its engine in a worker, so the probe's failure is the app's
    load error (shown in the status line, the app stays up) and, once the user quits, exit code 7.
    The real app, run headless by the real command, with a pilot that waits for the error and quits."""
    from textual.app import App

    from ssd_edge.errors import RPCError
    from tui.app import SSDEdgeApp

    port, gguf = closed_port_and_gguf(tmp_path)
    shown = []

    async def user(pilot):
        app = pilot.app
        for _ in range(500):  # the load worker fails at once; 10 s at most
            if app.phase == "failed":
                break
            await pilot.pause(0.02)
        shown.append(str(app.query_one("#status").render()))
        await pilot.press("ctrl+q")

    real_run = App.run
    monkeypatch.setattr(SSDEdgeApp, "run", lambda self, **kw: real_run(self, headless=True, auto_pilot=user))
    # the app, mounted on this (the test process's main) thread, would lower it for good (tui/cores.py)
    monkeypatch.setattr("tui.app.yield_to_the_engine", lambda *threads: "left as it is (a test)")
    code, _, err = run(["tui", "-m", gguf, "--no-draft", "--no-calibrate", "--rpc", f"127.0.0.1:{port}"], tty=True)
    assert shown and f"rpc server 127.0.0.1:{port} is unreachable" in shown[0], shown
    assert code == RPCError.exit_code, err


def test_derive_draft_type_is_checked_and_named(tmp_path):
    from ssd_edge.models import catalog

    code, _, err = run(["models", "derive-draft", "--type", "q9_9", "--models-dir", str(tmp_path)])
    assert code != 0 and one_error(err) == f"error: --type: choose one of {', '.join(catalog.DERIVED_KINDS)}"
