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

A structured prompt (response_format or tools, `--prompts structured`) runs
under its constraint, on the prompt tokens the server would make
(structured/request.py), its answer checked (answers.py); there the peer is
llama-server under the same constraint (peer_server.py: its GBNF with the
same rigid separators, and its default json_schema), one server per setting.

With --priced, the modes run on a priced pair instead (pricing.py): one
setting, no model files, no llama.cpp peer, results labelled with the table.

Writes bench.json (validated against schema.BenchResult), bench.md (tables in
the style of llama-bench) and bench.png (report.py) into --output.

What was asked (the flags, the prompts) is args.py's; the machine's description
machine.py's; one generation, measured, record.py's.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from .. import paths
from ..config import EngineConfig
from ..planning.planner import FIXED_K
from ..errors import ConfigError, SSDEdgeError
from .args import BenchArgs, load_prompts, quick_prompts
from .machine import PortablePaths, hardware_settings, library_versions, machine_info
from .record import Asked, run_one
from .schema import (BenchOptions, BenchPrompt, BenchResult, MachineInfo, ModelInfo, PeerInfo, PeerRecord, RunRecord,
                     Setting)

log = logging.getLogger(__name__)

WARMUP = [{"role": "user", "content": "Say hello in three languages."}]


# ---------------------------------------------------------------- the whole run

Tick = Callable[[str], None]  # called before each unit of work with a description; once more per unit done


class Bench:
    """Runs the plan; `records` and `peer` fill as it goes (so an interrupted run still has its data)."""

    def __init__(self, args: BenchArgs, target: Path, draft: Path, stand_in: Path | None = None) -> None:
        from ..planning.profile import device_info
        from . import peer as bench_peer, peer_server, pricing as bench_pricing

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
        self.server_bin = None if no_peer or not any(p.structured for p in self.prompts) else \
            peer_server.find(args.llama_tools)
        self.asked: dict[str, Asked] = {}  # structured prompts made ready on the setting's engine
        self.t0 = time.perf_counter()

    def units(self) -> int:
        n = sum(len(self.jobs(p)) for p in self.prompts)
        return len(self.settings) * (self.args.reps * n + 1)

    @property
    def peer_k(self) -> int:
        """llama.cpp's draft length: -k, else its default (--spec-draft-n-max 3)."""
        return self.args.k or FIXED_K

    def jobs(self, p: BenchPrompt) -> list[str]:
        """What runs on one prompt: every mode, the llama.cpp peer at -k, and on code prompts its other k;
        on a structured prompt, llama-server under its constraint in both kinds instead."""
        a = self.args
        out = list(a.modes)
        if p.structured:
            return out + ([f"peer:{kind}:0" for kind in ("grammar", "json_schema")] if self.server_bin else [])
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
                self.asked = {p.id: Asked.made(engine, p) for p in self.prompts if p.structured}
                warm = [(BenchPrompt(id="warmup", category="chat", messages=WARMUP), None)]
                warm += [(p.model_copy(update=dict(max_tokens=None)), self.asked[p.id])  # the grammar's paths
                         for p in self.prompts if p.structured][:1]
                for mode in a.modes:
                    for wp, asked in warm:
                        run_one(engine, s.name, mode, wp, rep=-1, seed=a.seed, max_tokens=8 if a.quick else 24,
                                temperature=a.temp, asked=asked)
                tick("")
                self._setting_runs(engine, s, tick)

    def _setting_runs(self, engine, s: Setting, tick: Tick) -> None:
        """Every prompt in every job, rep after rep; llama-server up beside them where it runs."""
        from contextlib import ExitStack
        from . import peer_server, report as bench_report

        a = self.args
        with ExitStack() as stack:
            server = None  # stopped on leaving, Ctrl-C included
            if self.server_bin and self.asked:
                try:
                    server = stack.enter_context(peer_server.LlamaServer(
                        self.server_bin, self.target_of(s), threads=s.target_threads, n_ctx=a.ctx_size))
                except (RuntimeError, OSError) as e:
                    self.peer_errors.append(f"{s.name} {peer_server.BINARY}: {e}")
            for rep in range(a.reps):
                for i, p in enumerate(self.prompts):
                    seed = a.seed + i
                    jobs = self.jobs(p)
                    shift = (i + rep) % len(jobs)
                    for job in jobs[shift:] + jobs[:shift]:  # rotated per prompt: drift hits all modes alike
                        if job.startswith("peer:"):
                            _, kind, k = job.split(":")
                            tick(f"{s.name}: {bench_report.peer_mode(int(k), kind)} · {p.id}")
                            if kind in peer_server.KINDS:
                                self._server_peer(server, s, p, kind, rep, seed)
                            else:
                                self._peer(engine, s, p, kind, int(k), rep, seed)
                        else:
                            tick(f"{s.name}: {job} · {p.id}")
                            self.records.append(run_one(engine, s.name, job, p, rep=rep, seed=seed,
                                                        max_tokens=a.max_tokens, temperature=a.temp,
                                                        asked=self.asked.get(p.id)))
                        tick("")

    def _server_peer(self, server, s: Setting, p: BenchPrompt, kind: str, rep: int, seed: int) -> None:
        from . import peer_server

        if server is None:  # it did not start (peer.errors says why)
            return
        try:
            self.peer_runs.append(peer_server.record(server, self.asked[p.id], p, s.name, kind, rep=rep, seed=seed,
                                                     max_tokens=self.args.max_tokens, temperature=self.args.temp))
        except (RuntimeError, ValueError, OSError) as e:
            self.peer_errors.append(f"{s.name} {p.id} {peer_server.BINARY} {kind}: {e}")

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
        from . import peer as bench_peer, peer_server, pricing as bench_pricing, report as bench_report, report_structured

        a = self.args
        shown = PortablePaths(paths.models_dir(a.models_dir))  # a result names no machine (machine.py)
        machine.load_avg_end = os.getloadavg()
        peer = PeerInfo(
            available=self.peer_bin is not None, binary=shown.path(self.peer_bin) if self.peer_bin else None,
            version=shown.text(bench_peer.version(self.peer_bin)) if self.peer_bin else None,
            note=("llama-speculative-simple --spec-type draft-simple, same models, rendered prompt, threads, "
                  "draft length, --spec-draft-p-min 0, greedy; tokens/s from its 'decoded' line"
                  + ("; llama-lookup (n-gram lookup, the target alone) at the same draft length" if self.lookup_bin
                     else "; llama-lookup not found"))
            if self.peer_bin else bench_pricing.PEER_NOTE if self.priced else
            ("not available: --no-peer" if a.no_peer else
             "not available: llama-speculative-simple not found (scripts/build_llama_tools.sh or --llama-tools DIR)"),
            runs=self.peer_runs, errors=[shown.text(e) for e in self.peer_errors])
        if self.server_bin:
            peer.note += f"; {peer_server.NOTE}"
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
        models = (bench_pricing.models(self.priced) if self.priced else
                  [ModelInfo(role="target", name=self.target.name, path=str(self.target),
                             size=self.target.stat().st_size),
                   ModelInfo(role="draft", name=self.draft.name, path=str(self.draft), size=self.draft.stat().st_size)]
                  + [ModelInfo(role="target", name=f"{p.name} (measuring stand-in)", path=str(p), size=p.stat().st_size)
                     for p in {Path(s.target) for s in self.settings if s.target}])
        return BenchResult(
            created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            command=["ssd-edge", "bench", *(shown.text(x) for x in a.argv)], duration_s=time.perf_counter() - self.t0,
            interrupted=interrupted, machine=machine, libraries=library_versions(),
            models=[m.model_copy(update=dict(path=shown.path(m.path))) for m in models], options=opts,
            settings=[s.model_copy(update=dict(target=shown.path(s.target))) if s.target else s for s in self.settings],
            engine_configs={name: shown.models_of(c) for name, c in self.engine_configs.items()}, prompts=self.prompts,
            profile=self.profile, runs=self.records, peer=peer, summary=summary,
            goals=bench_report.goals(summary, a.modes, [s.name for s in self.settings if s.stand_in and s.target_threads == self.cores])
            + report_structured.goals(summary), notes=notes)


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
    elif bench.peer_bin is None and not args.no_peer and not all(p.structured for p in bench.prompts):
        console.print("[yellow]note:[/] llama-speculative-simple not found; the llama.cpp column is 'not "
                      "available' (build it with scripts/build_llama_tools.sh)")
    if priced is None and bench.server_bin is None and not args.no_peer and any(p.structured for p in bench.prompts):
        console.print("[yellow]note:[/] llama-server not found; no llama.cpp peer on the structured prompts "
                      "(build it with scripts/build_llama_tools.sh)")
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
