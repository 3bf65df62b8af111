"""The `ssd-edge` console script: llama.cpp's library first, then the CLI (cli/commands.py).

Loading libllama before numpy (llama/preload.py) keeps the CUDA build's first model load from crashing
where numpy's BLAS came first; a Ctrl-C while the CLI's modules still import exits 130 with one line,
not a traceback."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from ..llama.preload import preload_library

        preload_library()
        from .commands import run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    sys.exit(run())
