"""Streamed tokens per second through `ssd-edge serve` vs the engine called directly (what
`ssd-edge generate` does), on one prompt and mode, with one engine loaded once.

Runs alternate (direct, served, direct, served, ...) after a warm-up of each, so drift on a
shared machine hits both alike. Both are timed the same way, as a client sees them: the
answer's tokens over the time from the call (tokenizing included) to the last event. Served runs stream over HTTP
from a real uvicorn on 127.0.0.1 (the server's event loop in a thread of this process, the
generation on the scheduler's thread, as in `ssd-edge serve`).

    .venv/bin/python scripts/bench_serve.py -m MODEL.gguf -md DRAFT.gguf --mode sd -n 128 --reps 5
    (without -m/-md: the default pair)

Prints one JSON object: each run's tok/s, the medians, and served / direct.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time

import httpx
import uvicorn

from ssd_edge import settings
from ssd_edge.cli.loader import load_engine, model_label
from ssd_edge.events import FinishEvent
from ssd_edge.server import create_app

PROMPT = "def quicksort(xs):\n    \"\"\"Sort a list of numbers.\"\"\"\n"


def direct(engine, prompt: str, n: int, mode: str) -> float:
    t0 = time.perf_counter()
    tokens = engine.tokenize(prompt, parse_special=True)
    for ev in engine.generate(tokens=tokens, max_tokens=n, mode=mode):
        if isinstance(ev, FinishEvent):
            return len(ev.tokens) / (time.perf_counter() - t0)
    raise AssertionError("no FinishEvent")


def served(url: str, prompt: str, n: int, mode: str, scheduler) -> float:
    tps = _served(url, prompt, n, mode)
    while scheduler.busy:  # the worker closes the generation after its last event: wait before a direct run
        time.sleep(0.001)
    return tps


def _served(url: str, prompt: str, n: int, mode: str) -> float:
    t0 = time.perf_counter()
    body = {"prompt": prompt, "max_tokens": n, "mode": mode, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                chunk = json.loads(line[5:])
                if "speculation" in chunk:  # the last chunk
                    return sum(chunk["speculation"]["tokens_by_source"].values()) / (time.perf_counter() - t0)
    raise AssertionError("the stream ended without its last chunk")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model")
    ap.add_argument("-md", "--model-draft")
    ap.add_argument("--mode", default="auto")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prompt", default=PROMPT)
    a = ap.parse_args()
    s = settings.resolve({"model": a.model, "model_draft": a.model_draft, "temp": 0.0})
    cfg = settings.engine_config(s)
    engine = load_engine(cfg, s)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    app = create_app(engine, model_id=model_label(cfg.target.path))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        direct(engine, a.prompt, a.n, a.mode), served(url, a.prompt, a.n, a.mode, app.state.api.scheduler)  # warm-up
        runs: dict[str, list[float]] = {"direct": [], "served": []}
        for i in range(a.reps):
            order = ("direct", "served") if i % 2 == 0 else ("served", "direct")
            for kind in order:
                tps = direct(engine, a.prompt, a.n, a.mode) if kind == "direct" else served(url, a.prompt, a.n, a.mode, app.state.api.scheduler)
                runs[kind].append(round(tps, 2))
        med = {k: statistics.median(v) for k, v in runs.items()}
        print(json.dumps({"model": cfg.target.path, "draft": cfg.draft.path if cfg.draft else None,
                          "mode": a.mode, "n": a.n, "runs": runs, "median": med,
                          "served_over_direct": round(med["served"] / med["direct"], 4) if med["direct"] else None}))
    finally:
        server.should_exit = True
        thread.join(30)
        engine.close()


if __name__ == "__main__":
    main()
