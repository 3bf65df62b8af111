"""Decode speed of draft models at each thread count: best of --reps runs of --tokens one-token
decodes after a short code prompt. By default the default draft and its derived Q4_0 variant at 1 and
2 threads: the measurement behind docs/models.md's line on `ssd-edge models derive-draft`.

    .venv/bin/python scripts/draft_speed.py
    .venv/bin/python scripts/draft_speed.py --models qwen2.5-coder-0.5b --threads 1 2 4
"""

from __future__ import annotations

import argparse
import time

PROMPT = "def quicksort(xs):"


def tokens_per_second(model, threads: int, tokens: int, reps: int) -> float:
    from ssd_edge.llama.backend import Context

    ctx = Context(model, 512, 512, threads)
    try:
        prompt = model.tokenize(PROMPT)
        ctx.decode(prompt, range(len(prompt)), [0] * len(prompt), [len(prompt) - 1])
        best = 0.0
        for _ in range(reps):
            ctx.seq_rm(0, len(prompt), -1)
            t0 = time.perf_counter()
            for i in range(tokens):
                ctx.decode([100 + i], [len(prompt) + i], [0], [0])
            best = max(best, tokens / (time.perf_counter() - t0))
        return best
    finally:
        ctx.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b:q4_0"],
                    help="catalog names or GGUF paths (default: the default draft and its Q4_0 variant)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=64, help="one-token decodes per run")
    ap.add_argument("--reps", type=int, default=3, help="runs per model and thread count; the best is shown")
    args = ap.parse_args()

    from ssd_edge.llama.backend import Model
    from ssd_edge.models.catalog import resolve_model

    for name in args.models:
        model = Model(resolve_model(name))
        try:
            for t in args.threads:
                rate = tokens_per_second(model, t, args.tokens, args.reps)
                print(f"{name:28s} threads {t}: {rate:.1f} tok/s (best of {args.reps} x {args.tokens} "
                      "one-token decodes)", flush=True)
        finally:
            model.close()


if __name__ == "__main__":
    main()
