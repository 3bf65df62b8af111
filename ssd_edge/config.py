"""Configuration: a few small pydantic models, validated with clear messages.

EngineConfig
├── target: ModelConfig        (path or catalog name, threads, n_gpu_layers)
├── draft:  ModelConfig
├── sampling: SamplingConfig   (temperature, top-k, top-p, min-p, seed)
├── spec: SpecConfig           (draft length k, draft-p-min, n-gram sizes)
└── prespec: PrespecConfig     (SSD: KV-cell budget, confidence floor, policy)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import ConfigError

Mode = Literal["ar", "sd", "lookup", "ssd", "auto"]
MODES: tuple[str, ...] = ("ar", "sd", "lookup", "ssd", "auto")


# ---------------------------------------------------------------- --rpc endpoints (llama/rpc.py probes them)

RPC_PORT = 50052  # rpc-server's default


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    """'HOST:PORT' -> Endpoint; ConfigError naming the text otherwise. IPv6 is not accepted:
    llama.cpp splits an endpoint at its first ':'."""
    raw = text.strip()
    host, sep, port = raw.partition(":")
    if ":" in port or raw.startswith("["):
        raise ConfigError(f"invalid --rpc endpoint {text!r}: IPv6 addresses are not supported by llama.cpp's RPC "
                          "client; use an IPv4 address or a host name")
    if not sep or not host or not port:
        raise ConfigError(f"invalid --rpc endpoint {text!r}: expected HOST:PORT, e.g. 127.0.0.1:{RPC_PORT}")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"invalid --rpc endpoint {text!r}: the port must be a number from 1 to 65535")
    if any(c.isspace() for c in host) or host.startswith("-"):
        raise ConfigError(f"invalid --rpc endpoint {text!r}: bad host name")
    return Endpoint(host, int(port))


def parse_endpoints(text: str | Sequence[str] | None) -> list[Endpoint]:
    """'H:P,H:P' (llama.cpp's --rpc) or a list of 'H:P' -> endpoints, in order, without repeats."""
    if text is None:
        return []
    parts = text.split(",") if isinstance(text, str) else [p for t in text for p in t.split(",")]
    out: list[Endpoint] = []
    for part in parts:
        if not part.strip():
            if isinstance(text, str) and not text.strip():
                return []
            raise ConfigError(f"invalid --rpc {text!r}: an empty endpoint between commas")
        ep = parse_endpoint(part)
        if ep not in out:
            out.append(ep)
    if len(out) > 16:  # GGML_RPC_MAX_SERVERS
        raise ConfigError(f"invalid --rpc: {len(out)} endpoints, llama.cpp takes at most 16")
    return out


KVType = Literal["f16", "q8_0", "q4_0"]  # KV cache types offered (llama.cpp's -ctk/-ctv take these among others)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Strict):
    path: str = Field(description="catalog name or path to a .gguf file")
    threads: int = Field(default=1, ge=1, le=256, description="CPU threads for llama_decode")
    n_gpu_layers: int = Field(default=0, ge=-1, description="layers offloaded to the GPU (-1: all)")
    rpc: list[str] = Field(default_factory=list, description="llama.cpp rpc-servers (HOST:PORT) that take the "
                           "offloaded layers (--rpc); the target only")
    rpc_timeout_s: float = Field(default=60.0, gt=0, description="most seconds one decode may wait on an rpc-server "
                                 "before it is declared lost (a load may take ten times this)")
    # memory (llama.cpp's own flags and defaults): the KV cache's types, flash attention, and how the
    # weights are held (mapped from the file, or read in; locked in RAM or not)
    cache_type_k: KVType = Field(default="f16", description="KV cache type of K (-ctk, -ctkd for the draft)")
    cache_type_v: KVType = Field(default="f16", description="KV cache type of V (-ctv, -ctvd); quantized V needs "
                                 "flash attention")
    flash_attn: Literal["on", "off", "auto"] = Field(default="auto", description="flash attention (-fa); auto: "
                                                     "where the backend supports it")
    mlock: bool = Field(default=False, description="lock the weights in RAM (--mlock)")
    mmap: bool = Field(default=True, description="map the weights from the file (off: --no-mmap reads them in)")

    @model_validator(mode="after")
    def _quantized_v_needs_flash_attention(self) -> "ModelConfig":
        if self.cache_type_v != "f16" and self.flash_attn == "off":
            raise ValueError(f"a quantized V cache ({self.cache_type_v}) needs flash attention: use -fa on or auto, "
                             "or an f16 V cache")
        return self

    @field_validator("rpc")
    @classmethod
    def _endpoints(cls, v: list[str]) -> list[str]:
        try:
            return [str(e) for e in parse_endpoints(v)]
        except ConfigError as e:
            raise ValueError(str(e).removeprefix("invalid --rpc ")) from None


class SamplingConfig(_Strict):
    temperature: float = Field(default=0.0, ge=0.0, le=10.0, description="0 = greedy")
    top_k: int = Field(default=40, ge=0, description="0 = off")
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    min_p: float = Field(default=0.05, ge=0.0, lt=1.0)
    seed: int | None = Field(default=None, description="None = a fresh random seed")
    # the row's shaping before the filters above (structured/shaping.py; OpenAI's meaning): a bias added
    # to chosen tokens' logits, then penalties on tokens the answer already holds
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, description="subtracted once from the logit of "
                                    "every token the answer holds")
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, description="subtracted from a token's logit "
                                     "once per time the answer holds it")
    logit_bias: dict[int, float] = Field(default_factory=dict, description="token id -> added to its logit "
                                         "(-100 bans it, 100 all but forces it)")
    infill: bool = Field(default=False, description="llama.cpp's infill sampler after top-k, top-p and min-p, as "
                         "editors ask for it in /infill (structured/infill_filter.py)")

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, v: dict[int, float]) -> dict[int, float]:
        for t, b in v.items():
            if t < 0:
                raise ValueError(f"token id {t} is negative")
            if not -100.0 <= b <= 100.0:
                raise ValueError(f"the bias of token {t} is {b}; a bias is from -100 to 100")
        return v

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def shapes_rows(self) -> bool:
        """Whether rows change before their draw: a bias, a penalty or the infill sampler."""
        return bool(self.logit_bias) or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.infill


class SpecConfig(_Strict):
    # None: auto drafts as long as this device's verify curve pays for (up to 8 tokens from the draft
    # model, 16 from an n-gram copy; planning/planner.py), the fixed modes 3 (llama.cpp's default)
    k: int | None = Field(default=None, ge=1, le=32, description="most draft tokens per round (--draft-max); "
                          "unset: auto chooses per round up to 8 (draft) or 16 (n-gram), sd, lookup and ssd draft 3")
    k_min: int = Field(default=0, ge=0, le=32, description="rounds with fewer drafted tokens verify none (--draft-min)")
    p_min: float = Field(default=0.0, ge=0.0, lt=1.0,
                         description="stop drafting when the draft's top probability falls below this (--draft-p-min)")
    ngram_min: int = Field(default=2, ge=1, le=8, description="shortest n-gram the lookup drafter matches")
    ngram_max: int = Field(default=4, ge=1, le=16, description="longest n-gram the lookup drafter matches")

    @field_validator("ngram_max")
    @classmethod
    def _order(cls, v: int, info) -> int:
        if v < info.data.get("ngram_min", 1):
            raise ValueError("ngram_max must be >= ngram_min")
        return v


DRAFT_CAP = 8  # most draft-model tokens a round verifies when --draft-max is not given (planning/planner.py)


class PrespecConfig(_Strict):
    """SSD pre-speculation: which verification outcomes to prepare, and when to stop."""

    # The defaults hold a branch for every acceptance length of the longest draft, k + 1 outcomes of k cells
    # each (k = DRAFT_CAP, or --draft-max where given: EngineConfig sizes them). The floor only keeps out the
    # hopeless: how wide a tree grows is the planner's, by time (tree_shape); a confident draft's rejection
    # lengths are priced near 0.005 each, and a floor of 0.02 left them out of the tree (docs/performance.md)
    budget_cells: int = Field(default=(DRAFT_CAP + 1) * DRAFT_CAP, ge=0,
                              description="draft KV cells that branches may hold at once")
    min_confidence: float = Field(default=0.001, ge=0.0, le=1.0,
                                  description="prepare an outcome only if its estimated probability is at least this")
    fanout_max: int = Field(default=DRAFT_CAP + 1, ge=1, le=32,
                            description="most outcomes prepared per round (the window shrinks from it and grows back)")
    fanout_min: int = Field(default=1, ge=1, le=32)
    backup_after_misses: int = Field(default=2, ge=1, description="consecutive misses before the backup speculator is considered")
    rollback_after_misses: int = Field(default=6, ge=1, description="consecutive misses before falling back to plain sd")
    probe_every: int = Field(default=16, ge=1, description="rounds in rolled-back sd before pre-speculation is tried again")
    sla_ms_per_token: float | None = Field(default=None, gt=0, description="cut pre-speculation when latency exceeds this")
    saguaro_factor: float = Field(default=1.0, gt=0.0, le=1.0,
                                  description="SAGUARO sampling: scale of the draft's top candidates in q (1 = off)")
    saguaro_top: int = Field(default=2, ge=1, le=16, description="how many draft candidates SAGUARO down-weights")


class EngineConfig(_Strict):
    target: ModelConfig
    draft: ModelConfig | None = None
    n_ctx: int = Field(default=4096, ge=64, le=1 << 20)
    n_batch: int = Field(default=512, ge=8, le=1 << 16)
    cache_reuse: int = Field(default=0, ge=0, description="--cache-reuse: also reuse cached chunks of at least "
                             "this many tokens that moved in the prompt, shifted (an approximation; 0: off)")
    mode: Mode = "auto"
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    spec: SpecConfig = Field(default_factory=SpecConfig)
    prespec: PrespecConfig = Field(default_factory=PrespecConfig)
    verbose: bool = Field(default=False, description="let llama.cpp print its logs")
    memory_budget: int | None = Field(default=None, ge=1, description="bytes the app may take (--memory-budget): "
                                      "the engine shrinks the context, the KV type, the branch cells, then drops "
                                      "the draft until its estimate fits (memory.fit_budget)")
    threads_follow_mode: bool = Field(default=False, description="re-split threads for each generation's mode "
                                      "(split_threads) instead of the fixed target/draft counts")

    @model_validator(mode="after")
    def _branch_room(self) -> "EngineConfig":
        """Pre-speculation's room not given is sized from the draft length given (--draft-max): a branch
        for each acceptance length, k cells each."""
        k, p = self.spec.k, self.prespec
        if k is not None and k != DRAFT_CAP:
            if "fanout_max" not in p.model_fields_set:
                p.fanout_max = max(min(k + 1, 32), p.fanout_min)
            if "budget_cells" not in p.model_fields_set:
                p.budget_cells = (k + 1) * k
        return self

    @model_validator(mode="after")
    def _draft_local(self) -> "EngineConfig":
        if self.draft is not None and self.draft.rpc:
            raise ValueError("the draft runs on this machine: --rpc applies to the target only")
        return self

    def with_changes(self, **changes) -> "EngineConfig":
        """This config with settings changed by their own names (mode, n_ctx, and the fields of
        sampling, spec and prespec), validated: with_changes(mode="sd", k=6, temperature=0.7)."""
        cfg = self.model_dump()
        for key, value in changes.items():
            section = next((name for name in ("sampling", "spec", "prespec") if key in cfg[name]), None)
            if key in ("mode", "n_ctx"):
                cfg[key] = value
            elif section is not None:
                cfg[section][key] = value
            else:
                raise ConfigError(f"unknown setting '{key}'")
        return EngineConfig.build(**cfg)

    @classmethod
    def build(cls, **kwargs) -> "EngineConfig":
        """Validate and raise ConfigError (one line per problem) instead of ValidationError."""
        try:
            return cls.model_validate(kwargs)
        except ValidationError as e:
            raise ConfigError(describe(e)) from None


def describe(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "config"
        parts.append(f"{loc}: {err['msg']}")
    return "invalid setting: " + "; ".join(parts)


def usable_cores() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def split_threads(mode: str, has_draft: bool, cores: int, target: int | None = None, draft: int | None = None
                  ) -> tuple[int, int]:
    """(target, draft) threads for a mode. In ssd draft and target decode at the same time, so the
    cores are split, the target getting the larger share: 2 cores -> 1 + 1, 4 -> 3 + 1, 8 -> 6 + 2.
    auto splits them the same way only where the target keeps most of its compute (4 cores or
    more; with a calibration profile the engine decides from measurements instead): on fewer, the
    two models alternating with every core each beat them running side by side. Elsewhere they
    take turns (sd) or the target runs alone (ar, lookup), so each gets all cores. Given counts
    are kept."""
    concurrent = has_draft and (mode == "ssd" or (mode == "auto" and cores >= 4))
    if concurrent:
        if target is None:
            d = draft if draft is not None else max(1, cores // 3)
            return max(1, cores - d), d
        return target, draft if draft is not None else max(1, cores - target)
    return (target if target is not None else cores), (draft if draft is not None else cores)
