"""A device profile and the expected-throughput model behind mode `auto`.

A Profile holds what `ssd-edge calibrate` measured on one device for one
(target, draft) pair: the cost of one llama_decode of n tokens for each model
at each thread count, how much each slows down while the other decodes at the
same time, and the acceptance seen on a short probe. `Profile.choose(config)`
turns that into a Choice (mode, k, thread split, most outcomes pre-speculated) by
maximising expected tokens per second. Mode `auto` uses the profile twice: to
decide whether the draft runs beside the target (the thread split) and as the
round planner's verify-cost curve (planner.py), which then re-decides every
round from what the generation measures.

The maths are pure functions on plain numbers (tested with a fake cost model):

    E[tokens/round] = (1 - alpha^(k+1)) / (1 - alpha)          sd, ssd, lookup
    hit             = alpha^k unless measured                  ssd
    sd     : time/round = k * draft(1) + verify(k)
    ssd    : time/round = max(verify'(k), k * draft'(1))        (both run at once)
                          + (1 - hit) * k * draft(1)            (a miss drafts just in time)
    lookup : time/round = verify(expected n-gram length)
    ar     : 1 / verify(0)

verify(k) is the target decoding k + 1 tokens; a prime marks a cost measured
while the other model decodes at the same time (on a CPU the two share memory
bandwidth, and on shared threads the cores themselves).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from ..config import EngineConfig

log = logging.getLogger(__name__)

PROFILE_VERSION = 1
FIXED_MODES = ("ar", "sd", "lookup", "ssd")
# Speculation must be expected to beat plain decoding by this much to be chosen: ar is the
# safe baseline, and an estimate a few percent above it is within the model's error.
AR_MARGIN = 0.08


# ---------------------------------------------------------------- pure maths

def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens per round] with k drafted tokens, each accepted with probability alpha
    given all before it were: 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)."""
    alpha = min(max(alpha, 0.0), 1.0)
    if alpha >= 1.0 - 1e-12:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def alpha_from_mean_accepted(mean_accepted: float, k: float) -> float:
    """Invert E[accepted] = alpha (1 - alpha^k) / (1 - alpha) (capped geometric) by bisection."""
    if k <= 0 or mean_accepted <= 0:
        return 0.0
    if mean_accepted >= k:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens(mid, int(round(k))) - 1.0 < mean_accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def interp_ms(costs: list[float], n: float) -> float:
    """Cost of a decode of n tokens from costs[i] = ms for i + 1 tokens (linear between, beyond the end)."""
    if not costs:
        raise ValueError("no costs measured")
    if n <= 1:
        return costs[0]
    if n >= len(costs):
        if len(costs) == 1:
            return costs[0] * n
        slope = (costs[-1] - costs[-2])
        return costs[-1] + slope * (n - len(costs))
    lo = int(n) - 1
    frac = n - int(n)
    return costs[lo] + frac * (costs[lo + 1] - costs[lo])


def ar_rate(verify_ms: list[float]) -> float:
    """Tokens per second of plain decoding: one target step per token."""
    return 1000.0 / verify_ms[0]


def sd_rate(alpha: float, k: int, draft_ms: float, verify_ms: list[float]) -> float:
    """Draft k tokens one by one, then verify them in one batch of k + 1."""
    return 1000.0 * expected_tokens(alpha, k) / (k * draft_ms + interp_ms(verify_ms, k + 1))


def ssd_rate(alpha: float, k: int, hit: float, draft_ms: float, verify_overlap_ms: list[float],
             draft_overlap_ms: float) -> float:
    """The draft prepares the next round (k decodes per branch) while the target verifies;
    a miss (probability 1 - hit) first drafts k tokens just in time."""
    hit = min(max(hit, 0.0), 1.0)
    both_ms = max(interp_ms(verify_overlap_ms, k + 1), k * draft_overlap_ms)  # verify and drafting side by side
    return 1000.0 * expected_tokens(alpha, k) / (both_ms + (1.0 - hit) * k * draft_ms)


def expected_hit_rate(alpha: float, k: int) -> float:
    """SSD hit rate when none was measured: the worker prepares the all-accepted outcome first,
    so a round hits about as often as all k drafts are accepted. Measured on the bench's ssd runs
    (k = 3): accepted/drafted 0.98, 0.82, 0.47, 0.37 gave hit rates 0.93, 0.61, 0.00, 0.07."""
    return min(max(alpha, 0.0), 1.0) ** k


def lookup_rate(ngram_alpha: float, proposal_rate: float, k: int, verify_ms: list[float]) -> float:
    """Prompt lookup: free drafts, but only `proposal_rate` of rounds find an n-gram to propose."""
    p = min(max(proposal_rate, 0.0), 1.0)
    tokens = 1.0 + p * (expected_tokens(ngram_alpha, k) - 1.0)
    ms = (1.0 - p) * verify_ms[0] + p * interp_ms(verify_ms, k + 1)
    return 1000.0 * tokens / ms


def prespec_fanout(k: int, draft_ms: list[float], verify_overlap_ms: list[float], draft_overlap_factor: float,
                   most: int) -> int:
    """The most outcomes worth preparing per round: the likeliest branch alone, then the others
    together in one batch per depth step, all within the time of the target's verify."""
    verify_ms = interp_ms(verify_overlap_ms, k + 1)
    best = 1
    for w in range(2, most + 1):
        cost = k * draft_overlap_factor * (draft_ms[0] + interp_ms(draft_ms, w - 1))
        if cost > verify_ms:
            break
        best = w
    return best


def pick(cands: list["Choice"], cost, margin: float = AR_MARGIN) -> "Choice":
    """The candidate of least cost (ties: the simpler mode, the smaller k); an `ar` candidate
    wins unless another costs less by more than `margin`."""
    order = {m: i for i, m in enumerate(FIXED_MODES)}
    best = min(cands, key=lambda c: (round(cost(c), 9), order[c.mode], c.k))
    plain = [c for c in cands if c.mode == "ar"]
    if best.mode != "ar" and plain:
        ar = min(plain, key=cost)
        if cost(best) * (1 + margin) > cost(ar):
            return ar
    return best


# ---------------------------------------------------------------- the profile

class DeviceInfo(BaseModel):
    machine: str
    cpu: str
    cores: int = Field(description="CPU cores this process may run on")
    llama_cpp_python: str

    @property
    def key(self) -> str:
        raw = f"{self.machine}|{self.cpu}|{self.cores}|{self.llama_cpp_python}"
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
    target_overlap: float = Field(ge=0.5, description="target decode time while the draft decodes concurrently / alone")
    draft_overlap: float = Field(ge=0.5, description="draft decode time while the target decodes concurrently / alone")
    draft_prefill_ms: float | None = Field(default=None, description="draft ms per token of a 64-token prompt batch")

    def catch_up_ms(self, tokens: int) -> float:
        """What it costs the draft to read `tokens` of history it has not seen (switching into sd/ssd)."""
        per_token = self.draft_prefill_ms or self.draft_ms[-1] / len(self.draft_ms)
        return tokens * per_token

    @property
    def split(self) -> tuple[int, int]:
        return (self.target_threads, self.draft_threads)


class Acceptance(BaseModel):
    """What the probe saw (greedy); the live numbers of a generation replace these as they come."""

    alpha: float = Field(ge=0, le=1, description="draft model: P(accept a drafted token | all before accepted)")
    ngram_alpha: float = Field(ge=0, le=1, description="the same for n-gram (prompt lookup) drafts")
    ngram_proposal_rate: float = Field(ge=0, le=1, description="rounds in which the n-gram drafter proposed anything")
    hit_rate: float | None = Field(default=None, ge=0, le=1,
                                   description="SSD pre-speculation hit rate; None: expected_hit_rate(alpha, k)")


class Choice(BaseModel):
    mode: Literal["ar", "sd", "lookup", "ssd"]
    k: int
    target_threads: int
    draft_threads: int
    fanout_max: int = Field(description="most pre-speculated outcomes per round (the policy's window grows up to it)")
    expected_tokens_per_s: float
    assumed: Acceptance

    def apply(self, config: EngineConfig) -> EngineConfig:
        """The engine config that runs this choice."""
        cfg = config.model_dump()
        cfg["mode"] = self.mode
        if self.mode != "ar":  # ar drafts nothing; spec.k stays as configured (>= 1)
            cfg["spec"]["k"] = self.k
        cfg["target"]["threads"] = self.target_threads
        if cfg.get("draft") is not None:
            cfg["draft"]["threads"] = self.draft_threads
        cfg["prespec"]["fanout_max"] = max(self.fanout_max, cfg["prespec"]["fanout_min"])
        return EngineConfig.build(**cfg)


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

    # ------------------------------------------------------------ decisions
    def rates(self, config: EngineConfig, live: Acceptance | None = None) -> list[Choice]:
        """Every candidate (mode, k, thread split) allowed by `config`, with its expected tokens/s.

        A model never gets more threads than the config gives it. Modes that run the two models
        one after the other may give each all its threads; `ssd` runs both at once, so a split
        whose threads add up to more than the device's cores is priced with its measured
        oversubscription slowdown (the `overlap` factors)."""
        # The probe's hit rate was measured at the probe's acceptance; derive it from alpha instead.
        acc = live or self.acceptance.model_copy(update=dict(hit_rate=None))
        k_top = self.k_max
        t_cap = config.target.threads
        d_cap = config.draft.threads if config.draft is not None else 0
        out: list[Choice] = []
        for c in self.costs:
            if c.target_threads > t_cap or (config.draft is not None and c.draft_threads > d_cap):
                continue
            has_draft = config.draft is not None and self.draft is not None
            own = Choice(mode="ar", k=0, target_threads=c.target_threads, draft_threads=c.draft_threads, fanout_max=1,
                         expected_tokens_per_s=ar_rate(c.target_ms), assumed=acc)
            out.append(own)
            for k in range(1, k_top + 1):
                out.append(own.model_copy(update=dict(
                    mode="lookup", k=k,
                    expected_tokens_per_s=lookup_rate(acc.ngram_alpha, acc.ngram_proposal_rate, k, c.target_ms))))
                if not has_draft:
                    continue
                out.append(own.model_copy(update=dict(
                    mode="sd", k=k, expected_tokens_per_s=sd_rate(acc.alpha, k, c.draft_ms[0], c.target_ms))))
                v_over = [x * c.target_overlap for x in c.target_ms]
                hit = acc.hit_rate if acc.hit_rate is not None else expected_hit_rate(acc.alpha, k)
                out.append(own.model_copy(update=dict(
                    mode="ssd", k=k,
                    fanout_max=prespec_fanout(k, c.draft_ms, v_over, c.draft_overlap, config.prespec.fanout_max),
                    expected_tokens_per_s=ssd_rate(acc.alpha, k, hit, c.draft_ms[0], v_over,
                                                   c.draft_ms[0] * c.draft_overlap))))
        return out

    def choose(self, config: EngineConfig, live: Acceptance | None = None, margin: float = AR_MARGIN) -> Choice:
        """The candidate with the highest expected tokens/s (ties: the simpler mode, the smaller k),
        unless it beats the best `ar` by less than `margin`: then that `ar`."""
        cands = self.rates(config, live)
        if not cands:
            raise ValueError("the profile has no costs for the configured thread counts")
        return pick(cands, lambda c: 1.0 / c.expected_tokens_per_s, margin)

    def matches(self, device: DeviceInfo, target: ModelId, draft: ModelId | None) -> bool:
        return self.version == PROFILE_VERSION and self.device.key == device.key and self.target == target \
            and self.draft == draft


# ---------------------------------------------------------------- files

def device_info() -> DeviceInfo:
    from ..llama import backend

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
                      llama_cpp_python=backend.llama_cpp_version())


def profile_path(device: DeviceInfo, target: ModelId, draft: ModelId | None) -> Path:
    from .. import paths

    pair = f"{target.name}:{target.size}|{draft.name + ':' + str(draft.size) if draft else '-'}"
    tag = hashlib.sha256(pair.encode()).hexdigest()[:10]
    stem = Path(target.name).stem + ("+" + Path(draft.name).stem if draft else "")
    return paths.profiles_dir() / f"{device.key}-{tag}-{stem[:60]}.json"


def save(profile: Profile) -> Path:
    path = profile_path(profile.device, profile.target, profile.draft)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(profile.model_dump_json(indent=2))
    os.replace(tmp, path)
    return path


def load(target_path: str | os.PathLike[str], draft_path: str | os.PathLike[str] | None) -> Profile | None:
    """The saved profile of this device and pair, or None (never calibrated, or stale)."""
    device = device_info()
    target = ModelId.of(target_path)
    draft = ModelId.of(draft_path) if draft_path else None
    path = profile_path(device, target, draft)
    if not path.exists():
        return None
    try:
        prof = Profile.model_validate_json(path.read_text())
    except ValueError as e:
        log.warning("ignoring unreadable calibration profile %s: %s", path, e)
        return None
    return prof if prof.matches(device, target, draft) else None
