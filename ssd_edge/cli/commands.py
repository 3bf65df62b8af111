"""ssd-edge on the command line.

    ssd-edge models list [--json]         catalog models, and which are here
    ssd-edge models pull [NAME...]        fetch models (default: the default pair; hf:ORG/REPO[:QUANT] from the Hub)
    ssd-edge models pair TARGET           the drafts here that fit TARGET, smallest first
    ssd-edge models rm NAME...            delete pulled models
    ssd-edge models derive-draft [NAME]   requantize a draft on this device (faster on AVX-512 CPUs)
    ssd-edge generate "PROMPT"            stream a completion (PROMPT omitted or -: read stdin)
    ssd-edge chat                         chat in the terminal
    ssd-edge serve                        an OpenAI-compatible server (chat, completions, /metrics)
    ssd-edge tui                          the full-screen app (also: ssd-edge with no command)
    ssd-edge bench                        benchmark the modes on the prompt suite (bench.json, .md, .png)
    ssd-edge calibrate                    measure this device for mode auto (a profile)
    ssd-edge rpc-server                   llama.cpp's rpc-server: this machine's CPU for another's --rpc

Exit codes (SSDEdgeError.exit_code in errors.py):
    0 ok                    4 fetch error (network, package, checksum, disk full)
    1 other error           5 context full (prompt too long, or the answer cut off)
    2 bad usage or config   6 decode error (llama.cpp, or SSD's draft side, failed)
    3 model error           7 rpc server unreachable or lost (--rpc)
                            130 interrupted (Ctrl-C), 143 terminated (SIGTERM)
                            141 output pipe closed

Settings (settings.py): flags > SSD_EDGE_<NAME> environment variables > config
file > defaults (bench and calibrate: their flags only). A flag means the same
in every command that takes it (one table, settings.OPTIONS): -n, -m, -md, -k...
Errors print one line; --debug adds the traceback. Long commands report
progress on stderr: a bar on a terminal, plain lines in a log.

This module is the console script: the root command, run() and main(). The
commands live by group: generation.py (generate, chat, tui), serving.py (serve,
rpc-server), measuring.py (bench, calibrate), catalog.py (models ...); app.py
holds the typer app and the shared options, loader.py loads an engine,
reporting.py turns failures into one line and an exit code.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.markup import escape

try:  # typer >= 0.22 vendors click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover
    from click.exceptions import ClickException

# Each module registers its commands on `app` when imported; the order is the order of --help.
from . import generation, serving, measuring, catalog  # noqa: F401  (isort: skip)
from .app import app
from .generation import open_tui
from .reporting import stderr
from .signals import terminate_as_interrupt


@app.callback()
def root(ctx: typer.Context,
         version: Annotated[bool, typer.Option("--version", help="print the version and exit")] = False) -> None:
    """Speculative speculative decoding (SSD) of GGUF models on edge devices. With no command: the TUI."""
    if version:
        from importlib.metadata import version as pkg_version
        typer.echo(f"ssd-edge {pkg_version('ssd-edge')}")
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        open_tui({})


def run(argv: list[str] | None = None) -> int:
    """Run the command line and return the exit code. SIGTERM behaves like Ctrl-C
    throughout, so cleanups run; usage errors print one line, like every other error."""
    with terminate_as_interrupt():
        try:
            argv = sys.argv[1:] if argv is None else list(argv)
            code = app(args=argv, prog_name="ssd-edge", standalone_mode=False, obj=argv)  # obj: for bench.json
        except ClickException as e:
            message = e.format_message().rstrip(".")
            if message:  # empty when a group was called bare and printed its help
                where = f"; see {e.ctx.command_path} --help" if getattr(e, "ctx", None) is not None else ""
                stderr().print(f"[red]error:[/] {escape(message)}{where}")
            return e.exit_code
        except typer.Abort:
            return 1
    return code if isinstance(code, int) else 0


def main() -> None:
    """The console script `ssd-edge`."""
    sys.exit(run())


if __name__ == "__main__":  # pragma: no cover
    main()
