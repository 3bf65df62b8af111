"""GGUF models from the Hugging Face Hub: `hf:ORG/REPO[:QUANT]`, as llama.cpp's `-hf` names them.

The client is huggingface_hub; this module adds what a model pull needs around it:
  - which file(s): `choose` picks the GGUF files of QUANT (case-insensitive; Q4_K_M when none is
    given, else the repo's first GGUF, as llama.cpp does), a split model's shards
    (NAME-00001-of-0000N.gguf) together, in order;
  - a pull that survives being killed: huggingface_hub (2.x) writes each download to a
    process-unique temporary file that it deletes on any failure, so a pull interrupted by Ctrl-C
    or a kill would start again from byte 0. Here the bytes go to blobs/ETAG.incomplete in the
    repo's cache folder through huggingface_hub's own http_get, which resumes with an HTTP Range
    request from the partial file's size; the whole file's sha256 is then checked against the
    Hub's (the LFS oid, which is also the ETag) before it takes its name in blobs/, after which
    hf_hub_download only links it into the snapshot (refs/, snapshots/: the standard cache layout);
  - offline (HF_HUB_OFFLINE=1): what the cache holds, found without a request;
  - one-line errors for each way a pull fails (FetchError; ModelNotFoundError for a bad name).

The cache is the huggingface_hub cache layout in MODELS_DIR/hub (paths.hub_dir), so the models
folder holds everything ssd-edge uses and `hf cache` tools can read it (HF_HUB_CACHE=that folder).
HF_ENDPOINT, HF_TOKEN (or `hf auth login`) and HF_HUB_OFFLINE are read at each call.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import paths
from ..errors import FetchError, ModelNotFoundError

DEFAULT_QUANT = "Q4_K_M"  # llama.cpp's default for -hf without :QUANT
PREFIX = "hf:"
NAME_HINT = "hf:ORG/REPO[:QUANT] for a model on the Hugging Face Hub"  # in errors of commands that take one
CHUNK = 8 << 20
SPLIT = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# a quantization label in a file name: Q4_K_M, q8_0, IQ4_XS, Q4_0_4_4, F16, BF16, F32, TQ1_0, MXFP4
_QUANT = re.compile(r"(?:^|[-._])((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]+)*|B?F16|F32|TQ\d_\d|MXFP4(?:_MOE)?))(?=[-._]|$)",
                    re.IGNORECASE)
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

ProgressFn = Callable[[str, int, int], None]  # (label, bytes just written, bytes in all)


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


def _storage(cache: Path, repo: str) -> Path:
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
    storage = _storage(cache_dir(models_dir), ref.repo)
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
    storage = _storage(cache_dir(models_dir), ref.repo)
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


# ---------------------------------------------------------------- pulling

def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def partial_files(models_dir: Path | str | None = None) -> list[Path]:
    """The .incomplete files that interrupted pulls left (the next pull of the same file resumes them)."""
    cache = cache_dir(models_dir)
    return sorted(cache.glob("models--*/blobs/*.incomplete")) if cache.is_dir() else []


def pull(text: str, models_dir: Path | str | None = None, *, progress: ProgressFn | None = None,
         verify: bool = False) -> tuple[HubModel, bool]:
    """Fetch the model `text` names into the cache, resuming a partial download.
    Returns (the model, fetched): fetched is False when every file was already there.
    With HF_HUB_OFFLINE=1 it only looks in the cache."""
    ref = HubRef.parse(text)
    if offline():
        found = find_cached(ref, models_dir)
        if found is None:
            raise FetchError(f"{ref} is not in the cache ({cache_dir(models_dir)}) and HF_HUB_OFFLINE=1 forbids "
                             "downloading it: pull it once while online")
        return found, False
    from huggingface_hub import HfApi

    with _hub_errors(ref):
        info = HfApi(endpoint=endpoint()).model_info(ref.repo, revision=ref.revision, files_metadata=True)
    remote = [RemoteFile(s.rfilename, s.lfs.size if s.lfs else (s.size or 0), s.lfs.sha256 if s.lfs else None)
              for s in info.siblings or []]
    chosen = choose(ref.repo, remote, ref.quant)
    unsigned = [f.name for f in chosen if f.sha256 is None]
    if unsigned:
        raise FetchError(f"{ref}: {', '.join(unsigned)} has no sha256 on the Hub (kept in git, not LFS), so it "
                         "cannot be verified")
    cache = cache_dir(models_dir)
    storage = _storage(cache, ref.repo)
    missing = [f for f in chosen if not _blob(storage, f).exists()]
    _check_space(cache, ref, sum(f.size - _partial_size(storage, f) for f in missing))
    total = sum(f.size for f in chosen)
    files = []
    for f in chosen:
        label = f"{ref.repo}: {Path(f.name).name}"
        if f in missing:
            _download(ref, info.sha, f, storage, label, total, progress)
        elif verify and f.sha256 and sha256_file(_blob(storage, f)) != f.sha256:
            _blob(storage, f).unlink()
            _download(ref, info.sha, f, storage, label, total, progress)
        files.append(_link(ref, f, cache))
    model = HubModel(ref.repo, quant_of(chosen[0].name), _commit_of(files[0]), tuple(files), total)
    return model, bool(missing)


def _blob(storage: Path, f: RemoteFile) -> Path:
    # the Hub's ETag of an LFS file is its sha256, and the cache names blobs by ETag
    assert f.sha256 is not None
    return storage / "blobs" / f.sha256


def _partial_size(storage: Path, f: RemoteFile) -> int:
    p = _blob(storage, f).with_name(_blob(storage, f).name + ".incomplete")
    return p.stat().st_size if p.exists() else 0


def _commit_of(snapshot_file: Path) -> str:
    for parent in snapshot_file.parents:
        if parent.parent.name == "snapshots":
            return parent.name
    return ""


def _check_space(cache: Path, ref: HubRef, needed: int) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cache).free
    if needed > free:
        raise FetchError(f"not enough disk space in {cache} for {ref}: {needed / 1e9:.2f} GB to download, "
                         f"{free / 1e9:.2f} GB free")


def _download(ref: HubRef, commit: str, f: RemoteFile, storage: Path, label: str, total: int,
              progress: ProgressFn | None) -> None:
    """Bytes of `f` into blobs/ETAG.incomplete (resumed from its size), checked, then renamed to blobs/ETAG."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(ref.repo, f.name, revision=commit, endpoint=endpoint())
    with _hub_errors(ref):
        meta = get_hf_file_metadata(url, endpoint=endpoint())  # HEAD: ETag, size, where the bytes are
    expected = f.sha256
    assert expected is not None
    if meta.etag != expected:
        raise FetchError(f"{ref}: {f.name} changed on the Hub while pulling (ETag {meta.etag}, listed sha256 "
                         f"{expected}); pull again")
    blob = storage / "blobs" / expected
    partial = blob.with_name(blob.name + ".incomplete")
    blob.parent.mkdir(parents=True, exist_ok=True)
    headers = build_hf_headers()  # HF_TOKEN, or the token `hf auth login` stored
    if meta.location != url and not meta.location.startswith(endpoint()):
        headers.pop("authorization", None)  # a CDN's signed URL: the token stays with the Hub
    try:
        with open(partial, "ab") as out:
            have = out.tell()
            if meta.size is not None and have > meta.size:
                out.truncate(0)
                have = 0
            if progress:
                progress(label, have, total)
            with _hub_errors(ref):
                http_get(meta.location, out, resume_size=have, headers=headers, expected_size=meta.size,
                         displayed_filename=Path(f.name).name, tqdm_class=_reporter(label, total, progress))
    except OSError as e:
        if e.errno == errno.ENOSPC:
            partial.unlink(missing_ok=True)
            raise FetchError(f"disk full while writing {partial}; the partial file was removed") from None
        raise FetchError(f"could not write {partial}: {e}") from None
    got = sha256_file(partial)
    if got != expected:
        partial.unlink()
        raise FetchError(f"{ref}: {f.name} does not match the Hub's sha256 (got {got[:12]}…, expected "
                         f"{expected[:12]}…); the download was removed, pull again")
    os.replace(partial, blob)


def _link(ref: HubRef, f: RemoteFile, cache: Path) -> Path:
    """hf_hub_download finds the blob already in place and only links the snapshot file and the ref."""
    from huggingface_hub import hf_hub_download

    with _hub_errors(ref):
        return Path(hf_hub_download(ref.repo, f.name, revision=ref.revision, cache_dir=cache, endpoint=endpoint()))


def _reporter(label: str, total: int, progress: ProgressFn | None) -> type:
    """A tqdm class for http_get that draws nothing and passes each chunk's size to `progress`."""
    from huggingface_hub.utils import tqdm

    class Reporter(tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("name", None)
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if progress and n:
                progress(label, int(n), total)
            return None
    return Reporter


class _hub_errors:
    """huggingface_hub's exceptions -> one-line FetchError / ModelNotFoundError naming the repo."""

    def __init__(self, ref: HubRef):
        self.ref = ref

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, e: BaseException | None, tb: Any) -> bool:
        if e is None or not isinstance(e, Exception) or isinstance(e, (FetchError, ModelNotFoundError)):
            return False
        import httpx2
        from huggingface_hub import errors as hf

        ref, where = self.ref, endpoint()
        if isinstance(e, hf.GatedRepoError):
            raise FetchError(f"{ref.repo} is gated: accept its terms at {where}/{ref.repo} while logged in, then "
                             "`hf auth login` (or set HF_TOKEN to a token of that account) and pull again") from None
        if isinstance(e, hf.RepositoryNotFoundError):
            raise ModelNotFoundError(f"no repo {ref.repo} on {where} (a private repo needs HF_TOKEN or "
                                     "`hf auth login`)") from None
        if isinstance(e, hf.RevisionNotFoundError):
            raise ModelNotFoundError(f"{ref.repo} has no revision '{ref.revision}'") from None
        if isinstance(e, hf.RemoteEntryNotFoundError):
            raise FetchError(f"{ref.repo}: a file listed by the Hub was not found there ({e.response.url})") from None
        if isinstance(e, hf.OfflineModeIsEnabled):
            raise FetchError(f"{ref} is not in the cache and HF_HUB_OFFLINE=1 forbids downloading it") from None
        if isinstance(e, (httpx2.ConnectError, httpx2.TimeoutException, httpx2.NetworkError)):
            raise FetchError(f"cannot reach {where} for {ref}: {e or type(e).__name__}; what is cached works with "
                             "HF_HUB_OFFLINE=1") from None
        if isinstance(e, hf.HfHubHTTPError):
            status = e.response.status_code if e.response is not None else "?"
            raise FetchError(f"{where} answered {status} for {ref}: {str(e).splitlines()[0]}") from None
        return False
