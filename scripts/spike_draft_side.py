"""Spike for issue 53, part 1: where SSD's draft side should run so the target's verify does not wait for the
interpreter lock. Throwaway measurement code (with scripts/spike/: draft_side.c, compiled here with cc and loaded
by ctypes, and its helpers): not production quality, not used by the package.

It reproduces the round structure of `ssd` on the priced H200 1.5B pair (prices from
ssd_edge/bench/priced/prices.py), with the host work of each step taken from the real code
(scripts/spike/profile_real.py's medians, the defaults below), and no model:

  engine (main thread)  Python before the verify; the verify: post "verifying", the feed's Python, a priced
                        decode of k+1 tokens (as PricedContext._decode: spin with the lock released; the rows
                        made near its end, Python, their copy in C with the lock released, Python; spin the
                        rest); a lookup (the round's branches complete, or the draft side's decode aborted)
  draft side            per verify: its host work to the first decode, the first decode (the read of the last
                        draft token, one row), the ranking and setup, then `depth` branch steps (host work, then a
                        decode priced by its rows, heads only: `width` rows for `short` steps, then the deepest
                        branch alone)

Variants (where the draft side runs; the work it does is the same in each):
  alone         no draft side: the verify's time alone (the slowdown's denominator)
  thread        today: a Python thread, woken by a queue.SimpleQueue; host work as Python bytecode
  thread-si     the same with sys.setswitchinterval(0.0002)
  native-spin   (a) a C thread (pthread): waits spinning on a shared word (5 ms, then a futex); its host work the
                same time, in C (no interpreter)
  native-futex  (a) the same, asleep on the futex at once
  proc-spin     (b) a child process (fork) running the Python draft loop in its own interpreter, waiting on the
                shared word in shared memory (spin 5 ms, then a futex)
  proc-pipe     (b) the same, woken through a pipe (a blocking read)

Per run: the verify's mean (verify_slowdown: over the median of the `alone` runs' means), the first decode's
start after the verify's start (p50, p90), the rounds whose branches were complete at lookup, the round's time,
CPU seconds per wall second (parent and child). Per round, the longest time either side waited for a core
during the verify (/proc schedstat's run delay): the host is shared, and a quiet round is one where neither
waited longer than --quiet-ms (the second table pools those). Runs are interleaved, the variants shuffled
each repetition.

    python scripts/spike_draft_side.py --reps 2 --rounds 100 [--width 9 --short 3] -o spike.json
    python scripts/spike_draft_side.py --merge spike*.json      # the runs of several outputs together
    python scripts/spike_draft_side.py --rtt 2000 --reps 3      # a call's round trip: thread, pipe, shared word
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import queue
import random
import select
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "spike"))
from common import CAP, TABLES, Ctl, RunDelay, build_lib, calibrate, pyburn  # noqa: E402
from rtt import measure_rtt  # noqa: E402
from summary import report  # noqa: E402

MAKING_MARGIN_S = 20e-6  # as the priced backend: rows made 2x their time + this before the price is up

# Host work (us) under the interpreter's lock: medians of two runs of scripts/spike/profile_real.py (ssd-edge bench
# --priced h200-1.5b -n 64 -k 8 --modes ssd, 2 vCPUs, 2a9a847), rounded; CLI flags override.
DEFAULTS = dict(
    eng_before=450.0,     # engine Python between one verify's end and the next one's start (draws, commit, planner)
    eng_feed=150.0,       # engine Python from the verify's start to its decode's wait (verifying(), the feed)
    eng_making=170.0,     # the target decode's host part under the lock (cells stored, rows' choices and peaks);
                          # its rows' copy (below) in the middle of it, the lock released
    pre_read=25.0,        # draft side: message taken to the first decode's start
    read_making=65.0,     # the first decode's host part
    post_read=220.0,      # ranking and branch setup
    step_py=27.0,         # Python between two one-row branch decodes
    step_making=50.0,     # a one-row branch decode's host part
)
COPY_US_PER_ROW = 13.4   # native copy_rows of a 151,936-float row: 13.6 us for one, 120 for nine (p50, this host)
STEP_PY_PER_ROW = 3.0      # us more a row: 50 at 9 rows
STEP_MAKING_PER_ROW = 7.0  # us more a row: 108 at 9 rows


class Plan:
    """The round's prices and host work, in seconds and loop iterations."""

    def __init__(self, a: argparse.Namespace, py_per_us: float, c_per_us: float) -> None:
        table = TABLES[a.table]
        self.verify_s = table.target.ms(a.k + 1) / 1e3
        self.read_s = table.draft.ms(1) / 1e3
        self.depth, self.width, self.short = a.depth, a.width, min(a.short, a.depth)
        self.rows = [a.width if d < self.short else 1 for d in range(a.depth)]
        self.step_s = [table.draft.ms(r) / 1e3 for r in self.rows]
        us = {k: getattr(a, k) for k in DEFAULTS}
        self.us = us
        # a step's host work grows with its rows: the measured per-row slope (profile: rows 1 vs the tree's)
        self.step_us = [us["step_py"] + a.step_py_per_row * (r - 1) for r in self.rows]
        self.step_making_us = [us["step_making"] + a.step_making_per_row * (r - 1) for r in self.rows]
        self.py = {k: int(v * py_per_us) for k, v in us.items()}
        self.py_step = [int(v * py_per_us) for v in self.step_us]
        self.py_step_making = [int(v * py_per_us) for v in self.step_making_us]
        self.c_per_us = c_per_us
        # the rows' copies, in C with the lock released (native copy_rows, 152k floats a row): the verify's
        # k+1 rows, the read's one; a branch step hands over heads, no rows
        self.c_verify_copy = a.copy_us_per_row * (a.k + 1) * c_per_us
        self.c_read_copy = a.copy_us_per_row * c_per_us
        self.rounds, self.warmup = a.rounds, a.warmup


class Making:
    """A side's running estimate of how long its rows take to make (PricedContext._making)."""

    def __init__(self) -> None:
        self.est = 0.0


def decode(lib, price_s: float, py_iters: int, copy_iters: float, mk: Making, flag: int,
           acc: int | None = None) -> bool:
    """A priced decode as PricedContext._decode: wait with the lock released; make the rows begun twice their
    recent time (and a margin) before the price is up: Python (the lock held), the rows' copy in C (native
    copy_rows: the lock released, `copy_iters` of C work), Python again; wait out the rest. False: aborted."""
    t0 = time.perf_counter()
    lead = min(2.0 * mk.est + MAKING_MARGIN_S, price_s)
    left = t0 + price_s - lead - time.perf_counter()
    spin = lib.spin if acc is None else (lambda s, f: lib.spin_acc(s, f, acc))  # acc: the draft side's ctl
    if left > 0 and not spin(left, flag):
        return False
    t_make = time.perf_counter()
    pyburn(py_iters // 2)
    if copy_iters:
        lib.work(copy_iters)
    pyburn(py_iters - py_iters // 2)
    mk.est = 0.5 * mk.est + 0.5 * (time.perf_counter() - t_make)
    left = t0 + price_s - time.perf_counter()
    return bool(spin(left, flag)) if left > 0 else True


def py_draft_round(lib, ctl: Ctl, addr_abort: int, r: int, t_post: float, p: Plan, mk: Making) -> None:
    """The draft side's round in Python (variants thread and proc-*)."""
    ctl.abort = 0
    acc = ctypes.addressof(ctl)
    pyburn(p.py["pre_read"])
    ctl.first[r % CAP] = time.perf_counter() - t_post
    if not decode(lib, p.read_s, p.py["read_making"], p.c_read_copy, mk, addr_abort, acc):
        return
    pyburn(p.py["post_read"])
    for d in range(p.depth):
        pyburn(p.py_step[d])
        if ctl.posted != r:  # the engine moved on (_stop_reading: a message waits)
            return
        if not decode(lib, p.step_s[d], p.py_step_making[d], 0.0, mk, addr_abort, acc):
            return
    ctl.ready = r


def child_main(lib, ctl: Ctl, p: Plan, how: str, rfd: int | None) -> None:
    addr = ctypes.addressof(ctl)
    addr_abort = addr + Ctl.abort.offset
    last = 0
    mk = Making()
    while True:
        if how == "spin":
            r = lib.wait_post(addr, last, 5e-3)
        else:
            os.read(rfd, 4)
            while select.select([rfd], [], [], 0)[0]:  # only the latest round counts
                os.read(rfd, 4)
            r = ctl.posted
        if ctl.stop:
            break
        last = r
        py_draft_round(lib, ctl, addr_abort, r, ctl.t_post, p, mk)
    t = os.times()
    ctl.cpu_s = t.user + t.system


def run_variant(lib, p: Plan, variant: str) -> dict:
    mm = mmap.mmap(-1, ctypes.sizeof(Ctl))  # MAP_SHARED | MAP_ANONYMOUS: shared with a forked child
    ctl = Ctl.from_buffer(mm)
    addr = ctypes.addressof(ctl)
    addr_abort = addr + Ctl.abort.offset
    # the native thread's plan
    ctl.pre_read_iters = p.us["pre_read"] * p.c_per_us
    ctl.read_s = p.read_s
    ctl.post_read_iters = p.us["post_read"] * p.c_per_us
    for d in range(p.depth):
        ctl.step_iters[d] = (p.step_us[d] + p.step_making_us[d]) * p.c_per_us
        ctl.step_s[d] = p.step_s[d]
    ctl.depth, ctl.width, ctl.short_depth = p.depth, p.width, p.short
    for i in range(CAP):
        ctl.first[i] = float("nan")

    old_si = sys.getswitchinterval()
    inbox: queue.SimpleQueue | None = None
    worker = child = None
    wfd = None
    if variant in ("thread", "thread-si"):
        if variant == "thread-si":
            sys.setswitchinterval(0.0002)
        inbox = queue.SimpleQueue()

        def loop() -> None:
            mk = Making()
            while True:
                msg = inbox.get()
                while not inbox.empty():  # a later message waits: this one is stale
                    msg = inbox.get()
                if msg is None:
                    return
                py_draft_round(lib, ctl, addr_abort, msg[0], msg[1], p, mk)

        worker = threading.Thread(target=loop, name="spike-draft", daemon=True)
        worker.start()
    elif variant.startswith("native"):
        ctl.spin_wait_s = 5e-3 if variant == "native-spin" else 0.0
        lib.draft_start(addr)
    elif variant.startswith("proc"):
        rfd = None
        if variant == "proc-pipe":
            rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its own interpreter from here on
            try:
                if wfd is not None:
                    os.close(wfd)
                child_main(lib, ctl, p, "spin" if variant == "proc-spin" else "pipe", rfd)
            finally:
                os._exit(0)
        child = pid
        if rfd is not None:
            os.close(rfd)

    # whose run delay says whether a round was quiet: the engine, and the draft side's thread
    delays = [RunDelay(os.getpid(), threading.get_native_id())]
    if worker is not None:
        delays.append(RunDelay(os.getpid(), worker.native_id))
    elif variant.startswith("native"):
        while not ctl.tid:
            time.sleep(1e-4)
        delays.append(RunDelay(os.getpid(), ctl.tid))
    elif child is not None:
        delays.append(RunDelay(child, child))
    verify_ms, round_ms, complete, delay_ms = [], [], [], []
    sa, sb = (ctypes.c_double * 2)(), (ctypes.c_double * 2)()
    s0 = (ctypes.c_double * 2)()
    lib.spin_stats(s0)
    c0, w0 = os.times(), time.perf_counter()
    eng = p.py
    eng_mk = Making()
    t_round = time.perf_counter()
    for r in range(1, p.rounds + 1):
        pyburn(eng["eng_before"])
        da = [d.read() for d in delays]
        t0 = time.perf_counter()
        # the verify: post, the feed's Python, the priced decode
        if inbox is not None:
            ctl.posted = r
            inbox.put((r, t0))
        elif variant == "proc-pipe":
            ctl.t_post = t0
            ctl.posted = r
            os.write(wfd, r.to_bytes(4, "little"))
        elif variant != "alone":
            lib.post(addr, r, t0)
        pyburn(eng["eng_feed"])
        decode(lib, p.verify_s, eng["eng_making"], p.c_verify_copy, eng_mk, 0)
        t1 = time.perf_counter()
        db = [d.read() for d in delays]
        # the lookup, at the round's end: complete, or the decode in flight is aborted
        done = ctl.ready == r
        if not done and variant != "alone":
            ctl.abort = 1
        if r > p.warmup:
            verify_ms.append((t1 - t0) * 1e3)
            round_ms.append((t1 - t_round) * 1e3)
            complete.append(done)
            # the longest either side waited for a core, from the verify's start to its end (another process had
            # it, more threads were runnable than there are cores, or a wake-up's own delay): above a wake-up's,
            # the round is not quiet
            delay_ms.append(max(b - a for a, b in zip(da, db)) * 1e3)
        t_round = t1
    wall = time.perf_counter() - w0
    c1 = os.times()
    s1 = (ctypes.c_double * 2)()
    lib.spin_stats(s1)
    # the share of the engine's spins its core was taken away: other processes on the host (ours are two threads)
    lost = 1.0 - (s1[1] - s0[1]) / (s1[0] - s0[0])
    cpu = (c1.user - c0.user) + (c1.system - c0.system)

    if inbox is not None:
        inbox.put(None)
        worker.join()
        sys.setswitchinterval(old_si)
    elif variant.startswith("native"):
        lib.stop_all(addr)
        lib.draft_join()
    elif child is not None:
        lib.stop_all(addr)
        if wfd is not None:
            os.write(wfd, b"\0\0\0\0")
        os.waitpid(child, 0)
        if wfd is not None:
            os.close(wfd)
        cpu += ctl.cpu_s  # the child's whole life: slightly more than the timed rounds
    for d in delays:
        d.close()
    first_all = [ctl.first[r % CAP] * 1e3 for r in range(p.warmup + 1, p.rounds + 1)]
    first = [f for f in first_all if f == f]
    del ctl
    mm.close()
    q = lambda xs, f: sorted(xs)[int(f * (len(xs) - 1))] if xs else None  # noqa: E731
    return {"variant": variant, "verify_ms_mean": statistics.fmean(verify_ms),
            "verify_over_priced": statistics.fmean(verify_ms) / (p.verify_s * 1e3),
            "verify_ms_p50": q(verify_ms, 0.5), "verify_ms_p90": q(verify_ms, 0.9),
            "round_ms_mean": statistics.fmean(round_ms),
            "first_decode_ms_p50": q(first, 0.5), "first_decode_ms_p90": q(first, 0.9),
            "first_decode_rounds": len(first), "complete_at_lookup": sum(complete) / len(complete),
            "cpu_per_wall": cpu / wall, "engine_spin_lost": lost,
            "per_round": {"verify_ms": [round(v, 4) for v in verify_ms], "first_ms": [round(f, 4) for f in first_all],
                          "delay_ms": [round(d, 3) for d in delay_ms]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", default="h200-1.5b")
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--width", type=int, default=1, help="rows of the tree's first steps (1: one branch)")
    ap.add_argument("--short", type=int, default=3, help="steps with `width` rows")
    ap.add_argument("--copy-us-per-row", type=float, default=COPY_US_PER_ROW,
                    help="the rows' copy with the lock released, us a row")
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--variants", default="alone,thread,thread-si,native-spin,native-futex,proc-spin,proc-pipe")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-py-per-row", type=float, default=STEP_PY_PER_ROW, help="us more of a step's Python per row")
    ap.add_argument("--step-making-per-row", type=float, default=STEP_MAKING_PER_ROW,
                    help="us more of a decode's host part per row")
    for k, v in DEFAULTS.items():
        ap.add_argument("--" + k.replace("_", "-"), dest=k, type=float, default=v, help=f"us (default {v})")
    ap.add_argument("--rtt", type=int, metavar="N", help="measure N call round trips per kind instead (thread, "
                    "proc-pipe, proc-spin), interleaved over --reps")
    ap.add_argument("--quiet-ms", type=float, default=1.0, help="a quiet round: neither side runnable but not "
                    "running this long in the verify (default 1 ms: longer than a wake-up, shorter than a time slice)")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="summarise the runs of these outputs together "
                    "(made with the same plan), instead of running")
    ap.add_argument("-o", "--output", help="JSON file (default: print)")
    a = ap.parse_args()
    if a.merge:
        parts = [json.loads(Path(f).read_text()) for f in a.merge]
        runs, variants = [], []
        for i, part in enumerate(parts):
            for r in part["runs"]:
                runs.append({**r, "rep": (i, r["rep"])})
                if r["variant"] not in variants:
                    variants.append(r["variant"])
        print(f"{len(parts)} files, {len(runs)} runs")
        print(report(runs, variants, a.quiet_ms)[1])
        return
    lib = build_lib()
    if a.rtt:
        res = [measure_rtt(lib, how, a.rtt) for _ in range(a.reps) for how in ("thread", "proc-pipe", "proc-spin")]
        out = {}
        for how in ("thread", "proc-pipe", "proc-spin"):
            rs = [r for r in res if r["how"] == how]
            out[how] = {k: [round(statistics.median(r[k] for r in rs), 3), round(min(r[k] for r in rs), 3),
                            round(max(r[k] for r in rs), 3)] for k in ("rtt_ms_p50", "rtt_ms_p90")}
        text = json.dumps({"command": "python scripts/spike_draft_side.py " + " ".join(sys.argv[1:]),
                           "rtt (median, min, max over reps)": out, "runs": res}, indent=1)
        if a.output:
            Path(a.output).write_text(text + "\n")
        print(json.dumps(out))
        return
    py_per_us, c_per_us = calibrate(lib)
    p = Plan(a, py_per_us, c_per_us)
    variants = a.variants.split(",")
    rng = random.Random(a.seed)
    runs = []
    for rep in range(a.reps):
        order = list(variants)
        rng.shuffle(order)
        for v in order:
            got = run_variant(lib, p, v)
            got["rep"] = rep
            runs.append(got)
    summary, text = report(runs, variants, a.quiet_ms)
    result = {"argv": sys.argv[1:], "command": "python scripts/spike_draft_side.py " + " ".join(sys.argv[1:]),
              "cpus": os.cpu_count(), "python": sys.version.split()[0],
              "calibration": {"py_iters_per_us": round(py_per_us, 2), "c_iters_per_us": round(c_per_us, 2)},
              "plan": {"verify_ms": p.verify_s * 1e3, "read_ms": p.read_s * 1e3, "step_ms": [x * 1e3 for x in p.step_s],
                       "rows": p.rows, "host_us": p.us, "step_us": p.step_us, "step_making_us": p.step_making_us},
              "summary (median, min, max over runs)": summary, "runs": runs}
    if a.output:
        Path(a.output).write_text(json.dumps(result, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
