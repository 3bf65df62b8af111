"""llama.cpp's backend sampling against ssd-edge's host pass, on plain greedy steps of the default target.

    .venv/bin/python scripts/backend_sampling.py --threads 2 --steps 48 --reps 2

Backend sampling (llama.h: llama_set_sampler, then llama_get_sampled_candidates_ith / _logits_ith) runs
a sampler chain inside llama_decode's graph and hands back only its candidates; here a top-k of 40, as
ssd-edge's default sampling keeps. The host path is ssd-edge's: llama_get_logits_ith's row of the whole
vocabulary, its top-k read in one pass (sampling.top_ids, in C where built). Each step decodes one
token; the script times llama_decode and the read after it separately, checks that both paths choose
the same tokens (the argmax of the 40 candidates), and prints both. The pinned llama.cpp serves at
most one output per sequence this way, so a verify batch (k + 1 rows) cannot use it at all.
"""

from __future__ import annotations

import argparse
import sys
import time


def run(model, threads: int, steps: int, backend: bool) -> tuple[list[int], float, float]:
    """(tokens, ms per llama_decode, ms per read of the step's token) over `steps` greedy steps."""
    import numpy as np

    from ssd_edge.llama.backend import Context
    from ssd_edge.llama.library import ll
    from ssd_edge.sampling import top_ids

    ctx = Context(model, 1024, 512, threads)
    try:
        if backend:
            chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_k(40))
            if not ll.llama_set_sampler(ctx.ptr, 0, chain):
                raise SystemExit("llama_set_sampler refused the chain: this llama.cpp has no backend sampling")

        def token(i: int) -> int:
            if backend:
                n = ll.llama_get_sampled_candidates_count_ith(ctx.ptr, i)
                ids = np.ctypeslib.as_array(ll.llama_get_sampled_candidates_ith(ctx.ptr, i), shape=(n,))
                logits = np.ctypeslib.as_array(ll.llama_get_sampled_logits_ith(ctx.ptr, i), shape=(n,))
                return int(ids[np.argmax(logits)])
            row = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx.ptr, i), shape=(model.n_vocab,))
            ids = top_ids(row, 40)
            return int(ids[np.argmax(row[ids])])

        prompt = model.tokenize("def quicksort(items):\n", add_special=True)
        ctx.decode(prompt, range(len(prompt)), [0] * len(prompt), [len(prompt) - 1])
        out = [token(len(prompt) - 1)]
        decode_s = read_s = 0.0
        b = ctx._batch
        for pos in range(len(prompt), len(prompt) + steps):
            t0 = time.perf_counter()
            b.n_tokens, b.token[0], b.pos[0], b.n_seq_id[0], b.seq_id[0][0], b.logits[0] = 1, out[-1], pos, 1, 0, 1
            rc = ll.llama_decode(ctx.ptr, b)
            t1 = time.perf_counter()
            if rc != 0:
                raise SystemExit(f"llama_decode returned {rc}")
            out.append(token(0))
            read_s += time.perf_counter() - t1
            decode_s += t1 - t0
        return out, decode_s / steps * 1e3, read_s / steps * 1e3
    finally:
        ctx.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--reps", type=int, default=2, help="passes, each running both paths in turn")
    args = ap.parse_args()
    from ssd_edge.llama.backend import Model
    from ssd_edge.models import catalog
    from ssd_edge.settings import model_pair

    model = Model(catalog.resolve_model(model_pair(None, None, None)[0], None))
    try:
        answers = {}
        for _ in range(args.reps):
            for backend in (False, True):
                out, decode_ms, read_ms = run(model, args.threads, args.steps, backend)
                name = "backend" if backend else "host"
                answers.setdefault(name, out)
                print(f"{name:8s} llama_decode {decode_ms:.3f} ms a step, reading its token {read_ms:.4f} ms", flush=True)
    finally:
        model.close()
    same = answers["host"] == answers["backend"]
    print("the same tokens on both paths" if same else "the paths chose different tokens")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
