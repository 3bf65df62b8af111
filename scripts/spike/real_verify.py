"""Throwaway spike code for issue 53, part 1: the real engine's verify time on the priced pair, per round, with
nothing beside it (mode sd) and with SSD's worker beside it (mode ssd, split by what it grew: one branch, a
tree), to hold scripts/spike_draft_side.py's `thread` variant against. Not production quality.

Interleaves sd and ssd generations (-n tokens each, greedy, k=8), keeps the rounds that verified a full draft
(8 tokens), and prints JSON: per mode and `beside`, the rounds, verify ms mean / p50 / p90, the means over
sd's, and the mean wall and CPU time of the engine's own Rounds.verifying inside the verify (ssd: the tree's
shape, the policy's snapshot and the worker's message, before the decode starts). Each round's run delay (the
engine thread waiting for a core, /proc schedstat) lets the rounds where another process had the core be left
out (--quiet-ms).

    python scripts/spike/real_verify.py [--reps 4] [-n 256] [--quiet-ms 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ssd_edge import engine as engine_mod  # noqa: E402
from ssd_edge.bench import priced  # noqa: E402
from ssd_edge.config import EngineConfig  # noqa: E402
from ssd_edge.events import TokenEvent  # noqa: E402
from ssd_edge.planning import planner as planner_mod  # noqa: E402

PROMPTS = ["def fib(n):", "Write a short story about a lighthouse keeper.", "Translate to French: good morning",
           "Explain the GIL in one paragraph."]

_delay: list[float] = []  # the engine thread's run delay in its last verify, seconds
_verify = engine_mod._verify_round  # (the engine's verify round, beside class Engine)


def _run_delay() -> float:
    with open(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


def verify(target_kv, gen, rounds, prop, t_round, threads):
    d0 = _run_delay()
    try:
        return _verify(target_kv, gen, rounds, prop, t_round, threads)
    finally:
        _delay.append(_run_delay() - d0)


engine_mod._verify_round = verify

_planning: list[float] = []  # the engine's Rounds.verifying (ssd: the tree's shape, the policy, the message), s
_rounds_verifying = planner_mod.Rounds.verifying


_planning_cpu: list[float] = []  # the same, this thread's CPU (without waits for the lock), s


def rounds_verifying(self, history, draft):
    t, c = time.perf_counter(), time.thread_time()
    try:
        return _rounds_verifying(self, history, draft)
    finally:
        _planning.append(time.perf_counter() - t)
        _planning_cpu.append(time.thread_time() - c)


planner_mod.Rounds.verifying = rounds_verifying


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--table", default="h200-1.5b")
    ap.add_argument("--quiet-ms", type=float, default=1.0)
    a = ap.parse_args()
    eng = priced.engine(EngineConfig.build(target=dict(path="priced"), mode="ssd", spec=dict(k=a.k)), a.table)
    got: dict[str, list[tuple[float, float]]] = {}
    for rep in range(a.reps):
        for mode in (("sd", "ssd") if rep % 2 == 0 else ("ssd", "sd")):
            for prompt in PROMPTS:
                for ev in eng.generate(prompt, max_tokens=a.n, mode=mode):
                    if isinstance(ev, TokenEvent) and ev.round.drafted == a.k:
                        key = mode if mode == "sd" else f"ssd beside={min(ev.round.beside, 2)}"
                        got.setdefault(key, []).append((ev.round.verify_ms, _delay[-1] * 1e3, _planning[-1] * 1e3,
                                                            _planning_cpu[-1] * 1e3))
    out = {"command": "python scripts/spike/real_verify.py " + " ".join(sys.argv[1:]),
           "priced_verify_ms": priced.TABLES[a.table].target.ms(a.k + 1)}
    base = {}
    for quiet in (False, True):
        part = {}
        for key, xs in sorted(got.items()):
            kept = [(x, pl, pc) for x, d, pl, pc in xs if not quiet or d < a.quiet_ms]
            if not kept:
                continue
            v = sorted(x for x, _, _ in kept)
            part[key] = {"rounds": len(v), "mean": round(statistics.fmean(v), 3), "p50": round(v[len(v) // 2], 3),
                         "p90": round(v[int(0.9 * (len(v) - 1))], 3),
                         # the engine's own planning and message inside the verify's time (no lock waits: the
                         # worker is at rest before the message)
                         "planning_ms_mean": round(statistics.fmean(pl for _, pl, _ in kept), 3),
                         "planning_cpu_ms_mean": round(statistics.fmean(pc for _, _, pc in kept), 3)}
            if key == "sd":
                base[quiet] = part[key]["mean"]
        for key in part:
            if quiet in base:
                part[key]["mean_over_sd"] = round(part[key]["mean"] / base[quiet], 3)
        out["quiet rounds (run delay < %g ms)" % a.quiet_ms if quiet else "all rounds"] = part
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
