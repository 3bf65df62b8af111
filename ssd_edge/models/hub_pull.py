"""Pulling a Hugging Face Hub model (hub.py finds which files) into the cache, in a way that
survives being killed: huggingface_hub (2.x) writes each download to a process-unique temporary
file that it deletes on any failure, so a pull interrupted by Ctrl-C or a kill would start again
from byte 0. Here the bytes go to blobs/ETAG.incomplete in the repo's cache folder through
huggingface_hub's own http_get, which resumes with an HTTP Range request from the partial file's
size; the whole file's sha256 is then checked against the Hub's (the LFS oid, which is also the
ETag) before it takes its name in blobs/, after which hf_hub_download only links it into the
snapshot (refs/, snapshots/: the standard cache layout). Offline (HF_HUB_OFFLINE=1) a pull only
looks in the cache. Each way a pull fails is one line (FetchError; ModelNotFoundError for a bad
name). Progress goes to a ProgressFn, as each chunk is written.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from ..errors import FetchError, ModelNotFoundError
from .hub import HubModel, HubRef, RemoteFile, cache_dir, choose, endpoint, find_cached, offline, quant_of, repo_folder

CHUNK = 8 << 20
ProgressFn = Callable[[str, int, int], None]  # (label, bytes just written, bytes in all)


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
    storage = repo_folder(cache, ref.repo)
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
