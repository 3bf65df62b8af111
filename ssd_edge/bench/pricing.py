"""`ssd-edge bench --priced TABLE[@AGREEMENT]`: the bench's modes on a priced pair (bench/priced/)
instead of model files: a synthetic target and draft whose decodes wait what one llama_decode of that
size took on a GPU. Every result is labelled with the table (Priced.label: "priced: H200 table ..."),
never as a measured GPU.

One setting, `priced`, at 1+1 threads: a price does not depend on the host's threads, and with a
thread each the draft's worker runs beside the target, as a GPU pair's does. llama.cpp's own runs
(the peer) need model files and are skipped. Mode auto plans from a profile that calibrate.measure
takes on the priced engine itself (seconds: its decodes take milliseconds), held in memory: the
device's saved profiles are neither read nor written.
"""

from __future__ import annotations

import os
import platform

from ..planning import profile as prof
from ..planning.costs import describe_regime
from ..planning.planner import NGRAM_CAP
from .priced import Priced
from .calibrate import measure
from .timings import PREFIX, Progress, filler
from .schema import MachineInfo, ModelInfo, Setting

NAME = "priced"
PEER_NOTE = "not available: a priced pair has no model files for llama.cpp's own tools"


def setting(p: Priced) -> Setting:
    """The one setting of a priced run; its curve is the table's (what a verify of 0..16 waits)."""
    curve = [p.prices.target.ms(n) for n in range(1, NGRAM_CAP + 2)]
    return Setting(name=NAME, target_threads=1, draft_threads=1, verify_ms=curve,
                   regime=f"{p.label}: {describe_regime(curve)}",
                   description=f"{p.label}: each decode waits its price on this CPU; threads change no price "
                               "(1+1: the draft's worker beside the target, as on a GPU)")


def calibrate(engine, p: Priced, progress: Progress | None = None) -> prof.Profile:
    """The priced pair's profile, measured on `engine` (at `ssd-edge calibrate`'s full settings, also under
    --quick: it takes seconds) and set as its profile, in memory only. Every size is decoded a few times
    first, untimed: the process's first blocks of rows fault their pages in, later ones reuse them, and the
    curve measured first (the target's at one thread, which the priced setting plans with) would carry that."""
    timer = engine.decode_timer()
    for model in ("target", "draft"):
        for n in range(1, NGRAM_CAP + 2):
            timer.decode_ms(model, PREFIX, filler(n), reps=3)
    measured = measure(engine, progress=progress)
    dev = measured.device
    device = prof.DeviceInfo(machine=NAME, cpu=f"{p.label} (host: {dev.cpu})", cores=dev.cores,
                             llama_cpp_python="not used")
    engine.profile = measured.model_copy(update=dict(device=device))
    return engine.profile


def machine(p: Priced, cores: int) -> MachineInfo:
    import psutil

    return MachineInfo(os=platform.platform(), machine=platform.machine(),
                       cpu=prof.device_info().cpu, cores=cores, ram_gib=round(psutil.virtual_memory().total / 2**30, 1),
                       python=platform.python_version(), llama_system_info="not used (a priced pair)",
                       load_avg_start=os.getloadavg(), priced=p.label)


def models(p: Priced) -> list[ModelInfo]:
    return [ModelInfo(role=m.role, name=m.path.name, path=str(m.path), size=m.info().size_bytes) for m in p.models()]
