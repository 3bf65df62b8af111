"""Time the target's decode steps locally and over llama.cpp's RPC backend (docs/rpc.md).

    python scripts/rpc_step_cost.py -m MODEL -t 1                          # local, 1 thread
    python scripts/rpc_step_cost.py -m MODEL -t 1 --no-repack              # local, the server's weight layout
    python scripts/rpc_step_cost.py -m MODEL --rpc 127.0.0.1:50052         # every layer on the server

After a short prompt, each batch size is decoded `--steps` times at the end of the sequence (and
rolled back), as a plain step (1 token) and a verify (k+1 tokens) do. Prints the median and the
quartiles in ms, and the bytes of logits each step brings back (with --rpc they cross the network).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from ssd_edge.llama.backend import Context, Model

PROMPT = "def quicksort(xs):\n    \"\"\"Sort a list of numbers.\"\"\"\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--rpc", default=None, help="HOST:PORT[,...]")
    ap.add_argument("-t", "--threads", type=int, default=1, help="local threads (with --rpc: the client's)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", default="1,4", help="batch sizes, comma-separated")
    ap.add_argument("--no-repack", action="store_true", help="local weights in the plain CPU layout, as an "
                    "rpc-server's CPU device keeps them (so local vs RPC differ by the hop alone)")
    a = ap.parse_args()
    rpc = a.rpc.split(",") if a.rpc else []
    model = Model(a.model, n_gpu_layers=-1 if rpc else 0, rpc=rpc, repack=not a.no_repack)
    ctx = Context(model, 512, threads=a.threads)
    prompt = model.tokenize(PROMPT)
    ctx.decode(prompt, list(range(len(prompt))), [0] * len(prompt), [len(prompt) - 1])
    n0 = len(prompt)
    out = {"model": model.path.name, "rpc": a.rpc, "threads": a.threads, "repack": not a.no_repack,
           "steps": a.steps, "batches": {}}
    for n in (int(x) for x in a.batch.split(",")):
        toks = (prompt * n)[:n]
        times = []
        for i in range(a.steps + 2):
            t0 = time.perf_counter()
            ctx.decode(toks, list(range(n0, n0 + n)), [0] * n, list(range(n)))  # every row, as a verify wants
            dt = (time.perf_counter() - t0) * 1e3
            ctx.seq_rm(0, n0, -1)
            if i >= 2:  # two warm-up steps
                times.append(dt)
        q = statistics.quantiles(times, n=4)
        out["batches"][n] = {"median_ms": round(statistics.median(times), 2), "q1_ms": round(q[0], 2),
                             "q3_ms": round(q[2], 2), "logits_bytes": n * model.n_vocab * 4}
        print(f"batch {n}: median {statistics.median(times):.2f} ms (quartiles {q[0]:.2f}-{q[2]:.2f}), "
              f"logits {n * model.n_vocab * 4 / 1e3:.0f} kB", flush=True)
    print(json.dumps(out))
    ctx.close()
    model.close()


if __name__ == "__main__":
    main()
