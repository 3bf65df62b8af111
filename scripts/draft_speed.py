"""Decode speed of the default draft and its derived Q4_0 variant at 1 and 2 threads (best of 3 x 64
one-token decodes each): the measurement behind the README line on `ssd-edge models derive-draft`.

    .venv/bin/python scripts/draft_speed.py
"""
import sys, time
from ssd_edge.llama.backend import Model, Context
from ssd_edge.models.catalog import resolve_model
for name in ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b:q4_0"):
    m = Model(resolve_model(name))
    for t in (1, 2):
        ctx = Context(m, 512, 512, t)
        toks = m.tokenize("def quicksort(xs):")
        ctx.decode(toks, range(len(toks)), [0]*len(toks), [len(toks)-1])
        best = 0
        for rep in range(3):
            ctx.seq_rm(0, len(toks), -1)
            t0 = time.perf_counter()
            for i in range(64):
                ctx.decode([100 + i], [len(toks) + i], [0], [0])
            best = max(best, 64 / (time.perf_counter() - t0))
        print(f"{name:28s} threads {t}: {best:.1f} tok/s (best of 3 x 64 one-token decodes)", flush=True)
        ctx.close()
    m.close()
