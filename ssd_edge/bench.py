"""`ssd-edge bench`: every decoding mode, in both hardware settings, on the
prompt suite shipped in ssd_edge/data/prompts.jsonl.

    separate  target and draft each own a core: 1 thread each (on 2 cores); nothing
              pinned, the OS keeps the two busy threads on the two cores (with one
              thread llama.cpp computes on the calling thread, so the target runs on
              the engine's thread and, in ssd, the draft on the worker's)
    shared    both cores serve whatever runs: 2 threads each; `ssd` then runs two
              2-thread decodes on 2 cores at once (oversubscribed), reported as is

One Engine per setting (loaded once; the mode is switched per generate call).
After a warm-up, each prompt runs in every mode with the same seed, the modes
in an order rotated per prompt so that machine drift hits all alike; the KV
caches are cleared before each run, so each one prefills its prompt like a
fresh request. llama.cpp's own speculative decoding (bench_peer.py) runs
interleaved with them when its binary is found.

Writes bench.json (validated against BenchResult below), bench.md (tables in
the style of llama-bench) and bench.png (bench_report.py) into --output.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import logging
import os
import platform
import sys
import threading
import time
from collections import Counter
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, Field

from .config import EngineConfig, SpecConfig
from .errors import ConfigError, SSDEdgeError

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
CATEGORIES = ("code", "code-edit", "prose", "chat", "translation")
BENCH_MODES = ("ar", "sd", "lookup", "ssd", "auto")
WARMUP = [{"role": "user", "content": "Say hello in three languages."}]


# ---------------------------------------------------------------- the schema of bench.json

class BenchPrompt(BaseModel):
    id: str
    category: Literal["code", "code-edit", "prose", "chat", "translation"]
    messages: list[dict[str, str]]
    max_tokens: int | None = Field(default=None, ge=1, description="overrides --max-tokens for this prompt")


class Setting(BaseModel):
    name: Literal["separate", "shared"]
    target_threads: int
    draft_threads: int
    description: str


class MachineInfo(BaseModel):
    hostname: str
    os: str
    machine: str
    cpu: str
    cores: int
    ram_gib: float
    python: str
    llama_system_info: str
    load_avg_start: tuple[float, float, float]
    load_avg_end: tuple[float, float, float] | None = None


class ModelInfo(BaseModel):
    role: Literal["target", "draft"]
    name: str
    path: str
    size: int


class BenchOptions(BaseModel):
    modes: list[str]
    settings: list[str]
    k: int
    max_tokens: int
    reps: int
    seed: int
    temperature: float
    n_ctx: int
    quick: bool
    peer_k: list[int] = Field(description="extra llama.cpp draft lengths, run on the code prompts only")
    categories: list[str]


class RunRecord(BaseModel):
    """One generation."""

    setting: str
    mode: str
    prompt_id: str
    category: str
    rep: int
    seed: int
    prompt_tokens: int
    tokens: int
    stop_reason: str
    wall_s: float
    ttft_s: float | None
    decode_s: float = Field(description="wall time after the first token")
    tokens_per_s: float = Field(description="decode speed: (tokens - 1) / decode_s")
    latencies_ms: list[float] = Field(description="per token: its round's wall time / tokens that round (first round excluded)")
    drafted: int
    accepted: int
    spec_rounds: int
    rounds: int
    lookups: int
    hits: int
    partial_hits: int
    draft_busy_s: float
    target_busy_s: float
    peak_rss_mib: float
    modes_run: dict[str, int] = Field(description="rounds per mode that actually ran (auto may switch)")
    auto: dict[str, Any] | None = None
    output_sha: str = Field(description="sha256 of the output token ids (greedy runs should agree across modes)")


class PeerRecord(BaseModel):
    setting: str
    prompt_id: str
    category: str
    k: int
    rep: int
    prompt_tokens: int
    tokens: int
    decode_s: float
    tokens_per_s: float
    drafted: int
    accepted: int


class PeerInfo(BaseModel):
    available: bool
    binary: str | None
    version: str | None
    note: str
    runs: list[PeerRecord] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)


class SummaryRow(BaseModel):
    setting: str
    mode: str
    category: str
    k: int | None
    runs: int
    tokens: int
    tokens_per_s: float
    tokens_per_s_std: float = Field(description="spread of per-prompt tokens/s")
    speedup_vs_ar: float | None
    ttft_ms: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    acceptance: float | None
    mean_accepted_len: float | None
    hit_rate: float | None
    draft_util: float | None
    target_util: float | None
    peak_rss_mib: float | None


class Goal(BaseModel):
    name: str
    threshold: str
    value: float | None
    met: bool | None
    detail: str


class BenchResult(BaseModel):
    schema_version: int = SCHEMA_VERSION
    created: str
    command: list[str]
    duration_s: float
    interrupted: bool = False
    machine: MachineInfo
    libraries: dict[str, str]
    models: list[ModelInfo]
    options: BenchOptions
    settings: list[Setting]
    engine_configs: dict[str, dict[str, Any]]
    prompts: list[BenchPrompt]
    profile: dict[str, Any] | None
    runs: list[RunRecord]
    peer: PeerInfo
    summary: list[SummaryRow]
    goals: list[Goal]
    notes: list[str]


# ---------------------------------------------------------------- inputs

def load_prompts(path: str | os.PathLike[str] | None = None) -> list[BenchPrompt]:
    """The prompt suite: one JSON object per line (id, category, messages[, max_tokens])."""
    if path is None:
        text = resources.files("ssd_edge").joinpath("data/prompts.jsonl").read_text(encoding="utf-8")
        where = "ssd_edge/data/prompts.jsonl"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"cannot read the prompt file {path}: {e.strerror}") from None
        where = str(path)
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(BenchPrompt.model_validate_json(line))
        except ValueError as e:
            raise ConfigError(f"{where}, line {n}: not a valid prompt ({str(e).splitlines()[0]})") from None
    if not out:
        raise ConfigError(f"{where} holds no prompts")
    return out


def quick_prompts(prompts: list[BenchPrompt]) -> list[BenchPrompt]:
    """One prompt per category, the shortest."""
    best: dict[str, BenchPrompt] = {}
    for p in prompts:
        size = sum(len(m["content"]) for m in p.messages)
        if p.category not in best or size < sum(len(m["content"]) for m in best[p.category].messages):
            best[p.category] = p
    return [best[c] for c in CATEGORIES if c in best]


def hardware_settings(cores: int) -> dict[str, Setting]:
    half = max(1, cores // 2)
    return {
        "separate": Setting(name="separate", target_threads=half, draft_threads=max(1, cores - half),
                            description=f"target and draft each own {half} core(s): {half} thread(s) each; "
                                        "affinity left to the OS"),
        "shared": Setting(name="shared", target_threads=cores, draft_threads=cores,
                          description=f"both models use all {cores} cores ({cores} threads each); ssd oversubscribes"),
    }


def machine_info(cores: int) -> MachineInfo:
    import psutil

    from . import backend
    from .profile import device_info

    dev = device_info()
    return MachineInfo(hostname=platform.node(), os=platform.platform(), machine=dev.machine, cpu=dev.cpu,
                       cores=cores, ram_gib=round(psutil.virtual_memory().total / 2**30, 1),
                       python=platform.python_version(), llama_system_info=backend.system_info().strip(),
                       load_avg_start=os.getloadavg())


def library_versions() -> dict[str, str]:
    out = {}
    for name in ("ssd-edge", "llama-cpp-python", "numpy", "pydantic", "rich", "matplotlib", "psutil"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


# ---------------------------------------------------------------- measuring one run

class RssPeak:
    """Peak resident memory of this process while a block runs (sampled every 20 ms)."""

    def __init__(self, every_s: float = 0.02) -> None:
        import psutil

        self.proc = psutil.Process()
        self.every_s = every_s
        self.peak = 0
        self._stop = threading.Event()

    def _poll(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> "RssPeak":
        self.peak = self.proc.memory_info().rss
        self._thread = threading.Thread(target=self._poll, name="bench-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def run_one(engine, setting: str, mode: str, prompt: BenchPrompt, *, rep: int, seed: int, max_tokens: int,
            temperature: float) -> RunRecord:
    """One generation from a cold KV cache; the record of what it did."""
    from .events import FinishEvent

    engine.target_kv.truncate(0)  # each run prefills its prompt, like a fresh request
    if engine.draft_kv is not None:
        engine.draft_kv.truncate(0)
    sampling = engine.config.sampling.model_copy(update=dict(temperature=temperature, seed=seed))
    latencies: list[float] = []
    modes_run: Counter[str] = Counter()
    spec_rounds = 0
    finish = None
    with RssPeak() as rss:
        gen = engine.generate(messages=prompt.messages, max_tokens=prompt.max_tokens or max_tokens, mode=mode,
                              sampling=sampling)
        try:
            for ev in gen:
                if isinstance(ev, FinishEvent):
                    finish = ev
                    break
                r = ev.round
                modes_run[r.mode] += 1
                spec_rounds += r.drafted > 0
                if r.index > 0 and ev.tokens:  # the first round carries the prompt's prefill (TTFT)
                    latencies.extend([r.wall_ms / len(ev.tokens)] * len(ev.tokens))
        finally:
            gen.close()  # on Ctrl-C: stops the SSD worker before the engine closes
    assert finish is not None
    st = finish.stats
    pre = st.get("prespec") or {}
    ttft = st.get("ttft_s")
    decode_s = max(st["wall_s"] - (ttft or 0.0), 0.0)
    return RunRecord(
        setting=setting, mode=mode, prompt_id=prompt.id, category=prompt.category, rep=rep, seed=seed,
        prompt_tokens=st["prompt_tokens"], tokens=st["tokens"], stop_reason=finish.stop_reason, wall_s=st["wall_s"],
        ttft_s=ttft, decode_s=decode_s, tokens_per_s=st["tokens_per_s"], latencies_ms=latencies,
        drafted=int(st.get("drafted", 0)),
        accepted=int(st.get("accepted", 0)), spec_rounds=spec_rounds, rounds=st["rounds"],
        lookups=int(pre.get("lookups", 0)), hits=int(pre.get("hits", 0)), partial_hits=int(pre.get("partial_hits", 0)),
        draft_busy_s=st["draft_busy_s"], target_busy_s=st["target_busy_s"], peak_rss_mib=rss.peak / 2**20,
        modes_run=dict(modes_run), auto=st.get("auto"),
        output_sha=hashlib.sha256(json.dumps(list(finish.tokens)).encode()).hexdigest()[:16])


# ---------------------------------------------------------------- the whole run

Tick = Callable[[str], None]  # called before each unit of work with a description; once more per unit done


class Bench:
    """Runs the plan; `records` and `peer` fill as it goes (so an interrupted run still has its data)."""

    def __init__(self, args: argparse.Namespace, target: Path, draft: Path) -> None:
        from . import bench_peer
        from .profile import device_info

        self.args = args
        self.target, self.draft = target, draft
        self.cores = device_info().cores
        all_settings = hardware_settings(self.cores)
        self.settings = [all_settings[s] for s in args.settings]
        prompts = load_prompts(args.prompts)
        if args.category:
            prompts = [p for p in prompts if p.category in args.category]
        self.prompts = quick_prompts(prompts) if args.quick else prompts
        if not self.prompts:
            raise ConfigError("no prompts left after --category")
        self.records: list[RunRecord] = []
        self.peer_runs: list[PeerRecord] = []
        self.peer_errors: list[str] = []
        self.engine_configs: dict[str, dict[str, Any]] = {}
        self.profile: dict[str, Any] | None = None
        self.notes: list[str] = []
        self.peer_bin = None if args.no_peer else bench_peer.find_binary(args.llama_tools)
        self.t0 = time.perf_counter()

    def units(self) -> int:
        n = sum(len(self.jobs(p)) for p in self.prompts)
        return len(self.settings) * (self.args.reps * n + 1)

    def jobs(self, p: BenchPrompt) -> list[str]:
        """What runs on one prompt: every mode, the llama.cpp peer at -k, and on code prompts its other k."""
        a = self.args
        out = list(a.modes)
        if self.peer_bin is not None:
            out.append(f"peer:{a.k}")
            if p.category == "code":
                out += [f"peer:{k}" for k in a.peer_k if k != a.k]
        return out

    def config(self, s: Setting) -> EngineConfig:
        a = self.args
        rpc = dict(rpc=a.rpc.split(","), n_gpu_layers=-1) if getattr(a, "rpc", None) else {}
        return EngineConfig.build(target=dict(path=str(self.target), threads=s.target_threads, **rpc),
                                  draft=dict(path=str(self.draft), threads=s.draft_threads), n_ctx=a.ctx_size,
                                  mode="ar", spec=dict(k=a.k), sampling=dict(temperature=a.temp, seed=a.seed),
                                  verbose=a.verbose)

    def run(self, tick: Tick, calibrating: Callable[[str, float], None]) -> None:
        from .calibrate import ensure_profile
        from .engine import Engine

        a = self.args
        for s in self.settings:
            cfg = self.config(s)
            self.engine_configs[s.name] = cfg.model_dump()
            with Engine(cfg) as engine:
                if "auto" in a.modes and not a.no_calibrate:
                    prof, measured = ensure_profile(engine, recalibrate=a.recalibrate and self.profile is None,
                                                    progress=calibrating)
                    if self.profile is None:
                        self.profile = {"measured_now": measured, **json.loads(prof.model_dump_json())}
                        if measured:
                            self.notes.append(f"calibrated this device before the run ({prof.calibration_s:.0f} s)")
                elif "auto" in a.modes:
                    self.notes.append("auto ran without a calibration profile (--no-calibrate): its planner priced verifies "
                                      "from what each generation timed")
                tick(f"{s.name}: warm-up")
                for mode in a.modes:
                    run_one(engine, s.name, mode, BenchPrompt(id="warmup", category="chat", messages=WARMUP),
                            rep=-1, seed=a.seed, max_tokens=8 if a.quick else 24, temperature=a.temp)
                tick("")
                for rep in range(a.reps):
                    for i, p in enumerate(self.prompts):
                        seed = a.seed + i
                        jobs = self.jobs(p)
                        shift = (i + rep) % len(jobs)
                        for job in jobs[shift:] + jobs[:shift]:  # rotated per prompt: drift hits all modes alike
                            tick(f"{s.name}: {job.replace('peer:', 'llama.cpp k=')} · {p.id}")
                            if job.startswith("peer:"):
                                self._peer(engine, s, p, int(job[5:]), rep, seed)
                            else:
                                self.records.append(run_one(engine, s.name, job, p, rep=rep, seed=seed,
                                                            max_tokens=a.max_tokens, temperature=a.temp))
                            tick("")

    def _peer(self, engine, s: Setting, p: BenchPrompt, k: int, rep: int, seed: int) -> None:
        from . import bench_peer

        a = self.args
        try:
            r = bench_peer.run(self.peer_bin, self.target, self.draft, engine.target.render_chat(p.messages), k=k,
                               target_threads=s.target_threads, draft_threads=s.draft_threads,
                               max_tokens=p.max_tokens or a.max_tokens, temperature=a.temp, seed=seed,
                               n_ctx=a.ctx_size)
        except (RuntimeError, ValueError, OSError) as e:
            self.peer_errors.append(f"{s.name} {p.id} k={k}: {e}")
            return
        self.peer_runs.append(PeerRecord(setting=s.name, prompt_id=p.id, category=p.category, k=k, rep=rep,
                                         prompt_tokens=r.prompt_tokens, tokens=r.tokens, decode_s=r.decode_s,
                                         tokens_per_s=r.tokens_per_s, drafted=r.drafted, accepted=r.accepted))

    def result(self, machine: MachineInfo, interrupted: bool) -> BenchResult:
        from . import bench_peer, bench_report

        a = self.args
        machine.load_avg_end = os.getloadavg()
        peer = PeerInfo(
            available=self.peer_bin is not None, binary=str(self.peer_bin) if self.peer_bin else None,
            version=bench_peer.version(self.peer_bin) if self.peer_bin else None,
            note=("llama-speculative-simple --spec-type draft-simple, same models, rendered prompt, threads, "
                  "draft length, --spec-draft-p-min 0, greedy; tokens/s from its 'decoded' line")
            if self.peer_bin else ("not available: --no-peer" if a.no_peer else
                                   "not available: llama-speculative-simple not found (scripts/build_llama_tools.sh "
                                   "or --llama-tools DIR)"),
            runs=self.peer_runs, errors=self.peer_errors)
        summary = bench_report.summarize(self.records, self.peer_runs, k=a.k)
        opts = BenchOptions(modes=list(a.modes), settings=list(a.settings), k=a.k, max_tokens=a.max_tokens,
                            reps=a.reps, seed=a.seed, temperature=a.temp, n_ctx=a.ctx_size, quick=a.quick,
                            peer_k=list(a.peer_k) if self.peer_bin else [], categories=sorted({p.category for p in self.prompts}))
        notes = self.notes + [
            "separate setting: threads=1 per model, no pinning; with one thread llama.cpp computes on the "
            "calling thread, and the OS places the two busy threads on the two cores",
            "decode tokens/s counts the tokens after the first over the time after the first token; "
            "speedups are ratios of those within this run",
        ]
        return BenchResult(
            created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            command=["ssd-edge", "bench", *a.argv], duration_s=time.perf_counter() - self.t0, interrupted=interrupted,
            machine=machine, libraries=library_versions(),
            models=[ModelInfo(role="target", name=self.target.name, path=str(self.target), size=self.target.stat().st_size),
                    ModelInfo(role="draft", name=self.draft.name, path=str(self.draft), size=self.draft.stat().st_size)],
            options=opts, settings=self.settings, engine_configs=self.engine_configs, prompts=self.prompts,
            profile=self.profile, runs=self.records, peer=peer, summary=summary,
            goals=bench_report.goals(summary, a.modes), notes=notes)


# ---------------------------------------------------------------- CLI

def _csv(kind: Callable[[str], Any], allowed: tuple[str, ...] | None = None) -> Callable[[str], list]:
    def parse(text: str) -> list:
        items = [kind(x.strip()) for x in text.split(",") if x.strip()]
        if allowed is not None:
            bad = [x for x in items if x not in allowed]
            if bad:
                raise argparse.ArgumentTypeError(f"unknown: {', '.join(bad)} (choose from {', '.join(allowed)})")
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        return items
    return parse


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="ssd-edge bench",
        description="Benchmark ar, sd, lookup, ssd and auto on the shipped prompt suite (code, code-edit, prose, "
                    "chat, translation) in two hardware settings: 'separate' (target and draft one core each) and "
                    "'shared' (both models on all cores). Greedy and seeded; modes interleaved after a warm-up. "
                    "Writes bench.json, bench.md and bench.png. llama.cpp's own speculative decoding runs beside "
                    "them when llama-speculative-simple is found (scripts/build_llama_tools.sh).")
    ap.add_argument("-m", "--model", default=None, help="target: catalog name or .gguf path (default: catalog default)")
    ap.add_argument("-md", "--model-draft", default=None, help="draft: catalog name or .gguf path (default: catalog default)")
    ap.add_argument("--models-dir", default=None, help="folder of model files (default: the user cache)")
    ap.add_argument("-o", "--output", default="bench-out", help="folder for bench.json, bench.md, bench.png (default: bench-out)")
    ap.add_argument("--modes", type=_csv(str, BENCH_MODES), default=list(BENCH_MODES),
                    help="comma-separated modes (default: ar,sd,lookup,ssd,auto); ar is the speedup baseline")
    ap.add_argument("--settings", type=_csv(str, ("separate", "shared")), default=["separate", "shared"],
                    help="hardware settings to run (default: separate,shared)")
    ap.add_argument("--category", type=_csv(str, CATEGORIES), default=None, help="only these prompt categories")
    ap.add_argument("--prompts", default=None, help="a JSONL prompt file instead of the shipped suite")
    ap.add_argument("-n", "--max-tokens", type=int, default=128, help="tokens per generation (default 128)")
    ap.add_argument("-k", "--draft-max", dest="k", type=int, default=SpecConfig().k,
                    help=f"draft length k, the most tokens a round drafts, in every mode (default {SpecConfig().k}); "
                         "auto plans 0..k each round")
    ap.add_argument("--reps", type=int, default=1, help="passes over the prompt suite (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="base seed; prompt i uses seed + i in every mode (default 0)")
    ap.add_argument("--temp", type=float, default=0.0, help="sampling temperature (default 0 = greedy)")
    ap.add_argument("-c", "--ctx-size", type=int, default=2048, help="context size (default 2048)")
    ap.add_argument("--quick", action="store_true",
                    help="one short prompt per category, 24 tokens, no --peer-k sweep: about a minute on the small "
                         "test pair, several minutes on the default pair")
    ap.add_argument("--llama-tools", default=None,
                    help="folder holding llama-speculative-simple (default: ~/.cache/ssd-edge/llama-tools/bin, PATH)")
    ap.add_argument("--peer-k", type=_csv(int), default=None,
                    help="more draft lengths for the llama.cpp peer, comma-separated, run on the code prompts only "
                         "(to find its best k there); it always runs at -k on every prompt")
    ap.add_argument("--no-peer", action="store_true", help="skip llama.cpp's speculative decoding")
    ap.add_argument("--no-calibrate", action="store_true",
                    help="never calibrate; without a saved profile auto's planner prices verifies from what each "
                         "generation times")
    ap.add_argument("--recalibrate", action="store_true", help="calibrate again before the run even if a profile exists")
    ap.add_argument("--no-plot", action="store_true", help="skip bench.png")
    ap.add_argument("-v", "--verbose", action="store_true", help="let llama.cpp print its logs")
    ap.add_argument("--rpc", default=None, help="HOST:PORT[,...]: the target's layers on these llama.cpp "
                    "rpc-servers, the draft here (the llama.cpp peer column stays local: add --no-peer)")
    return ap


def _check(args: argparse.Namespace) -> None:
    if args.max_tokens < 1:
        raise ConfigError("--max-tokens must be at least 1")
    if not 1 <= args.k <= 32:
        raise ConfigError("--draft-max must be between 1 and 32")
    if args.reps < 1:
        raise ConfigError("--reps must be at least 1")
    if args.temp < 0:
        raise ConfigError("--temp must be >= 0")
    if args.quick:
        args.max_tokens = min(args.max_tokens, 24)
    if args.peer_k is None or args.quick:
        args.peer_k = []
    if any(not 1 <= k <= 32 for k in args.peer_k):
        raise ConfigError("--peer-k values must be between 1 and 32")
    if "ar" not in args.modes:
        args.modes = ["ar", *args.modes]  # the baseline of every speedup
    if args.rpc:
        args.no_calibrate = True  # a profile prices a target on this device; one over --rpc is not


def cli_main(argv: list[str]) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    from . import bench_report
    from .calibrate import _default_pair
    from .catalog import resolve_model

    args = parser().parse_args(argv)
    args.argv = list(argv)
    console = Console(stderr=True)
    try:
        _check(args)
        target_name, draft_name = _default_pair(args)
        target = resolve_model(target_name, args.models_dir)
        draft = resolve_model(draft_name, args.models_dir)
        out = Path(args.output).expanduser()
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create the output folder {out}: {e.strerror}") from None
        bench = Bench(args, target, draft)
        from .profile import device_info
        machine = machine_info(device_info().cores)
        if machine.load_avg_start[0] > 0.5 * machine.cores:
            console.print(f"[yellow]note:[/] load average {machine.load_avg_start[0]:.2f} on {machine.cores} cores: "
                          "other work is running; numbers will be noisy")
        if bench.peer_bin is None and not args.no_peer:
            console.print("[yellow]note:[/] llama-speculative-simple not found; the llama.cpp column is 'not "
                          "available' (build it with scripts/build_llama_tools.sh)")
        interrupted = False
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TimeRemainingColumn(), console=console, transient=True) as bar:
            task = bar.add_task("loading", total=bench.units())
            cal = bar.add_task("calibrating", total=1.0, visible=False)

            def tick(what: str) -> None:
                if what:
                    bar.update(task, description=what)
                else:
                    bar.advance(task)

            def calibrating(what: str, frac: float) -> None:
                bar.update(cal, visible=frac < 1.0, description=f"calibrating: {what}", completed=frac)

            try:
                bench.run(tick, calibrating)
            except KeyboardInterrupt:
                interrupted = True
        result = bench.result(machine, interrupted)
        paths = bench_report.write(result, out, plot=not args.no_plot)
        sys.stdout.write(bench_report.markdown(result, brief=True))  # plain: tables must not be re-wrapped
        console.print(("[yellow]interrupted:[/] partial results in " if interrupted else "wrote ") +
                      ", ".join(str(p) for p in paths))
        return 130 if interrupted else 0
    except SSDEdgeError as e:
        console.print(f"[red]error:[/] {e}")
        return e.exit_code
