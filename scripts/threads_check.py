"""Do the default thread counts follow the machine? Three scenarios on the default pair, run as a user runs
them (`ssd-edge generate --chat --json`, one process a generation), with another program that holds one
core (a busy loop pinned to core 0) started and stopped around them:

  busy-calibration   the first use of mode auto calibrates while the loop runs; the loop stops; then auto
                     against `ar -t CORES` (llama.cpp's every-core default)
  busy-runs          calibrated on a quiet machine; the loop runs during the generations: auto against
                     `ar -t CORES` and `ar -t CORES-1`
  quiet              auto against ar, both at their default threads, nothing else running
  following          auto following the machine against auto at a fixed -t CORES, nothing else running
                     (what the live choice costs where nothing changes; with -m qwen2.5-coder-1.5b:bf16,
                     in the BF16 stand-in's regime)

Each scenario runs its modes in turn on the same held-out prompts (not the calibration probe's),
`--pairs` times with the order swapped every other pass; decode tokens/s medians, ratios, and each
auto run's thread splits (Stats.threads) go to a JSON file.

    .venv/bin/python scripts/threads_check.py -n 200 --pairs 3 -o threads-check.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ssd_edge.bench.calibrate import PROVISIONAL_RETRY_S
from ssd_edge.bench.machine import busy_cores

ROOT = Path(__file__).resolve().parents[1]
SSD = str(Path(sys.executable).with_name("ssd-edge"))
HELD_OUT = ["Write a Python function that returns the n-th prime number, with a docstring and two doctests.",
            "Explain how a bicycle's gears make climbing a hill easier, in one paragraph."]
BUSY_LOOP = "import os\nos.sched_setaffinity(0, {0})\nwhile True:\n    pass\n"


class BusyCore:
    """Another program holding core 0 while the block runs."""

    def __enter__(self) -> BusyCore:
        self.proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
        time.sleep(1.0)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()
        time.sleep(2.0)  # the core goes quiet


MODEL: list[str] = []  # -m NAME, where given


def generate(mode: str, prompt: str, n: int, threads: int | None = None, calibrate: bool = True) -> dict:
    """One `ssd-edge generate` run; its --json object (stderr kept for the calibration lines)."""
    cmd = [SSD, "generate", "--chat", "--json", "--mode", mode, "-n", str(n), "--temp", "0", prompt]
    if threads is not None:
        cmd[2:2] = ["-t", str(threads)]
    if not calibrate:
        cmd.insert(2, "--no-calibrate")
    cmd[2:2] = MODEL
    got = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900)
    out = json.loads(got.stdout)
    out["stderr"] = got.stderr
    return out


def profile_file() -> Path | None:
    """The saved profile of the default pair on this device, if any (what `calibrate --show` reads)."""
    from ssd_edge.bench.calibrate import default_pair
    from ssd_edge.models.catalog import resolve_model
    from ssd_edge.planning import profile as prof

    target, draft = (resolve_model(m, None) for m in default_pair(None, None, None))
    p = prof.load(target, draft)
    return prof.profile_path(p.device, p.target, p.draft, p.offload) if p is not None else None


def profile_state() -> dict:
    f = profile_file()
    if f is None:
        return {"saved": False}
    raw = json.loads(f.read_text())
    return {"saved": True, "provisional": raw.get("provisional"), "busy_cores": raw.get("busy_cores"),
            "created": raw.get("created"), "target_1_token_ms": {c["target_threads"]: c["target_ms"][0]
                                                                 for c in raw["costs"]}}


def age_profile(seconds: float) -> None:
    """Set the saved profile's measuring date `seconds` back (what the retry interval reads)."""
    import datetime as dt

    f = profile_file()
    raw = json.loads(f.read_text())
    created = dt.datetime.fromisoformat(raw["created"]) - dt.timedelta(seconds=seconds)
    raw["created"] = created.isoformat(timespec="seconds")
    f.write_text(json.dumps(raw, indent=2))


def forget_profile() -> None:
    f = profile_file()
    if f is not None:
        f.unlink()


def compare(runs: list[tuple[str, int | None]], n: int, pairs: int) -> dict:
    """Each (mode, threads) on every held-out prompt, `pairs` passes, the order reversed every other pass."""
    got: dict[str, list[dict]] = {f"{m}{'' if t is None else f' -t {t}'}": [] for m, t in runs}
    for p in range(pairs):
        order = runs if p % 2 == 0 else runs[::-1]
        for prompt in HELD_OUT:
            for mode, threads in order:
                out = generate(mode, prompt, n, threads)
                stats = out["stats"]
                got[f"{mode}{'' if threads is None else f' -t {threads}'}"].append(
                    {"tokens_per_s": stats["tokens_per_s"], "tokens": stats["tokens"], "threads": stats.get("threads"),
                     "calibrated": "calibrated in" in out["stderr"]})
                print(f"  pass {p + 1} {mode} -t {threads}: {stats['tokens_per_s']:.1f} tok/s "
                      f"{[(s['target'], s['draft'], s['steps']) for s in stats.get('threads', [])]}", flush=True)
    return {label: {"median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs), "runs": rs}
            for label, rs in got.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=200, help="tokens a generation (default 200)")
    ap.add_argument("--pairs", type=int, default=3, help="alternated passes (default 3)")
    ap.add_argument("--scenarios", default="busy-calibration,busy-runs,quiet")
    ap.add_argument("-m", "--model", default=None, help="the target (default: the catalog's default pair)")
    ap.add_argument("-o", "--output", default="threads-check.json")
    a = ap.parse_args()
    if a.model:
        MODEL[:] = ["-m", a.model]
    cores = len(os.sched_getaffinity(0))
    out: dict = {"cores": cores, "model": a.model, "n": a.n, "pairs": a.pairs, "prompts": HELD_OUT, "scenarios": {}}
    for name in a.scenarios.split(","):
        print(f"{name}:", flush=True)
        sc: dict = {}
        if name == "busy-calibration":
            forget_profile()
            with BusyCore():
                first = generate("auto", "Say hello.", 8)  # the first use calibrates, beside the loop
            sc["first_use_stderr"] = first["stderr"].splitlines()[-3:]
            sc["profile_after_busy_first_use"] = profile_state()
            sc["modes"] = compare([("auto", None), ("ar", cores)], a.n, a.pairs)
            sc["profile_after"] = profile_state()
            # the next quiet first use replaces it, once PROVISIONAL_RETRY_S passed: the file's date is set back
            # that far here (nothing else in it changes) rather than waiting 15 minutes
            age_profile(PROVISIONAL_RETRY_S + 60)
            again = generate("auto", "Say hello.", 8)
            sc["quiet_use_after_retry_interval"] = {"busy_cores_after": busy_cores(),
                                                    "stderr": again["stderr"].splitlines()[-6:],
                                                    "profile": profile_state()}
            x = sc["modes"]["auto"]["median_tokens_per_s"] / sc["modes"][f"ar -t {cores}"]["median_tokens_per_s"]
            sc["auto_over_ar_all_cores"] = x
        elif name == "busy-runs":
            if not profile_state().get("saved") or profile_state().get("provisional"):
                forget_profile()
                generate("auto", "Say hello.", 8)  # calibrated quiet
            sc["profile"] = profile_state()
            with BusyCore():
                sc["modes"] = compare([("auto", None), ("ar", cores), ("ar", cores - 1)], a.n, a.pairs)
            m = {k: v["median_tokens_per_s"] for k, v in sc["modes"].items()}
            sc["auto_over_ar_all_cores"] = m["auto"] / m[f"ar -t {cores}"]
            sc["auto_over_best_ar"] = m["auto"] / max(m[f"ar -t {cores}"], m[f"ar -t {cores - 1}"])
        elif name == "quiet":
            sc["modes"] = compare([("auto", None), ("ar", None)], a.n, a.pairs)
            sc["auto_over_ar"] = sc["modes"]["auto"]["median_tokens_per_s"] / sc["modes"]["ar"]["median_tokens_per_s"]
        elif name == "following":
            sc["modes"] = compare([("auto", None), ("auto", cores)], a.n, a.pairs)
            m = {k: v["median_tokens_per_s"] for k, v in sc["modes"].items()}
            sc["auto_over_fixed"] = m["auto"] / m[f"auto -t {cores}"]
        else:
            ap.error(f"no scenario {name}")
        sc["profile_at_end"] = profile_state()
        out["scenarios"][name] = sc
        print({k: v for k, v in sc.items() if k.startswith("auto_")}, flush=True)
        Path(a.output).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
