"""A device profile: what `ssd-edge calibrate` measured on one device for one (target, draft) pair.

The cost of one llama_decode of n tokens for each model at each thread count, how much the target
slows down while the draft decodes beside it (the contention, measured interleaved against the
target alone), and the acceptance seen on a short probe. Measurements only: the planner
(planner.py) turns them into decisions through the one cost model (costs.py), and Profile.costs
is where it starts from. Profile.split says whether the draft should get cores of its own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from pathlib import Path

from pydantic import BaseModel, Field

from .costs import Costs, describe_regime

log = logging.getLogger(__name__)

# 2: contention measured interleaved, never below 1; verify curves up to the planner's caps
PROFILE_VERSION = 2
# The draft gets cores of its own (the pre-speculation worker beside the target) only where the
# target loses at most this much of its plain step's speed by giving them up.
SPLIT_MARGIN = 0.05


# ---------------------------------------------------------------- the profile

class DeviceInfo(BaseModel):
    machine: str
    cpu: str
    cores: int = Field(description="CPU cores this process may run on")
    llama_cpp_python: str
    gpus: str = Field(default="", description="the local GPUs llama.cpp sees, as ggml names them ('' none)")

    @property
    def key(self) -> str:
        raw = f"{self.machine}|{self.cpu}|{self.cores}|{self.llama_cpp_python}" + (f"|{self.gpus}" if self.gpus else "")
        return hashlib.sha256(raw.encode()).hexdigest()[:12]


class ModelId(BaseModel):
    name: str
    size: int

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> "ModelId":
        p = Path(path)
        return cls(name=p.name, size=p.stat().st_size)


class ThreadCosts(BaseModel):
    """Decode costs of both models at one thread count each."""

    target_threads: int
    draft_threads: int
    target_ms: list[float] = Field(description="target_ms[i]: one decode of i + 1 tokens (verify of k = i)")
    draft_ms: list[float] = Field(description="draft_ms[i]: one decode of i + 1 tokens (a step, or a batch of branches)")
    target_overlap: float = Field(ge=1.0, description="target decode time while the draft decodes beside it / alone "
                                  "(interleaved medians; below 1 is a measuring error and is measured again)")
    draft_overlap: float = Field(ge=0.5, description="draft decode time while the target decodes concurrently / alone")

    @property
    def split(self) -> tuple[int, int]:
        return (self.target_threads, self.draft_threads)


class Acceptance(BaseModel):
    """What the probe saw (greedy): the planner's priors, which a generation's live numbers replace."""

    alpha: float = Field(ge=0, le=1, description="draft model: P(accept a drafted token | all before accepted)")
    ngram_alpha: float = Field(ge=0, le=1, description="the same for n-gram (prompt lookup) drafts")
    ngram_proposal_rate: float = Field(ge=0, le=1, description="rounds in which the n-gram drafter proposed anything")
    hit_rate: float | None = Field(default=None, ge=0, le=1,
                                   description="SSD pre-speculation hit rate on the probe")
    host_ms_per_position: float | None = Field(default=None, ge=0, description="the probe's generations' median "
                                               "time outside llama_decode per decoded position (Stats)")


class Profile(BaseModel):
    version: int = PROFILE_VERSION
    created: str
    device: DeviceInfo
    target: ModelId
    draft: ModelId | None
    k_max: int
    costs: list[ThreadCosts]
    acceptance: Acceptance
    calibration_s: float = 0.0
    load_avg: float | None = Field(default=None, description="1-minute load average when calibration began")
    busy_cores: float | None = Field(default=None, description="cores other work kept busy while it measured "
                                     "(the most of the readings before and after the decodes)")
    provisional: bool = Field(default=False, description="measured while other work ran (busy cores, or one-token "
                              "steps slower on more threads after measuring again): used, and measured again at "
                              "the next first use on a quiet machine")
    memory: dict[str, int] | None = Field(default=None, description="bytes by part while calibrating, both "
                                          "models loaded (memory.MemoryUse.to_dict), and the context's size")
    offload: str = Field(default="", description="the GPU offload it was measured at (offload_of; '' none): "
                         "another offload is another profile")

    # ------------------------------------------------------------ reading
    def age_s(self) -> float:
        """Seconds since it was measured (created)."""
        import datetime as dt

        return (dt.datetime.now(dt.timezone.utc) - dt.datetime.fromisoformat(self.created)).total_seconds()

    def at(self, target_threads: int, draft_threads: int | None = None) -> ThreadCosts | None:
        """The costs measured with the target at `target_threads` (and the draft at `draft_threads`)."""
        return next((c for c in self.costs if c.target_threads == target_threads
                     and (draft_threads is None or c.draft_threads == draft_threads)), None)

    def cost_model(self, target_threads: int, draft_threads: int | None, *, offloaded: bool = False,
                   step_ms: float | None = None) -> Costs:
        """The planner's starting costs at this thread split: the target's verify curve, the draft's
        curve, and the contention there (1 for an offloaded target, which a CPU draft does not slow).
        step_ms: a plain step as earlier generations timed it (the curve follows it)."""
        target = self.at(target_threads)
        draft = next((c for c in self.costs if c.draft_threads == draft_threads), None)
        split = self.at(target_threads, draft_threads)
        contention = 1.0 if offloaded else split.target_overlap if split is not None else None
        costs = Costs(target.target_ms if target else None, draft.draft_ms if draft else None,
                      contention=contention)
        if step_ms is not None:
            costs.target.add(1, step_ms)
        return costs

    def split(self, cores: int) -> tuple[int, int] | None:
        """A (target, draft) thread split that lets the draft run beside the target on this device's
        cores, or None where the two should take turns with every core each: a split is taken only
        where the target, beside a busy draft, keeps its plain step within SPLIT_MARGIN of its step
        on every core (a target that is bound by memory bandwidth, not by cores)."""
        full = self.at(cores)
        if full is None:
            return None
        beside = [c for c in self.costs if c.target_threads + c.draft_threads <= cores]
        best = min(beside, key=lambda c: c.target_ms[0] * c.target_overlap, default=None)
        if best is None or best.target_ms[0] * best.target_overlap > full.target_ms[0] * (1 + SPLIT_MARGIN):
            return None
        return best.split

    def regime(self) -> str:
        """What the target's verify curve at the most threads measured means here, in words."""
        top = max(self.costs, key=lambda c: c.target_threads, default=None)
        return describe_regime(top.target_ms) if top is not None else describe_regime([])

    def matches(self, device: DeviceInfo, target: ModelId, draft: ModelId | None, offload: str = "") -> bool:
        return self.version == PROFILE_VERSION and self.device.key == device.key and self.target == target \
            and self.draft == draft and self.offload == offload


# ---------------------------------------------------------------- files

def device_info() -> DeviceInfo:
    from ..llama import backend
    from ..llama.library import local_gpu_names

    try:
        gpus = ", ".join(local_gpu_names())
    except ImportError:  # no compiled llama.cpp (a plain test environment): no GPU it could use
        gpus = ""

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return DeviceInfo(machine=platform.machine(), cpu=cpu or "unknown", cores=cores,
                      llama_cpp_python=backend.llama_cpp_version(), gpus=gpus)


def offload_of(config) -> str:
    """What a profile measured at `config`'s GPU offload is keyed by: '' where every layer runs on the
    CPU (no local GPU, or -ngl 0 and -ngld 0), else the two layer counts as the flags give them. A
    profile measured at one offload says nothing of another, so a changed -ngl/-ngld is calibrated again."""
    from ..llama.library import gpu_offload_supported

    t = config.target.n_gpu_layers
    d = config.draft.n_gpu_layers if config.draft is not None else 0
    if (t == 0 and d == 0) or config.target.rpc or not gpu_offload_supported():
        return ""
    return f"-ngl {t} -ngld {d}"


def profile_path(device: DeviceInfo, target: ModelId, draft: ModelId | None, offload: str = "") -> Path:
    from .. import paths

    pair = f"{target.name}:{target.size}|{draft.name + ':' + str(draft.size) if draft else '-'}"
    if offload:
        pair += f"|{offload}"
    tag = hashlib.sha256(pair.encode()).hexdigest()[:10]
    stem = Path(target.name).stem + ("+" + Path(draft.name).stem if draft else "")
    return paths.profiles_dir() / f"{device.key}-{tag}-{stem[:60]}.json"


def save(profile: Profile) -> Path:
    path = profile_path(profile.device, profile.target, profile.draft, profile.offload)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(profile.model_dump_json(indent=2))
    os.replace(tmp, path)
    return path


def load_for(config, target_path: str | os.PathLike[str], draft_path: str | os.PathLike[str] | None
             ) -> Profile | None:
    """The profile an engine with `config` on these files plans with: none for a target on --rpc
    servers (a profile measures a target on this device, not one across a network), none for a
    model without a file (the tests' fakes), else load()'s."""
    if config.target.rpc:
        log.info("target on rpc servers: the planner plans from what each generation measures")
        return None
    try:
        prof = load(target_path, draft_path, offload_of(config))
    except OSError:
        return None
    if prof is None:
        log.info("no calibration profile for this device and pair (ssd-edge calibrate): "
                 "the planner plans from what each generation measures")
    return prof


def load(target_path: str | os.PathLike[str], draft_path: str | os.PathLike[str] | None, offload: str = ""
         ) -> Profile | None:
    """The saved profile of this device and pair at this GPU offload (offload_of), or None (never
    calibrated, or stale)."""
    device = device_info()
    target = ModelId.of(target_path)
    draft = ModelId.of(draft_path) if draft_path else None
    path = profile_path(device, target, draft, offload)
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text())
        if raw.get("version") != PROFILE_VERSION:
            log.info("the calibration profile %s is of an older version: it is measured again", path)
            return None
        prof = Profile.model_validate(raw)
    except (ValueError, AttributeError) as e:
        log.warning("ignoring unreadable calibration profile %s: %s", path, e)
        return None
    return prof if prof.matches(device, target, draft, offload) else None
