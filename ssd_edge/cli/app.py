"""The typer app: the root group and its `models` group, the epilog every engine command shows,
and how the options of the shared table (settings.OPTIONS) reach a command (`with_options`).

The commands register themselves on `app` from their modules (generation, catalog, serving,
measuring); commands.py imports them all and runs the app."""

from __future__ import annotations

import functools
import inspect
from typing import Annotated, Any, Callable, Optional

import typer
from typer.core import TyperOption

from .. import settings
from ..settings import OPTIONS

EPILOG = """\
[bold]Settings[/] come from, first to last: flags; environment variables SSD_EDGE_<NAME> (the long flag in \
capitals, dashes as underscores: SSD_EDGE_CTX_SIZE, SSD_EDGE_MODE, SSD_EDGE_THREADS; SSD_EDGE_MODELS for \
--models-dir); the config file (--config FILE, SSD_EDGE_CONFIG, or ~/.config/ssd-edge/config.toml: flat TOML \
keys named like the long flags, e.g. ctx-size = 8192); the defaults.

[bold]Threads[/] by default: in ssd mode draft and target decode at the same time, so the cores are split \
(2 cores: target 1 + draft 1; 4: 3 + 1; 8: 6 + 2); in ar, sd and lookup each model gets all cores. auto \
splits them only where the draft running beside the target pays (4 cores or more, or as the calibration \
profile measured); on fewer the two models take turns, each with every core.

[bold]Exit codes[/]: 0 ok · 1 other error · 2 bad usage or config · 3 model error · 4 fetch error · \
5 context full · 6 decode error · 7 rpc server unreachable or lost · 130 interrupted (Ctrl-C) · 143 terminated (SIGTERM) · 141 output pipe closed."""


def _switches_without_a_type() -> None:
    """Typer's rich help (0.2x) writes a type after every option, switches too ("--help <bool>"), where its
    plain help, like click's, writes none for a switch: the rich help does the same here."""
    display = getattr(TyperOption, "display_type_rich", None)
    if display is None:  # an older typer: no types in the rich help
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else display(self, ctx)
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_switches_without_a_type()
app = typer.Typer(
    name="ssd-edge", help="Speculative speculative decoding (SSD) of GGUF models on edge devices.",
    epilog=EPILOG, add_completion=False, invoke_without_command=True, pretty_exceptions_enable=False,
    rich_markup_mode="rich", context_settings={"help_option_names": ["-h", "--help"]})
models_app = typer.Typer(help="The models: list, pull (the catalog's, or GGUFs from the Hugging Face Hub), pair, "
                         "derive, rm.", epilog=EPILOG, no_args_is_help=True, rich_markup_mode="rich",
                         context_settings={"help_option_names": ["-h", "--help"]})
app.add_typer(models_app, name="models")

ENGINE_OPTIONS = [n for n in OPTIONS if n not in settings.SERVER_OPTIONS]
FILE_OPTIONS = ["models_dir", "config", "debug"]


def _parameter(name: str, help: str | None = None) -> inspect.Parameter:
    opt = OPTIONS[name]
    decl = typer.Option(*opt.decls, help=help or opt.help, rich_help_panel=opt.panel, show_default=False)
    if opt.kind is bool:
        annotation, default = Annotated[bool, decl], False
    elif opt.kind is list:
        annotation, default = Annotated[Optional[list[str]], decl], None
    else:
        annotation, default = Annotated[Optional[opt.kind], decl], None
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def with_options(names: list[str], helps: dict[str, str] | None = None
                 ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the listed settings.OPTIONS to a command; they reach it as one `flags` dict (None, or False
    for a switch: not given). `helps` rewords an option whose default differs in this command."""
    shared = [_parameter(n, (helps or {}).get(n)) for n in names]

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.name != "flags"]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            flags = {n: kwargs.pop(n) for n in names}
            return fn(**kwargs, flags=flags)

        command.__signature__ = inspect.Signature(own + shared)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in own + shared}
        return command
    return decorate
