"""Logging while the app owns the terminal: records go to a file, not over the screen."""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path
from typing import Iterator

from ssd_edge import paths


@contextlib.contextmanager
def logs_to_file() -> Iterator[Path]:
    """While the app owns the terminal, log records go to a file instead of the
    screen: handlers writing to stderr/stdout (e.g. the CLI's) are set aside and
    put back afterwards."""
    path = paths.home() / "logs" / "tui.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler.setLevel(logging.WARNING)
    saved = []
    for logger in (logging.getLogger(), logging.getLogger("ssd_edge")):
        to_terminal = [h for h in logger.handlers if type(h) is logging.StreamHandler
                       and getattr(h, "stream", None) in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)]
        for h in to_terminal:
            logger.removeHandler(h)
        saved.append((logger, to_terminal, logger.level))
        if logger.level == logging.NOTSET or logger.level > logging.WARNING:
            logger.setLevel(logging.WARNING)
        if logger is logging.getLogger() or not logger.propagate:  # one copy of each record
            logger.addHandler(handler)
    try:
        yield path
    finally:
        for logger, to_terminal, level in saved:
            if handler in logger.handlers:
                logger.removeHandler(handler)
            for h in to_terminal:
                logger.addHandler(h)
            logger.setLevel(level)
        handler.close()
