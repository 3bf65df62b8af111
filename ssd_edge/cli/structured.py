"""Structured output on the command line: the constraint flags of `generate` and `chat`, the per-token
logprobs of `generate --json --logprobs N`, and how the chat shows an answer that holds JSON or tool calls.

At most one constraint holds every answer of the command:

    --json-schema FILE|JSON   an object that fits the schema: inline JSON (it starts with '{'), else a file
    --strict                  with --json-schema: refuse a keyword llguidance cannot enforce (OpenAI's strict)
    --json-object             any JSON object
    --regex PATTERN           text that matches the whole pattern
    --grammar FILE            a Lark grammar (llguidance's dialect), or llama.cpp's GBNF when FILE ends in .gbnf

The constraint is read and checked here, before a model loads (llguidance compiles it without a vocabulary:
a typo costs no load); the engine checks it again against the model's vocabulary. A bad one is a
ConstraintError naming the flag: one line on stderr, exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Callable, Optional, Sequence

import typer
from rich.console import RenderableType
from rich.json import JSON
from rich.text import Text

from ..errors import ConfigError
from ..structured import Constraint, ConstraintError, Grammar, JsonObject, JsonSchema, Regex, parse_schema
from ..structured import compile as compile_constraint
from ..structured.readable import pretty, readable

PANEL = "Structured output"
MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit, and the engine's

JsonSchemaFlag = Annotated[Optional[str], typer.Option(
    "--json-schema", metavar="FILE|JSON", rich_help_panel=PANEL, show_default=False,
    help="answer with JSON that fits this JSON schema: a .json file, or the schema itself when it starts with '{'")]
JsonObjectFlag = Annotated[bool, typer.Option(
    "--json-object", rich_help_panel=PANEL, help="answer with a JSON object, any object (--json is the stats as JSON)")]
RegexFlag = Annotated[Optional[str], typer.Option(
    "--regex", metavar="PATTERN", rich_help_panel=PANEL, show_default=False,
    help="answer with text that matches the whole pattern (no look-around or back-references)")]
GrammarFlag = Annotated[Optional[str], typer.Option(
    "--grammar", metavar="FILE", rich_help_panel=PANEL, show_default=False,
    help="answer in this grammar: a Lark file (llguidance's dialect), or llama.cpp's GBNF if FILE ends in .gbnf")]
StrictFlag = Annotated[bool, typer.Option(
    "--strict", rich_help_panel=PANEL, help="with --json-schema: refuse a keyword that cannot be enforced "
    "(OpenAI's strict; by default such keywords are left unchecked)")]


def constraint_from(json_schema: str | None = None, json_object: bool = False, regex: str | None = None,
                    grammar: str | None = None, strict: bool = False,
                    check: Callable[[Constraint], Any] | None = None) -> Constraint | None:
    """The constraint the flags ask for (None: none), read and checked; ConfigError when more than one is
    given, ConstraintError (field: the flag) when one is bad. `check` compiles it (default: llguidance
    without a vocabulary)."""
    given = [flag for flag, value in (("--json-schema", json_schema), ("--json-object", json_object),
                                      ("--regex", regex), ("--grammar", grammar)) if value not in (None, False)]
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)}: give at most one of --json-schema, --json-object, --regex, "
                          "--grammar")
    if strict and json_schema is None:
        raise ConfigError("--strict applies to --json-schema, and none was given")
    constraint: Constraint | None = None
    if json_schema is not None:
        constraint = JsonSchema(read_schema(json_schema), strict=strict, field="--json-schema")
    elif json_object:
        constraint = JsonObject(field="--json-object")
    elif regex is not None:
        if not regex:
            raise ConstraintError("--regex", "the pattern is empty")
        constraint = Regex(regex, field="--regex")
    elif grammar is not None:
        syntax = "gbnf" if grammar.lower().endswith(".gbnf") else "lark"
        constraint = Grammar(read_text(grammar, "--grammar"), syntax=syntax, field="--grammar")
    if constraint is not None:
        (check or vocabulary_free_check)(constraint)
    return constraint


def vocabulary_free_check(constraint: Constraint) -> None:
    """Compile `constraint` without a model's vocabulary: what llguidance can say before a model loads
    (a bad schema, regex or grammar), with its own message."""
    compile_constraint(constraint, None)


def read_schema(arg: str) -> dict[str, Any]:
    """--json-schema's argument: the schema itself when it starts with '{', else the file it names."""
    text = arg if arg.lstrip().startswith("{") else read_text(arg, "--json-schema")
    return parse_schema(text, "--json-schema")


def read_text(path: str, flag: str) -> str:
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConstraintError(flag, f"no such file: {path}") from None
    except IsADirectoryError:
        raise ConstraintError(flag, f"{path} is a folder, not a file") from None
    except UnicodeDecodeError as e:
        raise ConstraintError(flag, f"{path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                                    f"{e.start})") from None
    except OSError as e:
        raise ConstraintError(flag, f"cannot read {path}: {e.strerror or e}") from None


# ---------------------------------------------------------------- logprobs

LogprobsFlag = Annotated[Optional[int], typer.Option(
    "--logprobs", metavar="N", show_default=False, rich_help_panel=PANEL,
    help=f"with --json: each answer token's log-probability and its N likeliest alternatives (0-{MAX_LOGPROBS}), "
    "the target's at temperature 1 before bias, penalties, grammar and filters")]


def check_logprobs(n: int | None, json_out: bool) -> None:
    if n is None:
        return
    if not 0 <= n <= MAX_LOGPROBS:
        raise ConfigError(f"invalid --logprobs {n}: must be from 0 to {MAX_LOGPROBS}")
    if not json_out:
        raise ConfigError("--logprobs is written in the --json output: add --json")


def logprobs_json(logprobs: Sequence[Any] | None, piece: Callable[[int], bytes]) -> list[dict[str, Any]] | None:
    """Each answer token's TokenLogprob in OpenAI's shape, with the token ids beside the text:
    [{"id", "token", "bytes", "logprob", "top_logprobs": [{"id", "token", "bytes", "logprob"}, ...]}, ...].
    `token` is the piece's text (invalid UTF-8, half a character, as U+FFFD), `bytes` its exact bytes."""
    if logprobs is None:
        return None

    def entry(token: int, logprob: float) -> dict[str, Any]:
        data = piece(token)
        return {"id": token, "token": data.decode("utf-8", errors="replace"), "bytes": list(data),
                "logprob": logprob}
    return [{**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]} for lp in logprobs]


# ---------------------------------------------------------------- a structured answer, readable

def readable_view(answer: str) -> list[RenderableType]:
    """What the chat prints below a finished answer that holds structure (none for plain text): a JSON
    answer laid out and highlighted, unless the model wrote it so; each tool call as its name and its
    arguments."""
    shape = readable(answer)
    if shape is None:
        return []
    if not shape.calls:
        laid_out = pretty(shape.value)
        return [] if laid_out in answer else [Text("json:", style="dim"), JSON(laid_out)]  # (already so: as is)
    out: list[RenderableType] = []
    for call in shape.calls:
        out.append(Text.assemble(("tool call ", "dim"), (call.name, "bold cyan")))
        out.append(JSON(pretty(call.arguments)))
    return out
