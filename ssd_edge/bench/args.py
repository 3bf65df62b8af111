"""What `ssd-edge bench` is asked to do: its flags (BenchArgs, built by cli/measuring.py, checked here
with one clear error per wrong value) and the prompts they select (the suite shipped in
ssd_edge/data/prompts.jsonl, the structured suite ssd_edge/data/structured.jsonl by its name
`structured`, or a JSONL file of the same shape; --quick keeps the shortest per category). A prompt's
response_format or tools are read here as the server reads them (structured/request.py), so a wrong one
fails before anything loads, naming the prompt and the field. run.py runs what this asks."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from typing import Any

from ..errors import ConfigError
from ..structured.constraint import ConstraintError
from ..structured.request import Shape, read as read_shape
from .schema import CATEGORIES, BenchPrompt

BENCH_MODES = ("ar", "sd", "lookup", "ssd", "auto")
FIM_MODES = ("ar", "auto")  # --fim's default
SUITES = {"structured": "data/structured.jsonl"}  # --prompts NAME: a suite shipped in ssd_edge/data
PROMPTS_HELP = ("the prompts: a JSONL file (one {id, category, messages[, max_tokens, response_format, tools, "
                "tool_choice, parallel_tool_calls]} a line, the last four as in OpenAI's API), or 'structured' "
                "for the shipped structured-output suite (a JSON-schema extraction, a tool call, a list, a nested "
                "config); default: the shipped text suite")


# ---------------------------------------------------------------- the flags

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
    fim: bool = False                            # --fim: the completion bench (fim_run.py) instead
    fim_cursors: int = 3                         # --fim-cursors: cursor positions per file
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
        if self.fim:
            self.check_fim()
        elif self.fim_cursors != 3:
            raise ConfigError("--fim-cursors is the completion bench's: give --fim with it")
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

    def check_fim(self) -> None:
        """--fim's own checks: its flags' values, and none of the flags that only the prompt bench reads."""
        if not 1 <= self.fim_cursors <= 50:
            raise ConfigError("--fim-cursors must be between 1 and 50")
        if self.ctx_size < 2048:
            raise ConfigError("-c/--ctx-size: the completion bench needs at least 2048 (its prompts alone take "
                              "1024 and the extra chunks the rest; default 8192)")
        given = [f for f, v in (("--stand-in", self.stand_in), ("--priced", self.priced), ("--rpc", self.rpc),
                                ("--prompts", self.prompts), ("--category", self.category),
                                ("--peer-k", self.peer_k), ("--reps", self.reps != 1)) if v]
        if given:
            raise ConfigError(f"--fim runs its own editing sequence: drop {', '.join(given)}")

    def priced_pair(self):
        """The priced pair --priced names (bench/priced: Priced), or None."""
        if self.priced is None:
            return None
        from .priced import Priced

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


# ---------------------------------------------------------------- the prompts

def load_prompts(path: str | os.PathLike[str] | None = None) -> list[BenchPrompt]:
    """The prompt suite: one JSON object per line (id, category, messages[, max_tokens, response_format,
    tools, tool_choice, parallel_tool_calls]); `path` a file, a shipped suite's name (SUITES), or None: the
    shipped text suite."""
    if path is None or str(path) in SUITES:
        shipped = SUITES.get(str(path), "data/prompts.jsonl")
        text = resources.files("ssd_edge").joinpath(shipped).read_text(encoding="utf-8")
        where = f"ssd_edge/{shipped}"
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
            prompt = BenchPrompt.model_validate_json(line)
        except ValueError as e:
            raise ConfigError(f"{where}, line {n}: not a valid prompt ({str(e).splitlines()[0]})") from None
        try:
            shape_of(prompt)
        except ConstraintError as e:
            raise ConfigError(f"{where}, line {n}, prompt {prompt.id!r}: {e}") from None
        out.append(prompt)
    if not out:
        raise ConfigError(f"{where} holds no prompts")
    return out


def shape_of(prompt: BenchPrompt, template: Any = None) -> Shape | None:
    """What the prompt's answer must look like (None: free), read as the server reads a request; `template`
    the model's chat template where tools are rendered (None: the fields checked alone). ConstraintError
    names the field at fault."""
    if not prompt.structured and prompt.tool_choice is None:
        return None
    return read_shape(prompt.response_format, prompt.tools, prompt.tool_choice, template,
                      True if prompt.parallel_tool_calls is None else prompt.parallel_tool_calls)


def quick_prompts(prompts: list[BenchPrompt]) -> list[BenchPrompt]:
    """One prompt per category, the shortest."""
    best: dict[str, BenchPrompt] = {}
    for p in prompts:
        size = sum(len(m["content"]) for m in p.messages)
        if p.category not in best or size < sum(len(m["content"]) for m in best[p.category].messages):
            best[p.category] = p
    return [best[c] for c in CATEGORIES if c in best]
