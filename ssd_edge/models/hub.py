"""GGUF models from the Hugging Face Hub: `hf:ORG/REPO[:QUANT]`, as llama.cpp's `-hf` names them,
found among a repo's files and in the cache. Pulling them into the cache is hub_pull.py.

The client is huggingface_hub; this module adds what finding a model needs around it:
  - which file(s): `choose` picks the GGUF files of QUANT (case-insensitive; Q4_K_M when none is
    given, else the repo's first GGUF, as llama.cpp does), a split model's shards
    (NAME-00001-of-0000N.gguf) together, in order;
  - offline (HF_HUB_OFFLINE=1): what the cache holds, found without a request (find_cached,
    cached_models; resolve names the file a pulled model opens).

The cache is the huggingface_hub cache layout in MODELS_DIR/hub (paths.hub_dir), so the models
folder holds everything ssd-edge uses and `hf cache` tools can read it (HF_HUB_CACHE=that folder).
HF_ENDPOINT, HF_TOKEN (or `hf auth login`) and HF_HUB_OFFLINE are read at each call.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..errors import ModelNotFoundError

DEFAULT_QUANT = "Q4_K_M"  # llama.cpp's default for -hf without :QUANT
PREFIX = "hf:"
NAME_HINT = "hf:ORG/REPO[:QUANT] for a model on the Hugging Face Hub"  # in errors of commands that take one
SPLIT = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# a quantization label in a file name: Q4_K_M, q8_0, IQ4_XS, Q4_0_4_4, F16, BF16, F32, TQ1_0, MXFP4
_QUANT = re.compile(r"(?:^|[-._])((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]+)*|B?F16|F32|TQ\d_\d|MXFP4(?:_MOE)?))(?=[-._]|$)",
                    re.IGNORECASE)
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


# ---------------------------------------------------------------- names

@dataclass(frozen=True)
class HubRef:
    """ORG/REPO[:QUANT][@REVISION]; quant None: llama.cpp's default choice (see `choose`)."""

    repo: str
    quant: str | None = None
    revision: str = "main"

    @classmethod
    def parse(cls, text: str) -> HubRef:
        spec = text[len(PREFIX):] if text.startswith(PREFIX) else text
        spec, _, revision = spec.partition("@")
        repo, _, quant = spec.partition(":")
        if not _REPO.match(repo) or ".." in repo:
            raise ModelNotFoundError(f"invalid Hugging Face repo '{text}': expected ORG/REPO[:QUANT], "
                                     "e.g. Qwen/Qwen2.5-7B-Instruct-GGUF:Q4_K_M")
        return cls(repo, quant or None, revision or "main")

    def __str__(self) -> str:
        rev = "" if self.revision == "main" else f"@{self.revision}"
        return f"{PREFIX}{self.repo}{':' + self.quant if self.quant else ''}{rev}"


def is_hub_name(text: str) -> bool:
    return text.startswith(PREFIX)


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


# ---------------------------------------------------------------- choosing files

@dataclass(frozen=True)
class RemoteFile:
    name: str                 # path in the repo
    size: int
    sha256: str | None = None  # the LFS oid; None for a file kept in git itself


def quant_of(filename: str) -> str | None:
    """'qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf' -> 'Q4_K_M'; None when the name shows none."""
    base = filename.rsplit("/", 1)[-1]
    m = SPLIT.match(base)
    stem = m.group("stem") if m else re.sub(r"\.gguf$", "", base, flags=re.IGNORECASE)
    found = _QUANT.findall(stem)
    return found[-1].upper() if found else None


def gguf_models(files: list[RemoteFile]) -> dict[str, list[RemoteFile]]:
    """The models among a repo's files: first-shard name -> its files in order (one file unless
    split). Projector files (mmproj) are not models; a split with a missing shard is left out."""
    singles: dict[str, list[RemoteFile]] = {}
    splits: dict[tuple[str, int], dict[int, RemoteFile]] = {}
    for f in sorted(files, key=lambda f: f.name):
        base = f.name.rsplit("/", 1)[-1]
        if not base.lower().endswith(".gguf") or "mmproj" in base.lower():
            continue
        m = SPLIT.match(f.name)
        if m:
            splits.setdefault((m.group("stem"), int(m.group("count"))), {})[int(m.group("no"))] = f
        else:
            singles[f.name] = [f]
    for (_, count), shards in splits.items():
        if sorted(shards) == list(range(1, count + 1)):
            singles[shards[1].name] = [shards[i] for i in range(1, count + 1)]
    return dict(sorted(singles.items()))


def choose(repo: str, files: list[RemoteFile], quant: str | None) -> list[RemoteFile]:
    """The files of `quant` in `repo` (see the module docstring); ModelNotFoundError names the
    quantizations the repo has when `quant` is not among them."""
    models = gguf_models(files)
    if not models:
        raise ModelNotFoundError(f"{repo} has no GGUF file ({len(files)} files in the repo); ssd-edge runs GGUF "
                                 "models: look for a repo named ...-GGUF")
    wanted = (quant or DEFAULT_QUANT).upper()
    matches = [shards for first, shards in models.items() if quant_of(first) == wanted]
    if matches:
        return matches[0]
    if quant is None:
        return next(iter(models.values()))
    have = sorted({q for q in map(quant_of, models) if q}) or [Path(n).name for n in models]
    raise ModelNotFoundError(f"{repo} has no {quant} GGUF; it has {', '.join(have)}")


# ---------------------------------------------------------------- the cache

def cache_dir(models_dir: Path | str | None = None) -> Path:
    return paths.hub_dir(models_dir)


def repo_folder(cache: Path, repo: str) -> Path:
    """The cache's folder of one repo (models--ORG--REPO: blobs/, refs/, snapshots/)."""
    from huggingface_hub.file_download import repo_folder_name

    return cache / repo_folder_name(repo_id=repo, repo_type="model")


@dataclass(frozen=True)
class HubModel:
    """A model in the cache: its files (snapshot paths, in shard order)."""

    repo: str
    quant: str | None
    commit: str
    files: tuple[Path, ...]
    size: int

    @property
    def path(self) -> Path:
        """What llama.cpp opens: the file, or a split model's first shard (it finds the others)."""
        return self.files[0]

    @property
    def name(self) -> str:
        return str(HubRef(self.repo, self.quant or self.files[0].name))


def _local_files(snapshot: Path) -> list[RemoteFile]:
    return [RemoteFile(p.relative_to(snapshot).as_posix(), p.stat().st_size)
            for p in sorted(snapshot.rglob("*")) if p.is_file()]


def find_cached(ref: HubRef, models_dir: Path | str | None = None) -> HubModel | None:
    """The model `ref` names, if the cache holds all its files (no request is made)."""
    storage = repo_folder(cache_dir(models_dir), ref.repo)
    commit = ref.revision
    ref_file = storage / "refs" / ref.revision
    if ref_file.is_file():
        commit = ref_file.read_text().strip()
    snapshot = storage / "snapshots" / commit
    if not snapshot.is_dir():
        return None
    try:
        chosen = choose(ref.repo, _local_files(snapshot), ref.quant)
    except ModelNotFoundError:
        return None
    files = tuple(snapshot / f.name for f in chosen)
    return HubModel(ref.repo, quant_of(chosen[0].name), commit, files, sum(f.size for f in chosen))


def cached_models(models_dir: Path | str | None = None) -> list[HubModel]:
    """Every GGUF model in the cache, by repo then file name (only the revision main points at,
    or each snapshot when no ref names it)."""
    cache = cache_dir(models_dir)
    out = []
    for storage in sorted(cache.glob("models--*")) if cache.is_dir() else []:
        repo = storage.name[len("models--"):].replace("--", "/")
        snapshots = storage / "snapshots"
        if not snapshots.is_dir():
            continue
        pointed = {p.read_text().strip() for p in (storage / "refs").glob("*") if p.is_file()}
        for snapshot in sorted(snapshots.iterdir()):
            if pointed and snapshot.name not in pointed:
                continue
            for first, shards in gguf_models(_local_files(snapshot)).items():
                out.append(HubModel(repo, quant_of(first), snapshot.name, tuple(snapshot / f.name for f in shards),
                                    sum(f.size for f in shards)))
    return out


def resolve(text: str, models_dir: Path | str | None = None) -> Path:
    """`hf:ORG/REPO[:QUANT]` -> the cached file to open; ModelNotFoundError when not pulled."""
    ref = HubRef.parse(text)
    found = find_cached(ref, models_dir)
    if found is None:
        raise ModelNotFoundError(f"{ref} is not pulled yet: run `ssd-edge models pull {ref}` "
                                 f"(or use -hf {str(ref)[len(PREFIX):]}, which pulls it)")
    return found.path


def remove(text: str, models_dir: Path | str | None = None) -> list[Path]:
    """Delete a pulled Hub model (`hf:ORG/REPO:QUANT`), or every revision of a repo (`hf:ORG/REPO`).
    Returns the snapshot files removed; a blob goes once no snapshot links to it."""
    ref = HubRef.parse(text)
    storage = repo_folder(cache_dir(models_dir), ref.repo)
    if ref.quant is None:
        if not storage.is_dir():
            raise ModelNotFoundError(f"{ref} is not in {cache_dir(models_dir)}")
        files = [p for p in (storage / "snapshots").rglob("*") if p.is_file()] if (storage / "snapshots").is_dir() else []
        shutil.rmtree(storage)
        return files
    found = find_cached(ref, models_dir)
    if found is None:
        raise ModelNotFoundError(f"{ref} is not in {cache_dir(models_dir)} (`ssd-edge models list` shows what is)")
    linked = {p.resolve() for p in (storage / "snapshots").rglob("*") if p.is_symlink() and p not in found.files}
    for f in found.files:
        blob = f.resolve()
        f.unlink()
        if blob != f and blob not in linked:
            blob.unlink(missing_ok=True)
    return list(found.files)

