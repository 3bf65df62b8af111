"""The completion bench's requests (ssd_edge/bench/fim.py) run in-process in one mode, round by round: what
each round proposed, how much of it the target accepted, and what the round took.

    .venv/bin/python scripts/fim_rounds.py -m qwen2.5-coder-1.5b:bf16 -md qwen2.5-coder-0.5b:q4_0 --mode auto \\
        --only 1,4

Each round after the prompt's prints as KIND DRAFTED/ACCEPTED:MS, KIND being the round's proposer: no (a plain step), ng (an
n-gram copy), dr (the draft model), pr (a pre-speculated branch). The warm-ups are not sent, so the extra
chunks are read with each request's prompt. The engine is `ssd-edge bench --fim`'s: -b 1024, --cache-reuse
256, a context of 8192, the given threads for each model.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ssd_edge.bench import fim  # noqa: E402
from ssd_edge.config import EngineConfig  # noqa: E402
from ssd_edge.engine import Engine  # noqa: E402
from ssd_edge.events import FinishEvent, TokenEvent  # noqa: E402
from ssd_edge.infill import Chunk, infill  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("-md", "--model-draft", default="qwen2.5-coder-0.5b:q4_0")
    ap.add_argument("--mode", default="auto")
    ap.add_argument("-t", "--threads", type=int, default=2, help="threads of each model")
    ap.add_argument("-fa", "--flash-attn", choices=("on", "off", "auto"), default="auto")
    ap.add_argument("--cursors", type=int, default=3, help="cursor positions a file (the bench's --fim-cursors)")
    ap.add_argument("--only", default=None, help="comma-separated completion indices (0-based; default: all)")
    args = ap.parse_args()
    only = {int(x) for x in args.only.split(",")} if args.only else None
    model = dict(threads=args.threads, flash_attn=args.flash_attn)
    cfg = EngineConfig.build(target=dict(path=args.model, **model), draft=dict(path=args.model_draft, **model),
                             mode=args.mode, n_ctx=8192, n_batch=1024, cache_reuse=256)
    engine = Engine(cfg)
    try:
        for kind, step in fim.sequence(fim.stdlib_sources(), args.cursors):
            if kind != "fim" or (only is not None and step.index not in only):
                continue
            body = step.body
            extra = [Chunk(c["text"], c["filename"]) for c in body["input_extra"]]
            t0, first, rounds, n = time.perf_counter(), None, [], 0
            for ev in infill(engine, body["input_prefix"], body["input_suffix"], prompt=body["prompt"], extra=extra,
                             max_tokens=body["n_predict"], mode=args.mode):
                if isinstance(ev, TokenEvent):
                    first = first or time.perf_counter()
                    r = ev.round
                    rounds.append(f"{r.speculator[:2]}{r.drafted}/{r.accepted}:{r.wall_ms:.0f}")
                elif isinstance(ev, FinishEvent):
                    n = len(ev.tokens)
            end = time.perf_counter()
            ttft = (first or end) - t0
            print(f"{step.index} {step.file}:{step.row + 1} {n} tokens, first {ttft:.2f} s, then "
                  f"{(end - (first or end)) * 1e3:.0f} ms: {' '.join(rounds[1:])}", flush=True)
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
