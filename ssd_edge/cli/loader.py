"""Loading the engine for a command: a status line while llama.cpp loads the models, then, the first
time mode auto meets a model pair on this device, the measuring that auto's planner prices rounds with."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..config import EngineConfig
from ..settings import Settings
from . import sources
from .reporting import stderr

log = logging.getLogger("ssd_edge.cli")


def model_label(name_or_path: str) -> str:
    return Path(name_or_path).name if name_or_path.endswith(".gguf") else name_or_path


def describe(cfg: EngineConfig) -> str:
    draft = f" + draft {model_label(cfg.draft.path)}" if cfg.draft else ""
    threads = f"{cfg.target.threads}+{cfg.draft.threads}" if cfg.draft else str(cfg.target.threads)
    return f"{model_label(cfg.target.path)}{draft} · threads {threads}"


def load_engine(cfg: EngineConfig, s: Settings) -> Any:
    from ..engine import Engine  # loads llama.cpp: not needed by `models` or `--help`

    sources.check_pair(cfg.target.path, cfg.draft.path if cfg.draft else None, s.models_dir)  # before loading
    log.debug("loading %s (mode %s, ctx %d)", describe(cfg), cfg.mode, cfg.n_ctx)
    with stderr().status(f"loading {describe(cfg)}…"):
        engine = Engine(cfg, models_dir=str(s.models_dir))
    if engine.budget_plan is not None:
        stderr().print(engine.budget_plan.describe(cfg.memory_budget), highlight=False)
    if not s["no_calibrate"]:
        try:
            calibrate_on_first_use(engine)
        except BaseException:
            engine.close()
            raise
    return engine


def calibrate_on_first_use(engine: Any) -> None:
    """The first time mode auto meets a model pair on this device: measure the device (a lighter run
    than `ssd-edge calibrate`, with a progress bar or lines) and save the profile the planner prices
    rounds with."""
    if not engine.plans_with_profile:  # ar, sd, ...: calibrate (and auto's planning) is not even imported
        return
    from ..bench.calibrate import calibrate_first_use, needs_first_use, provisional_text
    from ..progress import Progress

    if not needs_first_use(engine):
        return
    err = stderr()
    target, draft = engine.model_paths
    pair = f"{model_label(str(target))} + {model_label(str(draft))}"
    if engine.auto_profile() is not None:  # a provisional profile, and the machine is quiet now
        err.print(f"measuring {pair} again for mode auto: the last measurement ran beside other work "
                  "(provisional), and the machine is quiet now")
    else:
        err.print(f"first use of {pair} on this device: measuring it for mode auto (once; `ssd-edge calibrate` "
                  "redoes it, --no-calibrate skips it)")
    try:
        with Progress(err) as progress:
            p = calibrate_first_use(engine, progress.task("calibrating").at)
    except KeyboardInterrupt:
        err.print("calibration interrupted; no profile saved")
        raise
    err.print(f"calibrated in {p.calibration_s:.0f} s")
    if p.provisional:
        err.print(f"[yellow]provisional:[/] {provisional_text(p)}")
