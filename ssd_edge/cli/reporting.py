"""How a command ends: every failure becomes one line on stderr and an exit code (the traceback
too with --debug), and ssd_edge's log records reach stderr as 'warning: ...' lines.

Exit codes are SSDEdgeError.exit_code (errors.py), the two signals' (signals.py), and the two here."""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import SSDEdgeError
from .signals import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated

EXIT_CONTEXT_FULL = 5
EXIT_BROKEN_PIPE = 141


def stderr() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)  # soft wrap: an error stays one line


def debug_wanted(flags: dict[str, Any]) -> bool:
    return bool(flags.get("debug")) or os.environ.get("SSD_EDGE_DEBUG", "").lower() in ("1", "true", "yes", "on")


def setup_logging(debug: bool) -> None:
    """Warnings from ssd_edge (e.g. no GPU for -ngl) as 'warning: ...' lines; everything with --debug."""
    logger = logging.getLogger("ssd_edge")
    for h in list(logger.handlers):
        if getattr(h, "_ssd_edge_cli", False):
            logger.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler._ssd_edge_cli = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s" if debug else
                                           "%(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.WARNING)
    logger.propagate = False
    logging.addLevelName(logging.WARNING, "warning")


@contextmanager
def reported(flags: dict[str, Any]) -> Iterator[None]:
    """Turn every failure into one line on stderr and an exit code (with --debug, the traceback too)."""
    debug = debug_wanted(flags)
    setup_logging(debug)
    err = stderr()

    def fail(message: str, code: int) -> typer.Exit:
        if debug:
            err.print_exception()
        err.print(f"[red]error:[/] {escape(message)}")
        return typer.Exit(code)
    try:
        yield
    except (typer.Exit, typer.Abort, SystemExit):
        raise
    except SSDEdgeError as e:
        raise fail(str(e), e.exit_code) from None
    except Terminated:
        err.print("[yellow]terminated[/]")
        raise typer.Exit(EXIT_TERMINATED) from None
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BrokenPipeError:
        silence_stdout()
        raise typer.Exit(EXIT_BROKEN_PIPE) from None
    except Exception as e:
        hint = "" if debug else " (--debug shows the traceback)"
        raise fail(f"unexpected {type(e).__name__}: {e}{hint}", 1) from None


def silence_stdout() -> None:
    """After the reader of our stdout went away, point stdout at /dev/null so the final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
