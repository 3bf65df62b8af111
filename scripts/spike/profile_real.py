"""Throwaway spike code for issue 53, part 1: what the real engine and SSD worker spend in Python per round on
the priced pair, to parameterise scripts/spike_draft_side.py. Not production quality.

It runs `ssd-edge bench` in this process with a few methods wrapped (the priced decode, its spin, the engine's
verify, the worker's round) and prints JSON: per-thread CPU (CLOCK_THREAD_CPUTIME_ID, less the CPU of the calls
that drop the lock: the spins and the rows' copies; waits for the lock are not CPU) between the points the spike
models, medians in microseconds, and the wall latency from the verify's start to the worker's first decode.

    python scripts/spike/profile_real.py [bench args, default: --priced h200-1.5b -n 64 -k 8 --modes ssd]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ssd_edge import engine as engine_mod  # noqa: E402
from ssd_edge.bench.priced import backend  # noqa: E402
from ssd_edge.speculation.prespec import worker as worker_mod  # noqa: E402

_spin = backend.spin
_spin_cpu = threading.local()
events: list[tuple] = []  # (thread name, kind, wall, python cpu, extra)


def spin_cpu() -> float:
    return getattr(_spin_cpu, "s", 0.0)


def py_cpu() -> float:
    """This thread's CPU seconds outside the priced spins and row copies (the calls that drop the lock)."""
    return time.thread_time() - spin_cpu()


def spin(seconds, flag=0):
    c0 = time.thread_time()
    try:
        return _spin(seconds, flag)
    finally:
        _spin_cpu.s = spin_cpu() + time.thread_time() - c0


def mark(kind: str, extra=None) -> None:
    events.append((threading.current_thread().name, kind, time.perf_counter(), py_cpu(), extra))


_decode = backend.PricedContext._decode


def decode(self, tokens, positions, seqs, logits_for, extra_s, make):
    mark("dec_in", (self.model.role, len(tokens), len(logits_for)))
    try:
        return _decode(self, tokens, positions, seqs, logits_for, extra_s, make)
    finally:
        mark("dec_out", (self.model.role, len(tokens), len(logits_for)))


_prespec = worker_mod.PrespecWorker._prespec


def prespec(self, round_no, history, draft, policy, sent):
    mark("prespec_in", sent)
    try:
        return _prespec(self, round_no, history, draft, policy, sent)
    finally:
        mark("prespec_out")


_grow = worker_mod.PrespecWorker._grow


def grow(self, branches):
    mark("grow_in", len(branches))
    return _grow(self, branches)


_verify = engine_mod._verify_round  # (the engine's verify round, beside class Engine)


def verify(target_kv, gen, rounds, prop, t_round, threads):
    mark("verify_in", len(prop.draft))
    try:
        return _verify(target_kv, gen, rounds, prop, t_round, threads)
    finally:
        mark("verify_out")


_copy_rows = backend.copy_rows


def copy_rows(*args):
    """The rows' copies drop the lock too (native.c): their CPU is not the interpreter's either."""
    c0 = time.thread_time()
    try:
        return _copy_rows(*args)
    finally:
        _spin_cpu.s = spin_cpu() + time.thread_time() - c0


backend.spin = spin
backend.copy_rows = copy_rows
backend.PricedContext._decode = decode
worker_mod.PrespecWorker._prespec = prespec
worker_mod.PrespecWorker._grow = grow
engine_mod._verify_round = verify


def med(xs):
    return round(statistics.median(xs) * 1e6, 1) if xs else None


def p90(xs):
    return round(sorted(xs)[int(0.9 * (len(xs) - 1))] * 1e6, 1) if xs else None


def analyse() -> dict:
    by_thread: dict[str, list] = {}
    for e in events:
        by_thread.setdefault(e[0], []).append(e)
    eng = by_thread.get("MainThread", [])
    wk = by_thread.get("ssd-draft-worker", [])
    out: dict = {}
    # engine: verify_in -> target dec_in (feed), target decode's own Python (making), dec_out -> next verify_in
    feed, making, post, verify_wall = [], [], [], []
    last_out = None
    for i, e in enumerate(eng):
        if e[1] == "verify_in" and e[4] == 8:
            j = next((j for j in range(i + 1, len(eng)) if eng[j][1] == "dec_in"), None)
            if j is None or eng[j][4][0] != "target" or eng[j][4][1] < 9:
                continue
            feed.append(eng[j][3] - e[3])
            making.append(eng[j + 1][3] - eng[j][3])
            verify_wall.append(eng[j + 1][2] - e[2])
            if last_out is not None:
                post.append(e[3] - last_out[3])
            last_out = eng[j + 1]
        elif e[1] == "verify_in":
            last_out = None
    out["engine_us"] = {"feed_before_decode": med(feed), "target_decode_host": med(making),
                        "between_verifies": med(post), "between_verifies_p90": p90(post),
                        "verify_wall_median": med(verify_wall), "n": len(feed)}
    # worker: prespec_in -> first dec_in (pre_read), its decode's host, -> first branch dec_in (setup), steps
    pre, read_host, setup, lat_first, lat_branch = [], [], [], [], []
    step_py: dict[int, list] = {}
    dec_host: dict[int, list] = {}
    i = 0
    while i < len(wk):
        e = wk[i]
        if e[1] != "prespec_in":
            i += 1
            continue
        sent = e[4]
        j = i + 1
        rnd = []
        while j < len(wk) and wk[j][1] != "prespec_out":
            rnd.append(wk[j])
            j += 1
        decs = [(a, b) for a, b in zip(rnd, rnd[1:]) if a[1] == "dec_in" and b[1] == "dec_out"]
        if decs:
            first_in = decs[0][0]
            pre.append(first_in[3] - e[3])
            read_host.append(decs[0][1][3] - first_in[3])
            lat_first.append(first_in[2] - sent)
            if len(decs) > 1:
                setup.append(decs[1][0][3] - decs[0][1][3])
                lat_branch.append(decs[1][0][2] - sent)
            for (a_in, a_out), (b_in, _) in zip(decs[1:], decs[2:]):
                step_py.setdefault(b_in[4][2], []).append(b_in[3] - a_out[3])
            for a_in, a_out in decs[1:]:
                dec_host.setdefault(a_in[4][2], []).append(a_out[3] - a_in[3])
        i = j
    out["worker_us"] = {"wake_to_read": med(pre), "read_decode_host": med(read_host),
                        "read_to_first_branch": med(setup),
                        "step_between_decodes_by_rows": {r: med(v) for r, v in sorted(step_py.items())},
                        "branch_decode_host_by_rows": {r: med(v) for r, v in sorted(dec_host.items())},
                        "steps_by_rows_n": {r: len(v) for r, v in sorted(step_py.items())},
                        "rounds": len(pre)}
    out["worker_wall_ms"] = {"verify_start_to_read_p50": med(lat_first) and med(lat_first) / 1e3,
                             "verify_start_to_read_p90": p90(lat_first) and p90(lat_first) / 1e3,
                             "verify_start_to_first_branch_p50": med(lat_branch) and med(lat_branch) / 1e3,
                             "verify_start_to_first_branch_p90": p90(lat_branch) and p90(lat_branch) / 1e3}
    return out


def main() -> None:
    from ssd_edge.cli.commands import run

    args = sys.argv[1:] or ["--priced", "h200-1.5b", "-n", "64", "-k", "8", "--modes", "ssd"]
    with tempfile.TemporaryDirectory() as d:
        run(["bench", *args, "-o", d, "--no-plot"])
    print(json.dumps({"argv": args, **analyse()}, indent=1))


if __name__ == "__main__":
    main()
