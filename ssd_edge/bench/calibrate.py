"""`ssd-edge calibrate`: measure this device, save a profile for mode `auto`.

What is measured, on the loaded pair (bench/timings.py times the decodes):
  1. step costs: one llama_decode of n = 1 .. k_max + 1 tokens, for the target
     (a verify of k = n - 1 drafted tokens; k_max reaches the planner's longest
     draft) and the draft (a step, a catch-up read, a batch of branches), at each
     thread count worth trying (1, half the cores, all): the fastest of `reps`
     repetitions interleaved over the counts, a one-token step slower on more
     threads measured again;
  2. contention: for each (target threads, draft threads) split, how much the
     target slows while the draft decodes beside it, timed interleaved (a decode
     alone, one beside the busy draft, again and again); a figure below 1 is a
     measuring error and is measured again;
  3. acceptance on a short probe (a code and a prose chat prompt, greedy): the
     draft model's from an `sd` run, the n-gram lookup's from a `lookup` run, the
     SSD hit rate from an `ssd` run.
The profile goes to the user cache (ssd_edge.paths.profiles_dir()), one file per
(device, model pair); the planner's cost model (planning/costs.py) starts from it.
Measured while other work kept cores busy (or with an inversion that stays), it
is saved provisional: used, and measured again at a later quiet first use.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import EngineConfig
from ..engine import Engine
from ..errors import ConfigError
from ..events import FinishEvent
from ..memory import MemoryUse
from ..planning import profile as prof
from ..planning.planner import NGRAM_CAP
from .machine import busy_cores
from .timings import PREFIX, Progress, contention, filler, recheck, step_costs

log = logging.getLogger(__name__)

PROBE = [
    [{"role": "user", "content": "Write a Python function that parses a CSV file into a list of dicts, "
                                 "with type hints and a docstring."}],
    [{"role": "user", "content": "Explain in a short paragraph why the sky looks blue during the day "
                                 "and red at sunset."}],
]


@dataclass
class _Trials:
    """Per-token acceptance counted as trials: each drafted token the target reached is a success
    (accepted) or the one failure that ends the draft. The maximum-likelihood alpha of a capped
    geometric is successes / (successes + failures); the prior counts as `weight` trials."""

    prior: float
    weight: float
    successes: int = 0
    failures: int = 0

    def add(self, successes: int, failures: int) -> None:
        self.successes += successes
        self.failures += failures

    def add_round(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.add(accepted, int(accepted < drafted))

    @property
    def value(self) -> float:
        return (self.successes + self.weight * self.prior) / (self.successes + self.failures + self.weight)


def thread_options(cores: int) -> list[int]:
    """Thread counts worth measuring: one, half the cores, all but one, all."""
    return sorted({1, max(1, cores // 2), max(1, cores - 1), cores})


# ---------------------------------------------------------------- the run

def measure(engine: Engine, *, k_max: int = NGRAM_CAP, reps: int = 3, probe_tokens: int = 48,
            pairs: int = 8, progress: Progress | None = None) -> prof.Profile:
    """Measure `engine`'s pair on this device (its contexts; their thread counts are restored)."""
    if not engine.has_draft:
        raise ConfigError("calibration needs a draft model (-md): the planner prices the draft model's rounds")
    t_start = time.perf_counter()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    busy = busy_cores()
    device = prof.device_info()
    opts = thread_options(device.cores)
    splits = [(t, d) for t in opts for d in opts]
    steps = 2 * len(opts) + len(splits) + 3 * len(PROBE)
    done = 0.0
    tick = progress or (lambda what, frac: None)
    saved = engine.threads
    timer = engine.decode_timer()
    try:
        curves = {name: step_costs(engine, timer, name, opts, k_max, reps,
                                lambda what, frac, at=done + len(opts) * i: tick(what, (at + len(opts) * frac) / steps))
                  for i, name in enumerate(("target", "draft"))}
        done = 2 * len(opts)
        inverted = [name for name, table in curves.items() if recheck(engine, timer, name, table)]
        costs = []
        for t, d in splits:
            tick(f"the target beside the draft, {t}+{d} threads", done / steps)
            engine.use_threads(t, d)
            target_x, draft_x = contention(timer, pairs)
            costs.append(prof.ThreadCosts(target_threads=t, draft_threads=d, target_ms=curves["target"][t],
                                          draft_ms=curves["draft"][d], target_overlap=target_x,
                                          draft_overlap=max(0.5, draft_x)))
            done += 1
        engine.reset()
        probe_steps = iter(range(int(done), steps))
        acceptance = _probe(engine, max(opts), probe_tokens, lambda what: tick(what, next(probe_steps, done) / steps))
    finally:
        engine.use_threads(*saved)
    busy = max(busy, busy_cores())
    provisional = busy >= BUSY_CORES or bool(inverted)
    if provisional:
        log.warning("other work ran while measuring (%.1f cores busy%s): the profile is provisional",
                    busy, f"; {' and '.join(inverted)} one-token steps slower on more threads" if inverted else "")
    tick("done", 1.0)
    return prof.Profile(
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), device=device,
        target=model_id(engine, 0), draft=model_id(engine, 1), k_max=k_max,
        costs=costs, acceptance=acceptance, calibration_s=time.perf_counter() - t_start, load_avg=load,
        busy_cores=round(busy, 2), provisional=provisional,
        memory={**engine.memory().to_dict(), "n_ctx": engine.config.n_ctx}, offload=prof.offload_of(engine.config))


def model_id(engine: Engine, role: int) -> prof.ModelId | None:
    """The target's (role 0) or the draft's (1) id in a profile: its file's name and size, or for a model
    without a file (a priced pair's, held in memory only) its name and the size its info gives."""
    path = engine.model_paths[role]
    if path is None:
        return None
    try:
        return prof.ModelId.of(path)
    except OSError:
        info = engine.model_info[role]
        return prof.ModelId(name=path.name, size=info.size_bytes if info is not None else 0)


BUSY_CORES = 0.5  # other work keeping this much of a core busy makes a measurement provisional
PROVISIONAL_RETRY_S = 900  # a provisional profile is measured again no sooner than this after the last try


def _probe(engine: Engine, threads: int, tokens: int, tick: Callable[[str], None]) -> prof.Acceptance:
    """Greedy acceptance on the probe prompts, one generation per proposer: sd for the draft model's,
    lookup for the n-gram lookup's (and how often it proposes at all), ssd for the hit rate."""
    engine.use_threads(threads, threads)
    # Trials: accepted drafted tokens, and rounds ended by a rejection. The probe's answers rarely
    # repeat text, so its n-gram estimate rests on a handful of proposals: shrink it toward a modest
    # prior (10 trials at 0.3) rather than trust a lucky streak.
    trials = {"sd": _Trials(0.0, 0.0), "lookup": _Trials(0.3, 10.0)}
    rounds = proposed = lookups = hits = 0
    host: list[float] = []  # each generation's host ms per decoded position
    sampling = engine.config.sampling.model_copy(update=dict(temperature=0.0, seed=0))
    for i, messages in enumerate(PROBE):
        prompt = engine.prompt_tokens(messages=messages)
        for mode in ("sd", "lookup", "ssd"):
            tick(f"acceptance probe {i + 1}/{len(PROBE)} ({mode})")
            if mode == "ssd":  # at the split this device would run it: half the cores each
                engine.use_threads(max(1, threads // 2), max(1, threads // 2))
            for ev in engine.generate(tokens=prompt, max_tokens=tokens, mode=mode, sampling=sampling):
                if isinstance(ev, FinishEvent):
                    if ev.stats.host_ms_per_position is not None:
                        host.append(ev.stats.host_ms_per_position)
                    lookups += ev.stats.prespec.lookups if mode == "ssd" else 0
                    hits += ev.stats.prespec.hits if mode == "ssd" else 0
                elif mode in trials:
                    trials[mode].add_round(ev.round.drafted, ev.round.accepted)
                    if mode == "lookup":
                        rounds += 1
                        proposed += ev.round.drafted > 0
            engine.use_threads(threads, threads)
    draft = trials["sd"]
    return prof.Acceptance(alpha=draft.value if draft.successes + draft.failures else 0.5,
                           ngram_alpha=trials["lookup"].value,
                           ngram_proposal_rate=proposed / rounds if rounds else 0.0,
                           hit_rate=hits / lookups if lookups else 0.5,
                           host_ms_per_position=statistics.median(host) if host else None)


def ensure_profile(engine: Engine, *, recalibrate: bool = False, progress: Progress | None = None,
                   **kwargs) -> tuple[prof.Profile, bool]:
    """The saved profile of the engine's pair on this device, measured and saved if missing.
    Returns (profile, measured_now) and sets engine.profile."""
    existing = None if recalibrate else prof.load(*engine.model_paths, prof.offload_of(engine.config))
    if existing is not None:
        engine.profile = existing
        return existing, False
    p = measure(engine, progress=progress, **kwargs)
    prof.save(p)
    engine.profile = p
    return p, True


# The lighter measurement run the first time mode auto meets a pair on a device: the whole verify
# curve once, fewer contention pairs, a short probe. `ssd-edge calibrate` redoes it in full.
FIRST_USE = dict(reps=1, probe_tokens=24, pairs=5)


def needs_first_use(engine: Engine) -> bool:
    """Whether mode auto would run on this engine's pair without a profile of this device, or with a
    provisional one (measured while other work ran) now that the machine is quiet, and the last
    measurement is PROVISIONAL_RETRY_S old: a machine whose other work comes and goes is not
    measured again at every start (live timings steer the threads meanwhile: planning/threads.py)."""
    if not engine.plans_with_profile:
        return False
    try:
        saved = prof.load(*engine.model_paths, prof.offload_of(engine.config))
    except OSError:  # a model without a file (the tests' fakes)
        return False
    return saved is None or (saved.provisional and saved.age_s() >= PROVISIONAL_RETRY_S and busy_cores() < BUSY_CORES)


def calibrate_first_use(engine: Engine, progress: Progress | None = None) -> prof.Profile:
    """Measure and save this device's profile for the engine's pair (FIRST_USE settings). A failure
    or Ctrl-C part way saves nothing: the profile is written whole at the end, or not at all."""
    p, _ = ensure_profile(engine, recalibrate=True, progress=progress, **FIRST_USE)
    if not engine.uses_draft():  # mode auto where no draft can pay (a compute-bound CPU): the target alone
        engine.release_draft()
    return p


# ---------------------------------------------------------------- CLI

def default_pair(model: str | None, model_draft: str | None, models_dir: str | None) -> tuple[str, str]:
    """The pair to measure, chosen as generate chooses it (settings.model_pair): the flags', else the
    catalog's default target, and its default draft (its q4_0 variant once derived) beside it only."""
    from ..settings import model_pair

    target, draft = model_pair(model, model_draft, Path(models_dir) if models_dir else None)
    if draft is None:
        from ..models import vocab
        from ..models.catalog import resolve_model

        vocab.read(resolve_model(target, models_dir))  # a -m that is no GGUF file is named first, as generate does
        raise ConfigError(f"{target} has no default draft (only the catalog's default target has one): "
                          "give its draft with -md/--model-draft")
    return target, draft


def provisional_text(p: prof.Profile) -> str:
    """What a provisional profile means, in one line."""
    busy = f"{p.busy_cores:.1f} cores busy with other work" if p.busy_cores else "other work running"
    return (f"measured with {busy}; used for now, and measured again at the next first use on a quiet "
            "machine (or run ssd-edge calibrate then)")


def _print(p: prof.Profile, path, console) -> None:
    from rich.table import Table

    gpus = f", {p.device.gpus}" if p.device.gpus else ""
    offload = f" at {p.offload}" if p.offload else ""
    console.print(f"[bold]{p.target.name}[/] + draft [bold]{p.draft.name if p.draft else '-'}[/] on "
                  f"{p.device.cpu} ({p.device.cores} cores{gpus}){offload}, measured {p.created} in "
                  f"{p.calibration_s:.0f} s",
                  soft_wrap=True)  # names and paths whole on one line, also in a pipe (rich wraps at 80 there)
    console.print(f"profile: {path}", soft_wrap=True)
    cols = sorted({n for n in (1, 2, 4, 8, p.k_max + 1) if n <= p.k_max + 1})
    t = Table(title="ms per llama_decode of n tokens, each model alone; slowdown x beside the other model")
    t.add_column("t+d")
    for n in cols:
        t.add_column(f"T n={n}", justify="right")
    t.add_column("D n=1", justify="right")
    t.add_column("T x", justify="right")
    t.add_column("D x", justify="right")
    for c in p.costs:
        t.add_row(f"{c.target_threads}+{c.draft_threads}", *[f"{c.target_ms[n - 1]:.0f}" for n in cols],
                  f"{c.draft_ms[0]:.0f}", f"{c.target_overlap:.2f}", f"{c.draft_overlap:.2f}")
    console.print(t)
    if p.provisional:
        console.print(f"[yellow]provisional:[/] {provisional_text(p)}")
    a = p.acceptance
    console.print(f"probe: draft alpha {a.alpha:.2f}, n-gram alpha {a.ngram_alpha:.2f} (proposes in "
                  f"{a.ngram_proposal_rate:.0%} of rounds), SSD hit rate {a.hit_rate:.2f}")
    if a.host_ms_per_position is not None:
        fastest = min(p.costs, key=lambda c: c.target_ms[0], default=None)
        beside = (f", beside a one-token target step of {fastest.target_ms[0]:.2f} ms ({fastest.target_threads} "
                  f"thread{'s' if fastest.target_threads > 1 else ''})" if fastest is not None else "")
        console.print(f"host time per decoded position (outside llama_decode, the probe's median): "
                      f"{a.host_ms_per_position:.3f} ms{beside}")
    cores = p.device.cores
    split = p.split(cores)
    console.print(f"regime: {p.regime()}")
    if p.memory:
        mem = MemoryUse.of(p.memory)
        console.print(f"memory while calibrating (both models, a context of {p.memory.get('n_ctx', '?')} tokens): "
                      f"{mem.describe()}")
    console.print(f"auto on {cores} cores: " + (f"the draft beside the target, {split[0]}+{split[1]} threads (the "
                                                "target keeps its speed beside it)" if split else
                                                "the two models take turns with every core each (the target loses "
                                                "speed beside a busy draft)"))


def main(model: str | None = None, model_draft: str | None = None, models_dir: str | None = None, *,
         k_max: int = NGRAM_CAP, reps: int = 3, probe_tokens: int = 48, quick: bool = False, show: bool = False,
         json_out: bool = False, verbose: bool = False, n_gpu_layers: int | None = None,
         n_gpu_layers_draft: int | None = None) -> int:
    """`ssd-edge calibrate`: measure the pair and save its profile (or, with show, print the saved one), at
    the GPU offload generate would use (-ngl: the whole target where a local GPU is; -ngld: 0)."""
    from rich.console import Console

    from ..models import vocab
    from ..models.catalog import resolve_model
    from ..progress import Progress as Report
    from ..settings import target_gpu_layers

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    out = Console()
    if k_max < 1 or k_max > 16:
        raise ConfigError("--k-max must be between 1 and 16")
    if reps < 1:
        raise ConfigError("--reps must be at least 1")
    if probe_tokens < 1:
        raise ConfigError("-n/--n-predict must be at least 1")
    target, draft = default_pair(model, model_draft, models_dir)
    target_path = resolve_model(target, models_dir)
    draft_path = resolve_model(draft, models_dir)
    vocab.check(target_path, draft_path)  # GGUF files whose vocabularies fit, as generate checks before loading
    cores = prof.device_info().cores
    config = EngineConfig.build(target=dict(path=str(target_path), threads=cores,
                                            n_gpu_layers=target_gpu_layers(n_gpu_layers)),
                                draft=dict(path=str(draft_path), threads=cores, n_gpu_layers=n_gpu_layers_draft or 0),
                                n_ctx=1024, mode="sd", verbose=verbose)
    offload = prof.offload_of(config)
    if show:
        p = prof.load(target_path, draft_path, offload)
        if p is None:
            console.print(f"no profile for {target_path.name} + {draft_path.name} on this device"
                          f"{' at ' + offload if offload else ''}; run ssd-edge calibrate")
            return 1
        if json_out:
            out.print_json(p.model_dump_json())
        else:
            _print(p, prof.profile_path(p.device, p.target, p.draft, p.offload), out)
        return 0
    engine = Engine(config)
    try:
        with Report(console) as report:
            task = report.task("loading")
            p = measure(engine, k_max=k_max, reps=1 if quick else reps, probe_tokens=24 if quick else probe_tokens,
                        pairs=5 if quick else 8, progress=task.at)
    except KeyboardInterrupt:
        console.print("calibration interrupted; no profile saved")
        return 130
    finally:
        engine.close()
    path = prof.save(p)
    if json_out:
        out.print_json(p.model_dump_json())
    else:
        _print(p, path, out)
    return 0
