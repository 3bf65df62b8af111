"""Settings from outside: one table of options, four layers, one EngineConfig.

Every option shared by `generate`, `chat`, `tui` and `serve` is listed once in
options.OPTIONS (flag names follow llama.cpp where they overlap); `bench` and
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
from .options import ENV_PREFIX, OPTIONS, SERVER, SERVER_OPTIONS, Option  # noqa: F401 (settings.OPTIONS)

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib

# EngineConfig field -> option, to name the flag in a validation error.
_FIELD_OPTION = {
    ("target", "threads"): "threads", ("draft", "threads"): "threads_draft",
    ("target", "n_gpu_layers"): "n_gpu_layers", ("draft", "n_gpu_layers"): "n_gpu_layers_draft",
    ("target", "rpc"): "rpc",
    ("target", "cache_type_k"): "cache_type_k", ("target", "cache_type_v"): "cache_type_v",
    ("draft", "cache_type_k"): "cache_type_k_draft", ("draft", "cache_type_v"): "cache_type_v_draft",
    ("target", "flash_attn"): "flash_attn", ("draft", "flash_attn"): "flash_attn",
    ("n_ctx",): "ctx_size", ("n_batch",): "batch_size", ("cache_reuse",): "cache_reuse", ("mode",): "mode",
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
    for option, key in (("batch_size", "n_batch"), ("cache_reuse", "cache_reuse")):
        if s[option] is not None:
            raw[key] = s[option]
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
