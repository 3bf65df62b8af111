"""The greedy lossless protocol (tests/lossless_check.py) on the default Qwen pair at a quantized KV cache,
over more prompts and tokens than the suite runs: every mode's answer must be ar's, each difference a
near-tie proven by replaying both runs' own rows, within that cache type's tolerances.

    .venv/bin/python scripts/lossless_kv.py --kv q8_0 -n 64
    .venv/bin/python scripts/lossless_kv.py --kv q4_0 -n 64 --modes sd,ssd --prompts fibonacci,history

Both models' K and V caches take --kv (flash attention on, as a quantized V cache needs), one thread
each. First ar's run of every prompt is replayed whole (the replay must reproduce it); then each mode
is compared. Prints one line per mode (compared tokens, ties, drafted/accepted) and exits 1 if any
mode failed the proof.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", choices=("f16", "q8_0", "q4_0"), default="q8_0")
    ap.add_argument("-n", "--tokens", type=int, default=64, help="answer tokens per prompt")
    ap.add_argument("--modes", default="sd,lookup,ssd,auto", help="comma-separated keys of lossless_check.MODES")
    ap.add_argument("--prompts", default=None, help="comma-separated names from tests/prompts.py (default: all)")
    args = ap.parse_args()

    import lossless_check as lc
    from conftest import make_engine
    from prompts import PROMPTS
    from ssd_edge.models import catalog

    names = set(args.prompts.split(",")) if args.prompts else {p.name for p in PROMPTS}
    labels = tuple(args.modes.split(","))
    unknown = [x for x in labels if x not in lc.MODES] + sorted(names - {p.name for p in PROMPTS})
    if unknown:
        ap.error(f"unknown mode or prompt: {', '.join(unknown)}")
    cat = catalog.load_catalog()
    pair = (catalog.pull(cat.get(cat.default_target))[0], catalog.pull(cat.get(cat.default_draft))[0])
    memory = {} if args.kv == "f16" else dict(cache_type_k=args.kv, cache_type_v=args.kv, flash_attn="on")
    t0 = time.perf_counter()
    failed = False
    with make_engine(pair, target=dict(memory), draft=dict(memory)) as eng:
        eng.load_draft()
        plan = lc.Plan(labels, tuple(p for p in PROMPTS if p.name in names), args.tokens)
        tol = lc.tolerance(eng)
        print(f"KV {args.kv}: row tolerance {tol.row}, tie tolerance {tol.tie}; {len(plan.prompts)} prompts x "
              f"{args.tokens} tokens", flush=True)
        ar = lc.ar_runs_for(eng, plan)
        for run in ar.values():
            lc.check_replay_reproduces(eng, run)
        print(f"ar: every run reproduced by its replay ({sum(len(r.out) for r in ar.values())} tokens)", flush=True)
        for label in labels:
            try:
                t = lc.check_mode(eng, label, ar, plan, max_tie_rate=lc.QWEN_MAX_TIE_RATE)
                print(f"{label}: ok, {t.compared} tokens compared, {len(t.ties)} proven near-ties, "
                      f"{t.accepted}/{t.drafted} drafted tokens accepted", flush=True)
            except AssertionError as e:
                failed = True
                print(f"{label}: FAILED: {e}", flush=True)
    print(f"{time.perf_counter() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
