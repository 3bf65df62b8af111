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
fresh request. llama.cpp's own speculative decoding (peer.py) runs
interleaved with them when its binary is found.

With --priced, the modes run on a priced pair instead (pricing.py): one
setting, no model files, no llama.cpp peer, results labelled with the table.

Writes bench.json (validated against schema.BenchResult), bench.md (tables in
the style of llama-bench) and bench.png (report.py) into --output.
"""

from __future__ import annotations

import dataclasses
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
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Callable

from ..config import EngineConfig
from ..planning.planner import FIXED_K
from ..errors import ConfigError, SSDEdgeError
from .schema import (CATEGORIES, BenchOptions, BenchPrompt, BenchResult, MachineInfo, ModelInfo, PeerInfo, PeerRecord,
                     RunRecord, Setting)

log = logging.getLogger(__name__)

BENCH_MODES = ("ar", "sd", "lookup", "ssd", "auto")
WARMUP = [{"role": "user", "content": "Say hello in three languages."}]


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

    from ..planning.profile import device_info
    from ..llama import backend

    dev = device_info()
    return MachineInfo(hostname=platform.node(), os=platform.platform(), machine=dev.machine, cpu=dev.cpu,
                       cores=cores, ram_gib=round(psutil.virtual_memory().total / 2**30, 1),
                       python=platform.python_version(), llama_system_info=backend.system_info().strip(), gpus=dev.gpus,
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
    from ..events import FinishEvent

    engine.reset()  # each run prefills its prompt, like a fresh request
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
                r = ev.round  # the last of ev.rounds rounds (several: plain steps made in one call)
                modes_run[r.mode] += ev.rounds
                spec_rounds += r.drafted > 0
                if r.index > 0 and ev.tokens:  # the first round carries the prompt's prefill (TTFT)
                    latencies.extend([ev.wall_ms / len(ev.tokens)] * len(ev.tokens))
        finally:
            gen.close()  # on Ctrl-C: stops the SSD worker before the engine closes
    assert finish is not None
    st, pre = finish.stats, finish.stats.prespec
    return RunRecord(
        setting=setting, mode=mode, prompt_id=prompt.id, category=prompt.category, rep=rep, seed=seed,
        prompt_tokens=st.prompt_tokens, tokens=st.tokens, stop_reason=finish.stop_reason, wall_s=st.wall_s,
        ttft_s=st.ttft_s, decode_s=st.decode_s, tokens_per_s=st.tokens_per_s, latencies_ms=latencies,
        drafted=st.drafted, accepted=st.accepted, spec_rounds=spec_rounds, rounds=st.rounds,
        lookups=pre.lookups, hits=pre.hits, partial_hits=pre.partial_hits, miss_reasons=dict(pre.miss_reasons),
        draft_busy_s=st.draft_busy_s, target_busy_s=st.target_busy_s, in_decode_s=st.in_decode_s,
        positions=st.positions, peak_rss_mib=rss.peak / 2**20,
        memory=dict(st.memory) if st.memory is not None else None, modes_run=dict(modes_run),
        auto=st.auto.to_dict() if st.auto is not None else None,
        output_sha=hashlib.sha256(json.dumps(list(finish.tokens)).encode()).hexdigest()[:16])


# ---------------------------------------------------------------- the whole run

Tick = Callable[[str], None]  # called before each unit of work with a description; once more per unit done


class Bench:
    """Runs the plan; `records` and `peer` fill as it goes (so an interrupted run still has its data)."""

    def __init__(self, args: BenchArgs, target: Path, draft: Path, stand_in: Path | None = None) -> None:
        from ..planning.profile import device_info
        from . import peer as bench_peer, pricing as bench_pricing

        self.args = args
        self.target, self.draft = target, draft
        self.cores = device_info().cores
        self.priced = args.priced_pair()
        all_settings = hardware_settings(self.cores)
        self.settings = [all_settings[s] for s in args.settings] if self.priced is None else \
            [bench_pricing.setting(self.priced)]
        if stand_in is not None:  # the same settings again with the memory-bound stand-in as the target
            self.settings += [s.model_copy(update=dict(
                name=f"{s.name} {args.stand_in}", target=str(stand_in), stand_in=True,
                description=f"{s.description}; the target is {stand_in.name}, a measuring stand-in")) for s in self.settings]
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
        no_peer = args.no_peer or self.priced is not None
        self.peer_bin = None if no_peer else bench_peer.find_binary(args.llama_tools)
        self.lookup_bin = None if no_peer else bench_peer.find_binary(args.llama_tools, bench_peer.LOOKUP)
        self.t0 = time.perf_counter()

    def units(self) -> int:
        n = sum(len(self.jobs(p)) for p in self.prompts)
        return len(self.settings) * (self.args.reps * n + 1)

    @property
    def peer_k(self) -> int:
        """llama.cpp's draft length: -k, else its default (--spec-draft-n-max 3)."""
        return self.args.k or FIXED_K

    def jobs(self, p: BenchPrompt) -> list[str]:
        """What runs on one prompt: every mode, the llama.cpp peer at -k, and on code prompts its other k."""
        a = self.args
        out = list(a.modes)
        if self.peer_bin is not None:
            out.append(f"peer:draft:{self.peer_k}")
            if p.category == "code":
                out += [f"peer:draft:{k}" for k in a.peer_k if k != self.peer_k]
        if self.lookup_bin is not None:
            out.append(f"peer:lookup:{self.peer_k}")
        return out

    def target_of(self, s: Setting) -> Path:
        return Path(s.target) if s.target else self.target

    def config(self, s: Setting) -> EngineConfig:
        a = self.args
        rpc = dict(rpc=a.rpc.split(","), n_gpu_layers=-1) if a.rpc else {}
        return EngineConfig.build(target=dict(path=str(self.target_of(s)), threads=s.target_threads, **rpc),
                                  draft=dict(path=str(self.draft), threads=s.draft_threads), n_ctx=a.ctx_size,
                                  mode="ar", spec=dict(k=a.k), sampling=dict(temperature=a.temp, seed=a.seed),
                                  verbose=a.verbose)

    def open_engine(self, cfg: EngineConfig):
        """The setting's engine: over the models' files, or over the priced pair."""
        from ..engine import Engine

        return Engine(cfg) if self.priced is None else self.priced.engine(cfg)

    def run(self, tick: Tick, calibrating: Callable[[str, float], None]) -> None:
        from .calibrate import ensure_profile
        from . import pricing as bench_pricing, report as bench_report

        a = self.args
        calibrated: set[Path] = set()
        for i, s in enumerate(self.settings):
            cfg = self.config(s)
            self.engine_configs[s.name] = cfg.model_dump()
            with self.open_engine(cfg) as engine:
                if "auto" in a.modes and not a.no_calibrate and self.priced is not None:
                    prof = bench_pricing.calibrate(engine, self.priced, calibrating)
                    self.profile = {"measured_now": True, **json.loads(prof.model_dump_json())}
                    self.notes.append(f"auto planned from a profile measured on the priced pair before its runs "
                                      f"({prof.calibration_s:.0f} s), held in memory: no saved profile was read "
                                      "or written")
                elif "auto" in a.modes and not a.no_calibrate:
                    target = self.target_of(s)
                    prof, measured = ensure_profile(engine, recalibrate=a.recalibrate and target not in calibrated,
                                                    progress=calibrating)
                    calibrated.add(target)
                    at = prof.at(s.target_threads)
                    self.settings[i] = s = s.model_copy(update=dict(
                        verify_ms=at.target_ms if at else None, regime=prof.regime() if at else None))
                    if self.profile is None:
                        self.profile = {"measured_now": measured, **json.loads(prof.model_dump_json())}
                    if measured:
                        self.notes.append(f"calibrated {target.name} on this device before its runs "
                                          f"({prof.calibration_s:.0f} s)")
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
                            if job.startswith("peer:"):
                                _, kind, k = job.split(":")
                                tick(f"{s.name}: {bench_report.peer_mode(int(k), kind)} · {p.id}")
                                self._peer(engine, s, p, kind, int(k), rep, seed)
                            else:
                                tick(f"{s.name}: {job} · {p.id}")
                                self.records.append(run_one(engine, s.name, job, p, rep=rep, seed=seed,
                                                            max_tokens=a.max_tokens, temperature=a.temp))
                            tick("")

    def _peer(self, engine, s: Setting, p: BenchPrompt, kind: str, k: int, rep: int, seed: int) -> None:
        from . import peer as bench_peer

        a = self.args
        binary, draft = (self.peer_bin, self.draft) if kind == "draft" else (self.lookup_bin, None)
        try:
            r = bench_peer.run(binary, self.target_of(s), draft, engine.render_chat(p.messages), k=k,
                               target_threads=s.target_threads, draft_threads=s.draft_threads,
                               max_tokens=p.max_tokens or a.max_tokens, temperature=a.temp, seed=seed,
                               n_ctx=a.ctx_size)
        except (RuntimeError, ValueError, OSError) as e:
            self.peer_errors.append(f"{s.name} {p.id} {bench_peer.TOOLS[kind]} k={k}: {e}")
            return
        self.peer_runs.append(PeerRecord(setting=s.name, prompt_id=p.id, category=p.category, k=k, kind=kind, rep=rep,
                                         prompt_tokens=r.prompt_tokens, tokens=r.tokens, decode_s=r.decode_s,
                                         tokens_per_s=r.tokens_per_s, drafted=r.drafted, accepted=r.accepted,
                                         encode_s=r.encode_s))

    def result(self, machine: MachineInfo, interrupted: bool) -> BenchResult:
        from . import peer as bench_peer, pricing as bench_pricing, report as bench_report

        a = self.args
        machine.load_avg_end = os.getloadavg()
        peer = PeerInfo(
            available=self.peer_bin is not None, binary=str(self.peer_bin) if self.peer_bin else None,
            version=bench_peer.version(self.peer_bin) if self.peer_bin else None,
            note=("llama-speculative-simple --spec-type draft-simple, same models, rendered prompt, threads, "
                  "draft length, --spec-draft-p-min 0, greedy; tokens/s from its 'decoded' line"
                  + ("; llama-lookup (n-gram lookup, the target alone) at the same draft length" if self.lookup_bin
                     else "; llama-lookup not found"))
            if self.peer_bin else bench_pricing.PEER_NOTE if self.priced else
            ("not available: --no-peer" if a.no_peer else
             "not available: llama-speculative-simple not found (scripts/build_llama_tools.sh or --llama-tools DIR)"),
            runs=self.peer_runs, errors=self.peer_errors)
        summary = bench_report.summarize(self.records, self.peer_runs, k=self.peer_k)
        opts = BenchOptions(modes=list(a.modes), settings=[s.name for s in self.settings if not s.stand_in], k=a.k,
                            max_tokens=a.max_tokens, reps=a.reps, seed=a.seed, temperature=a.temp, n_ctx=a.ctx_size,
                            quick=a.quick,
                            peer_k=list(a.peer_k) if self.peer_bin else [], categories=sorted({p.category for p in self.prompts}))
        notes = self.notes + [
            f"{self.priced.label}: synthetic models whose decodes wait a GPU's measured prices on this CPU; the "
            "host's work (Python, sampling, planning) is this machine's" if self.priced else
            "separate setting: threads=1 per model, no pinning; with one thread llama.cpp computes on the "
            "calling thread, and the OS places the two busy threads on the two cores",
            "decode tokens/s counts the tokens after the first round over the time after it (the first round "
            "carries the prompt); speedups are ratios of those within this run",
        ]
        return BenchResult(
            created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            command=["ssd-edge", "bench", *a.argv], duration_s=time.perf_counter() - self.t0, interrupted=interrupted,
            machine=machine, libraries=library_versions(),
            models=bench_pricing.models(self.priced) if self.priced else
            [ModelInfo(role="target", name=self.target.name, path=str(self.target), size=self.target.stat().st_size),
             ModelInfo(role="draft", name=self.draft.name, path=str(self.draft), size=self.draft.stat().st_size)]
            + [ModelInfo(role="target", name=f"{p.name} (measuring stand-in)", path=str(p), size=p.stat().st_size)
               for p in {Path(s.target) for s in self.settings if s.target}],
            options=opts, settings=self.settings, engine_configs=self.engine_configs, prompts=self.prompts,
            profile=self.profile, runs=self.records, peer=peer, summary=summary,
            goals=bench_report.goals(summary, a.modes, [s.name for s in self.settings if s.stand_in and s.target_threads == self.cores]), notes=notes)


# ---------------------------------------------------------------- what was asked

@dataclass(frozen=True)
class BenchArgs:
    """What `ssd-edge bench` was asked (cli/measuring.py builds it from the flags; the defaults are the flags')."""

    model: str | None = None                     # -m; None: the catalog's default target
    model_draft: str | None = None               # -md; None: the default draft
    models_dir: str | None = None
    output: str = "bench-out"
    modes: tuple[str, ...] = BENCH_MODES
    settings: tuple[str, ...] = ("separate", "shared")
    category: tuple[str, ...] | None = None
    prompts: str | None = None                   # a JSONL prompt file; None: the shipped suite
    max_tokens: int = 128                        # -n/--n-predict: tokens per generation
    k: int | None = None                         # -k/--draft-max; None: the engine's default per mode
    reps: int = 1
    seed: int = 0
    temp: float = 0.0
    ctx_size: int = 2048
    quick: bool = False
    llama_tools: str | None = None
    peer_k: tuple[int, ...] = ()
    no_peer: bool = False
    no_calibrate: bool = False
    recalibrate: bool = False
    no_plot: bool = False
    verbose: bool = False
    rpc: str | None = None                       # --rpc HOST:PORT[,...]: the target on these rpc-servers
    stand_in: str | None = None                  # --stand-in TYPE: the settings again, the target converted to TYPE
    priced: str | None = None                    # --priced TABLE[@AGREEMENT]: a priced pair instead of model files
    agreement: float | None = None               # --agreement: the priced draft's (default 0.95)
    argv: tuple[str, ...] = ()                   # the command line after `bench`, recorded in bench.json

    def checked(self) -> BenchArgs:
        """Validated, with --quick's caps applied and ar (the baseline of every speedup) among the modes."""
        if self.max_tokens < 1:
            raise ConfigError("-n/--n-predict must be at least 1")
        if self.k is not None and not 1 <= self.k <= 32:
            raise ConfigError("-k/--draft-max must be between 1 and 32")
        if self.reps < 1:
            raise ConfigError("--reps must be at least 1")
        if self.temp < 0:
            raise ConfigError("--temp must be >= 0")
        if any(not 1 <= k <= 32 for k in self.peer_k):
            raise ConfigError("--peer-k values must be between 1 and 32")
        from ..models.catalog import DERIVED_KINDS

        if self.stand_in is not None and self.stand_in not in DERIVED_KINDS:
            raise ConfigError(f"--stand-in: choose one of {', '.join(DERIVED_KINDS)}")
        if self.priced is None and self.agreement is not None:
            raise ConfigError("--agreement is the priced draft's: give --priced TABLE with it")
        if self.priced is not None:
            self.priced_pair()  # a table that exists, an agreement in [0, 1]
            given = [f for f, v in (("-m", self.model), ("-md", self.model_draft), ("--stand-in", self.stand_in),
                                    ("--rpc", self.rpc)) if v]
            if given:
                raise ConfigError(f"--priced runs a priced pair, not model files: drop {', '.join(given)}")
        return dataclasses.replace(
            self, max_tokens=min(self.max_tokens, 24) if self.quick else self.max_tokens,
            # a profile prices a target on this device; one over --rpc is not
            no_calibrate=self.no_calibrate or bool(self.rpc),
            peer_k=() if self.quick else self.peer_k,
            modes=self.modes if "ar" in self.modes else ("ar", *self.modes))

    def priced_pair(self):
        """The priced pair --priced names (ssd_edge.priced.Priced), or None."""
        if self.priced is None:
            return None
        from ..priced import Priced

        return Priced.parse(self.priced, self.agreement)


def comma_list(flag: str, text: str, allowed: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """A comma-separated flag value; ConfigError names the flag and what it allows."""
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items:
        raise ConfigError(f"{flag}: empty list")
    bad = [x for x in items if allowed is not None and x not in allowed]
    if bad:
        raise ConfigError(f"{flag}: unknown {', '.join(bad)} (choose from {', '.join(allowed or ())})")
    return items


def _stand_in(target: str, kind: str, models_dir: str | None, console) -> Path:
    """The target converted to `kind` (`ssd-edge models derive`), made now if it is not here yet."""
    from ..models import catalog, derive

    name = catalog.split_variant(target)[0]
    try:
        model = catalog.load_catalog().get(name)
    except SSDEdgeError:
        raise ConfigError(f"--stand-in converts a catalog target; {target!r} is not one") from None
    path = catalog.derived_path(model, kind, Path(models_dir) if models_dir else None)
    if not (path.exists() and derive.provenance_path(path).exists()):
        console.print(f"converting {name} to {kind} for the stand-in runs (`ssd-edge models derive`; once)")
        path, _ = derive.derive(name, kind, Path(models_dir) if models_dir else None)
    return path


def main(args: BenchArgs) -> int:
    """Run the benchmark, write its files, print the brief report; 130 if Ctrl-C cut it short."""
    from rich.console import Console

    from .calibrate import default_pair
    from ..planning.profile import device_info
    from ..models.catalog import resolve_model
    from ..progress import Progress
    from . import pricing as bench_pricing, report as bench_report

    args = args.checked()
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    priced = args.priced_pair()
    if priced is not None:  # no files: the priced models' names stand in their place
        target, draft = (m.path for m in priced.models())
    else:
        target_name, draft_name = default_pair(args.model, args.model_draft, args.models_dir)
        target = resolve_model(target_name, args.models_dir)
        draft = resolve_model(draft_name, args.models_dir)
    stand_in = None
    if args.stand_in:
        stand_in = _stand_in(target_name, args.stand_in, args.models_dir, console)
    out = Path(args.output).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create the output folder {out}: {e.strerror}") from None
    bench = Bench(args, target, draft, stand_in)
    cores = device_info().cores
    machine = machine_info(cores) if priced is None else bench_pricing.machine(priced, cores)
    if machine.load_avg_start[0] > 0.5 * machine.cores:
        console.print(f"[yellow]note:[/] load average {machine.load_avg_start[0]:.2f} on {machine.cores} cores: "
                      "other work is running; numbers will be noisy")
    if priced is not None:
        console.print(f"[yellow]note:[/] {priced.label}: synthetic models waiting a GPU's prices on this CPU, not a "
                      "GPU measurement; one setting, no llama.cpp peer")
    elif bench.peer_bin is None and not args.no_peer:
        console.print("[yellow]note:[/] llama-speculative-simple not found; the llama.cpp column is 'not "
                      "available' (build it with scripts/build_llama_tools.sh)")
    interrupted = False
    with Progress(console) as progress:
        task = progress.task("loading", total=bench.units())
        cal = progress.task("calibrating", visible=False)

        def tick(what: str) -> None:
            if what:
                task.begin(what)
            else:
                task.done()

        def calibrating(what: str, frac: float) -> None:
            cal.at(f"calibrating: {what}", frac, visible=frac < 1.0)

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
