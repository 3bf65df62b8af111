"""Settings from outside: one table of options, four layers, one EngineConfig.

Every option shared by `generate`, `chat`, `tui` and `serve` is listed once in
OPTIONS (flag names follow llama.cpp where they overlap); `bench` and
`calibrate` declare the ones they take from the same table, but read only their
flags. A value comes from the first layer that sets it:

    1. a command-line flag                     --threads 2
    2. an environment variable                 SSD_EDGE_THREADS=2   (SSD_EDGE_MODELS for --models-dir)
    3. the config file (TOML, flat keys)       threads = 2          (--config FILE, SSD_EDGE_CONFIG,
                                                                     or ~/.config/ssd-edge/config.toml)
    4. the default

`resolve()` layers the values and remembers where each came from, so an error
can say "invalid --temp -1 (from SSD_EDGE_TEMP): must be at least 0";
`engine_config()` turns them into a validated EngineConfig.

The faces share it: the command line (cli/) declares its flags from OPTIONS, the
server (server/) checks its settings and requests with it. It reads the catalog
for the default model pair, so it sits beside models/, below every face.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import platformdirs
from pydantic import ValidationError

from . import paths
from .config import MODES, EngineConfig, parse_endpoints, split_threads, usable_cores
from .errors import ConfigError
from .memory import parse_size
from .models.catalog import load_catalog
from .models.derive import default_draft

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib

ENV_PREFIX = "SSD_EDGE_"


@dataclass(frozen=True)
class Option:
    name: str                 # python name and config-file key (dashes or underscores)
    decls: tuple[str, ...]    # flag spellings, e.g. ("-c", "--ctx-size")
    kind: type                # int, float, str, bool or list (of str; the flag repeats)
    help: str
    panel: str
    env: str = ""             # environment variable; default SSD_EDGE_<NAME>

    @property
    def env_var(self) -> str:
        return self.env or ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "/".join(self.decls)


_M, _R, _MEM, _S, _X, _O, SERVER = "Models", "Runtime", "Memory", "Sampling", "Speculation", "Output", "Server"
OPTIONS: dict[str, Option] = {o.name: o for o in [
    Option("model", ("-m", "--model"), str, "target model: a catalog name or a .gguf path (default: the "
           "catalog's default target)", _M),
    Option("model_draft", ("-md", "--model-draft"), str, "draft model: a catalog name (NAME:q4_0 for a variant made by `models "
           "derive-draft`) or a .gguf path (default: the catalog's default draft when the target is the default "
           "target, as its q4_0 variant once derived; else none)", _M),
    Option("hf_repo", ("-hf", "-hfr", "--hf-repo"), str, "target model from the Hugging Face Hub, ORG/REPO[:QUANT] "
           "(QUANT case-insensitive; default Q4_K_M, else the repo's first GGUF), pulled into the models folder "
           "on first use; HF_TOKEN for gated repos, HF_HUB_OFFLINE=1 to use only what is pulled", _M),
    Option("hf_repo_draft", ("-hfd", "-hfrd", "--hf-repo-draft"), str, "draft model from the Hub, as -hf (default "
           "for a Hub target: the smallest draft here that fits it, else none)", _M),
    Option("no_draft", ("--no-draft",), bool, "run without a draft model (modes ar and lookup only)", _M),
    Option("models_dir", ("--models-dir",), str, "folder of pulled models", _M, env="SSD_EDGE_MODELS"),
    Option("n_gpu_layers", ("-ngl", "--n-gpu-layers"), int, "target layers offloaded to a GPU (-1: all, the "
           "default where this build has a local GPU (CUDA, Metal) or with --rpc; else 0; ignored, with a "
           "warning, on a CPU-only build)", _M),
    Option("n_gpu_layers_draft", ("-ngld", "--n-gpu-layers-draft"), int, "draft layers offloaded to a GPU", _M),
    Option("rpc", ("--rpc",), str, "llama.cpp rpc-servers HOST:PORT[,HOST:PORT...] that take the target's "
           "offloaded layers (-ngl; with --rpc it defaults to all); the draft stays here, on a local GPU at most. "
           "No authentication or encryption: trusted networks only (`ssd-edge rpc-server` starts one)", _M),
    Option("threads", ("-t", "--threads"), int, "target threads (default: for ssd, the cores minus the draft's "
           "share, e.g. 1 of 2; for ar, sd and lookup, all cores)", _R),
    Option("threads_draft", ("-td", "--threads-draft"), int, "draft threads (default: for ssd, a third of the "
           "cores, at least 1, since draft and target run at the same time; for sd, all cores, since they take "
           "turns)", _R),
    Option("cache_type_k", ("-ctk", "--cache-type-k"), str, "KV cache type of the target's K: f16, q8_0, q4_0 "
           "(default f16)", _MEM),
    Option("cache_type_v", ("-ctv", "--cache-type-v"), str, "KV cache type of the target's V: f16, q8_0, q4_0 "
           "(default f16; quantized V needs flash attention)", _MEM),
    Option("cache_type_k_draft", ("-ctkd", "--cache-type-k-draft"), str, "KV cache type of the draft's K "
           "(default f16)", _MEM),
    Option("cache_type_v_draft", ("-ctvd", "--cache-type-v-draft"), str, "KV cache type of the draft's V "
           "(default f16)", _MEM),
    Option("flash_attn", ("-fa", "--flash-attn"), str, "flash attention: on, off or auto (default auto: where "
           "the backend has it)", _MEM),
    Option("mlock", ("--mlock",), bool, "lock the models' weights in RAM (never swapped out)", _MEM),
    Option("no_mmap", ("--no-mmap",), bool, "read the weights into memory instead of mapping the files", _MEM),
    Option("memory_budget", ("--memory-budget",), str, "most memory the app may take, e.g. 3G or 800M (default: "
           "no limit): shrinks the context, then the KV type, then the branch cells, then drops the draft, and "
           "says what it chose; refuses when the target alone cannot fit", _MEM),
    Option("ctx_size", ("-c", "--ctx-size"), int, "context size in tokens, prompt and answer together "
           "(default 4096)", _R),
    Option("n_predict", ("-n", "--n-predict"), int, "most tokens to generate; -1: until end of text or a full "
           "context (default: generate 256, tui 512, chat and serve -1)", _R),
    Option("temp", ("--temp",), float, "temperature; 0 = greedy (default 0)", _S),
    Option("top_k", ("--top-k",), int, "top-k sampling (default 40); 0 = off, which samples from each whole "
           "row of the vocabulary: slower (on a GPU, much slower) than the top-k candidates alone", _S),
    Option("top_p", ("--top-p",), float, "top-p sampling, in (0, 1] (default 0.95)", _S),
    Option("min_p", ("--min-p",), float, "min-p sampling, in [0, 1) (default 0.05)", _S),
    Option("seed", ("--seed",), int, "random seed; -1 = random (default -1)", _S),
    Option("presence_penalty", ("--presence-penalty",), float, "subtracted once from the logit of every token the "
           "answer already holds, in [-2, 2] (default 0)", _S),
    Option("frequency_penalty", ("--frequency-penalty",), float, "subtracted from a token's logit once per time "
           "the answer holds it, in [-2, 2] (default 0)", _S),
    Option("logit_bias", ("-l", "--logit-bias"), list, "TOKEN_ID=BIAS (or llama.cpp's TOKEN_ID+BIAS, TOKEN_ID-BIAS) "
           "added to a token's logit, in [-100, 100]; -100 (or -inf) all but bans it (repeatable)", _S),
    Option("mode", ("--mode",), str, "decoding: auto | ar | sd | lookup | ssd (default auto: each round, "
           "a plain step, the n-gram lookup, the draft or a pre-speculated branch, whichever is expected fastest)", _X),
    Option("no_calibrate", ("--no-calibrate",), bool, "do not measure this device the first time mode auto "
           "meets a model pair (auto then prices rounds from what each generation times)", _X),
    Option("draft_max", ("-k", "--draft-max"), int, "most draft tokens per round, k (default: auto plans up to 8 from the draft, 16 from an n-gram copy; sd, lookup, ssd 3)", _X),
    Option("draft_min", ("--draft-min",), int, "rounds with fewer drafted tokens verify none (default 0)", _X),
    Option("draft_p_min", ("--draft-p-min",), float, "stop drafting below this draft probability (default 0)", _X),
    Option("budget_cells", ("--budget-cells",), int, "SSD: draft KV cells that pre-speculated branches may hold "
           "(default 64)", _X),
    Option("stop", ("--stop",), list, "stop at this text (repeatable)", _O),
    Option("config", ("--config",), str, "TOML config file (default ~/.config/ssd-edge/config.toml)", _O),
    Option("verbose", ("-v", "--verbose"), bool, "show llama.cpp's own logs", _O),
    Option("debug", ("--debug",), bool, "show tracebacks and debug logs", _O),
    # `ssd-edge serve` only
    Option("host", ("--host",), str, "address to listen on (default 127.0.0.1, this machine only; any other "
           "needs --api-key)", SERVER),
    Option("port", ("--port",), int, "port to listen on (default 8080; 0: any free port)", SERVER),
    Option("api_key", ("--api-key",), str, "require 'Authorization: Bearer KEY' on every request but /health",
           SERVER),
    Option("max_queue", ("--max-queue",), int, "requests that may wait while one generates; beyond them: 503 "
           "with Retry-After (default 8)", SERVER),
    Option("max_body", ("--max-body",), int, "largest request body in bytes (default 4194304)", SERVER),
]}
SERVER_OPTIONS = [n for n, o in OPTIONS.items() if o.panel == SERVER]

# EngineConfig field -> option, to name the flag in a validation error.
_FIELD_OPTION = {
    ("target", "threads"): "threads", ("draft", "threads"): "threads_draft",
    ("target", "n_gpu_layers"): "n_gpu_layers", ("draft", "n_gpu_layers"): "n_gpu_layers_draft",
    ("target", "rpc"): "rpc",
    ("target", "cache_type_k"): "cache_type_k", ("target", "cache_type_v"): "cache_type_v",
    ("draft", "cache_type_k"): "cache_type_k_draft", ("draft", "cache_type_v"): "cache_type_v_draft",
    ("target", "flash_attn"): "flash_attn", ("draft", "flash_attn"): "flash_attn",
    ("n_ctx",): "ctx_size", ("mode",): "mode",
    ("sampling", "temperature"): "temp", ("sampling", "top_k"): "top_k", ("sampling", "top_p"): "top_p",
    ("sampling", "min_p"): "min_p", ("spec", "k"): "draft_max", ("spec", "k_min"): "draft_min",
    ("spec", "p_min"): "draft_p_min", ("prespec", "budget_cells"): "budget_cells",
    **{("sampling", o): o for o in ("presence_penalty", "frequency_penalty", "logit_bias")},
}

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


def default_config_file() -> Path:
    return Path(platformdirs.user_config_dir("ssd-edge")) / "config.toml"


@dataclass(frozen=True)
class Settings:
    values: Mapping[str, Any]                                 # option name -> value; None: set nowhere
    sources: Mapping[str, str] = field(default_factory=dict)  # option name -> flag, env var or file
    config_file: Path | None = None                           # the file that was read, if any

    def __getitem__(self, name: str) -> Any:
        return self.values.get(name)

    def origin(self, name: str) -> str:
        """' (from SSD_EDGE_TEMP)' when the value did not come from a flag; '' otherwise."""
        src = self.sources.get(name, "")
        return f" (from {src})" if src and not src.startswith("-") else ""

    def invalid(self, name: str, why: str) -> ConfigError:
        opt = OPTIONS[name]
        return ConfigError(f"invalid {opt.flag} {self.values.get(name)!r}{self.origin(name)}: {why}")

    @property
    def models_dir(self) -> Path:
        return paths.models_dir(self["models_dir"])

    def max_tokens(self, default: int, n_ctx: int) -> int:
        """-n/--n-predict as a token count (-1: as many as the context holds)."""
        n = self["n_predict"]
        n = default if n is None else n
        if n == -1:
            return n_ctx
        if n < 1:
            raise self.invalid("n_predict", "must be at least 1, or -1 for no limit")
        return n


# ---------------------------------------------------------------- layering

def _parse(opt: Option, raw: Any, where: str) -> Any:
    """A value from the environment (a string) or the config file (TOML-typed) -> the option's type."""
    bad = ConfigError(f"invalid {opt.flag} {raw!r} (from {where}): expected {_kind_name(opt.kind)}")
    if opt.kind is list:
        if isinstance(raw, str):
            return [raw]
        if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
            return raw
        raise bad
    if isinstance(raw, str) and opt.kind is not str:
        text = raw.strip().lower()
        if opt.kind is bool:
            if text in _TRUE | _FALSE:
                return text in _TRUE
            raise bad
        try:
            return opt.kind(text)
        except ValueError:
            raise bad from None
    if opt.kind is float and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    if type(raw) is not opt.kind:
        raise bad
    return raw


def _kind_name(kind: type) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            list: "a string or a list of strings"}[kind]


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from None
    out = {}
    for key, raw in data.items():
        name = key.replace("-", "_")
        if name not in OPTIONS or name == "config":
            known = ", ".join(sorted(o.replace("_", "-") for o in OPTIONS if o != "config"))
            raise ConfigError(f"unknown setting '{key}' in config file {path} (known: {known})")
        out[name] = _parse(OPTIONS[name], raw, str(path))
    return out


def resolve(flags: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Settings:
    """Layer flags > environment > config file > defaults (None: the default applies later).

    `flags` holds what the command line gave; None (or False for a switch, [] for
    --stop) means "not given"."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, opt in OPTIONS.items():
        given = flags.get(name)
        if given is not None and given is not False and given != []:
            values[name], sources[name] = given, opt.decls[-1]
        elif env.get(opt.env_var) not in (None, ""):
            values[name], sources[name] = _parse(opt, env[opt.env_var], opt.env_var), opt.env_var
    config_file: Path | None = None
    if values.get("config"):
        config_file = Path(values["config"]).expanduser()
        file_values = read_config_file(config_file)
    else:
        config_file = default_config_file()
        file_values = read_config_file(config_file) if config_file.is_file() else {}
        if not file_values:
            config_file = None
    for name, value in file_values.items():
        if name not in values:
            values[name], sources[name] = value, str(config_file)
    return Settings(values, sources, config_file)


# ---------------------------------------------------------------- EngineConfig

def model_pair(model: str | None, model_draft: str | None, models_dir: Path | None,
               no_draft: bool = False) -> tuple[str, str | None]:
    """(target, draft): -m, else the catalog's default target; -md, else the catalog's default draft (its
    q4_0 variant once derived) beside the default target only (it shares that vocabulary), else none."""
    cat = load_catalog()
    target = model or cat.default_target
    if no_draft:
        return target, None
    if model_draft:
        return target, model_draft
    return target, default_draft(models_dir) if target == cat.default_target else None


def engine_config(s: Settings, cores: int | None = None) -> EngineConfig:
    """The EngineConfig the settings describe; ConfigError names the flag at fault."""
    target, draft = model_pair(s["model"], s["model_draft"], s.models_dir, bool(s["no_draft"]))
    mode = s["mode"] or "auto"
    if mode not in MODES:
        raise s.invalid("mode", "choose one of " + ", ".join(MODES))
    if mode in ("sd", "ssd") and draft is None:
        why = "--no-draft was given" if s["no_draft"] else "no draft model is set"
        raise ConfigError(f"--mode {mode} needs a draft model, and {why}: give -md/--model-draft, or --mode ar/lookup")
    t, td = split_threads(mode, draft is not None, cores or usable_cores(), s["threads"], s["threads_draft"])
    seed = s["seed"]
    sampling = {k: v for k, v in (("temperature", s["temp"]), ("top_k", s["top_k"]), ("top_p", s["top_p"]),
                                  ("min_p", s["min_p"]), ("logit_bias", logit_bias(s) or None),
                                  *((p, s[p]) for p in ("presence_penalty", "frequency_penalty"))) if v is not None}
    if seed is not None and seed != -1:
        sampling["seed"] = seed
    spec = {k: v for k, v in (("k", s["draft_max"]), ("k_min", s["draft_min"]), ("p_min", s["draft_p_min"]))
            if v is not None}
    rpc = _rpc_endpoints(s)
    ngl = target_gpu_layers(s["n_gpu_layers"], bool(rpc))
    if s["flash_attn"] == "off":
        for name in ("cache_type_v", "cache_type_v_draft"):
            if s[name] not in (None, "f16"):
                raise ConfigError(f"{OPTIONS[name].flag} {s[name]}{s.origin(name)} needs flash attention, and "
                                  f"{OPTIONS['flash_attn'].flag} is off{s.origin('flash_attn')}: use -fa on or "
                                  "auto, or an f16 V cache")
    memory = {k: v for k, v in (("flash_attn", s["flash_attn"]), ("mlock", s["mlock"] or None),
                                ("mmap", False if s["no_mmap"] else None)) if v is not None}
    kv = {k: v for k, v in (("cache_type_k", s["cache_type_k"]), ("cache_type_v", s["cache_type_v"])) if v is not None}
    kvd = {k: v for k, v in (("cache_type_k", s["cache_type_k_draft"]), ("cache_type_v", s["cache_type_v_draft"]))
           if v is not None}
    raw: dict[str, Any] = dict(
        target=dict(path=target, threads=t, n_gpu_layers=ngl, rpc=rpc, **memory, **kv),
        draft=dict(path=draft, threads=td, n_gpu_layers=s["n_gpu_layers_draft"] or 0, **memory, **kvd)
        if draft else None,
        mode=mode, sampling=sampling, spec=spec, verbose=bool(s["verbose"]),
        # no -t/-td: each generation re-splits the cores for its own mode (/mode in chat, the TUI)
        threads_follow_mode=s["threads"] is None and s["threads_draft"] is None)
    if s["ctx_size"] is not None:
        raw["n_ctx"] = s["ctx_size"]
    if s["memory_budget"] is not None:
        try:
            raw["memory_budget"] = parse_size(str(s["memory_budget"]))
        except ValueError as e:
            raise s.invalid("memory_budget", str(e)) from None
    if s["budget_cells"] is not None:
        raw["prespec"] = {"budget_cells": s["budget_cells"]}
    try:
        return EngineConfig.model_validate(raw)
    except ValidationError as e:
        raise _explain(e, s) from None


def target_gpu_layers(given: int | None, rpc: bool = False) -> int:
    """The target's -ngl: as given, else all of it (-1) on --rpc servers or where a local GPU is, else 0."""
    return given if given is not None else (-1 if rpc or _local_gpu() else 0)


def _local_gpu() -> bool:
    """Whether llama.cpp here can offload to a local GPU (a CUDA or Metal build on a machine with one):
    the target then goes there whole unless -ngl says otherwise, as llama.cpp's and ollama's users expect."""
    try:
        from .llama.library import gpu_offload_supported
    except ImportError:  # no compiled llama.cpp: loading a model says so
        return False
    return gpu_offload_supported()


def logit_bias(s: Settings) -> dict[int, float]:
    """-l/--logit-bias TOKEN_ID=BIAS or llama.cpp's TOKEN_ID+BIAS, TOKEN_ID-BIAS as {token: bias} (inf: 100)."""
    out: dict[int, float] = {}
    for item in s["logit_bias"] or []:
        if not (m := re.fullmatch(r"\s*(\d+)\s*(?:=\s*([+-]?)|([+-]))\s*(inf|\d+\.?\d*|\.\d+)\s*", item, re.I)):
            raise s.invalid("logit_bias", f"{item!r} is not TOKEN_ID=BIAS (or TOKEN_ID+BIAS, TOKEN_ID-BIAS)")
        out[int(m[1])] = (-1 if "-" in (m[2], m[3]) else 1) * (100.0 if m[4].lower() == "inf" else float(m[4]))
    return out


def _rpc_endpoints(s: Settings) -> list[str]:
    """--rpc (llama.cpp's comma-separated form) as a list of 'HOST:PORT'."""
    try:
        return [str(e) for e in parse_endpoints(s["rpc"])]
    except ConfigError as e:
        raise ConfigError(f"{e}{s.origin('rpc')}") from None


def reason(e: ValidationError) -> str:
    """The first validation error in words: 'must be at least 1', 'choose one of ar, sd, ...'."""
    err = e.errors()[0]
    ctx = err.get("ctx", {})
    return {
        "greater_than_equal": f"must be at least {ctx.get('ge')}",
        "greater_than": f"must be greater than {ctx.get('gt')}",
        "less_than_equal": f"must be at most {ctx.get('le')}",
        "less_than": f"must be less than {ctx.get('lt')}",
        "literal_error": "choose one of " + str(ctx.get("expected", ", ".join(MODES))).replace("'", "").replace(" or ", ", "),
    }.get(err["type"], err["msg"]).removeprefix("Value error, ")


def _explain(e: ValidationError, s: Settings) -> ConfigError:
    """The first validation error, phrased with the flag the user typed."""
    loc = tuple(str(x) for x in e.errors()[0]["loc"])
    name = _FIELD_OPTION.get(loc)
    why = reason(e)
    if name is None:
        return ConfigError(f"invalid setting {'.'.join(loc)}: {why}")
    return s.invalid(name, why)
