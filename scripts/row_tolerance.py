"""How far a target's batched logit rows (what a speculative round verifies with) can differ from its
one-token rows (what ar decodes with), measured over many rows and prompts: the measurement behind
ROW_TOL and TIE_TOL in tests/lossless_check.py.

For each prompt (ssd_edge/data/prompts.jsonl, as chat), the target decodes an answer of --tokens
tokens greedily one token at a time, keeping each one-token row. Then, at every position i of the
answer and for every batch size b in --batches, it decodes the b answer tokens from i in one batch
after the same prefix (the cache keeps the prefix, as in a verify round that accepts everything) and
compares each batched row with the one-token row at the same position. Per row it records

  row diff  max over the vocabulary of |batched - one-token|         (ROW_TOL bounds this)
  gap shift how much the logit gap between the one-token row's top two candidates changes in the
            batched row; a near-tie can flip only when the gap is below its shift, and the gap
            each of the two modes sees is at most the shift (TIE_TOL bounds this)

and writes the distribution (quantiles, max) as JSON, with the tolerances it implies: the largest
value seen times --margin.

    .venv/bin/python scripts/row_tolerance.py --pair small -o row_tolerance_small.json
    .venv/bin/python scripts/row_tolerance.py --pair default --threads 1 2 -o row_tolerance_qwen.json
    .venv/bin/python scripts/row_tolerance.py --pair default --threads 1 --kv q8_0 -o row_tolerance_qwen_q8_0.json

--kv q8_0 or q4_0 quantizes the target's K and V caches (-ctk/-ctv, with flash attention on, which a
quantized V cache needs): a batch writes its cells from its own slightly different values, and the
rounding to 8 or 4 bits can widen the difference, so each cache type has its own tolerances.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib import resources
from pathlib import Path

import numpy as np


def pair_target(pair: str) -> Path:
    if pair == "small":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        import testpair  # the small test pair (tests/testpair.py: SmolLM2-135M), written on first use

        return testpair.ensure_pair()[0]
    from ssd_edge.models import catalog

    cat = catalog.load_catalog()
    return catalog.pull(cat.get(cat.default_target))[0]


def prompts(n: int) -> list[list[dict]]:
    lines = resources.files("ssd_edge").joinpath("data/prompts.jsonl").read_text().splitlines()
    return [json.loads(ln)["messages"] for ln in lines if ln.strip()][:n]


def measure(model, messages, tokens: int, batches: list[int], threads: int, kv: str = "f16"
            ) -> tuple[list[float], list[float]]:
    from ssd_edge.llama.backend import Context
    from ssd_edge.llama.kvseq import KVSeq

    prompt = model.tokenize(model.render_chat(messages), parse_special=True)
    memory = {} if kv == "f16" else dict(cache_type_k=kv, cache_type_v=kv, flash_attn="on")
    ctx = Context(model, len(prompt) + tokens + max(batches) + 8, 512, threads, **memory)
    try:
        kv = KVSeq(ctx)
        row = kv.feed(prompt)[-1]
        answer, one = [], []
        for _ in range(tokens):
            t = int(np.argmax(row))
            if model.is_eog(t):
                break
            answer.append(t)
            one.append(row.copy())  # the one-token row that predicted answer[len(answer) - 1]
            row = kv.step(t)
        row_diff, gap_shift = [], []
        for b in batches:
            for i in range(0, len(answer) - b + 1):
                # rows predicting answer[i .. i+b-1]: fed prompt + answer[:i-1+...]; the batch holds the
                # b tokens before them, answer[i-1 .. i+b-2] (i = 0: the prompt's last token leads)
                full = prompt + answer[:i + b - 1]
                rows = kv.feed(full, b)
                for j in range(b):
                    ref = one[i + j]
                    diff = np.abs(rows[j] - ref)
                    row_diff.append(float(diff.max()))
                    a, c = np.argsort(ref)[-2:][::-1]
                    gap_shift.append(float(abs((ref[a] - ref[c]) - (rows[j][a] - rows[j][c]))))
        return row_diff, gap_shift
    finally:
        ctx.close()


def summary(xs: list[float]) -> dict:
    a = np.asarray(xs)
    return {"n": int(a.size), "max": float(a.max()), "p50": float(np.quantile(a, 0.5)),
            "p99": float(np.quantile(a, 0.99)), "p999": float(np.quantile(a, 0.999)),
            "fraction_nonzero": float((a > 0).mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", choices=("small", "default"), default="small")
    ap.add_argument("--prompts", type=int, default=12, help="how many prompts of ssd_edge/data/prompts.jsonl")
    ap.add_argument("--tokens", type=int, default=32, help="answer tokens per prompt")
    ap.add_argument("--batches", type=int, nargs="+", default=[2, 4, 5], help="batch sizes (a verify of k drafts: k+1)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--kv", choices=("f16", "q8_0", "q4_0"), default="f16",
                    help="the target's KV cache type (-ctk/-ctv; quantized ones with flash attention on)")
    ap.add_argument("--margin", type=float, default=1.5, help="tolerance = margin x the largest value seen")
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args()
    from ssd_edge.llama.backend import Model

    model = Model(pair_target(args.pair))
    out = {"pair": args.pair, "target": str(model.path), "prompts": args.prompts, "tokens": args.tokens, "kv": args.kv,
           "batches": args.batches, "margin": args.margin, "threads": {}}
    t0 = time.perf_counter()
    try:
        for threads in args.threads:
            rd, gs = [], []
            for messages in prompts(args.prompts):
                r, g = measure(model, messages, args.tokens, args.batches, threads, args.kv)
                rd += r
                gs += g
                print(f"threads {threads}: {len(rd)} rows, row diff max {max(rd):.4f}, gap shift max {max(gs):.4f}",
                      file=sys.stderr, flush=True)
            out["threads"][str(threads)] = {"row_diff": summary(rd), "gap_shift": summary(gs)}
    finally:
        model.close()
    worst_row = max(v["row_diff"]["max"] for v in out["threads"].values())
    worst_gap = max(v["gap_shift"]["max"] for v in out["threads"].values())
    out["implied"] = {"ROW_TOL": round(args.margin * worst_row, 3), "TIE_TOL": round(args.margin * worst_gap, 3)}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    args.output.write_text(json.dumps(out, indent=2))
    print(json.dumps(out["implied"]), f"({out['seconds']} s) -> {args.output}")


if __name__ == "__main__":
    main()
