"""A stand-in for the Hugging Face Hub on 127.0.0.1: the HTTP that huggingface_hub 2.x speaks,
serving real GGUF files from this disk, so pulls are tested without the network.

    .venv/bin/python tests/standin_hub.py [--port 8765]
    HF_ENDPOINT=http://127.0.0.1:8765 ssd-edge generate -hf ssd-edge-test/SmolLM2-135M-Instruct-GGUF:Q4_1 \\
        -hfd ssd-edge-test/SmolLM2-135M-first28-GGUF "def fib(n):"

The endpoints, as huggingface_hub (file_download.py, hf_api.py) calls them:

    GET  /api/models/ORG/REPO[/revision/REV][?blobs=true]   model info: sha (the commit), gated,
                                                            siblings (rfilename; with blobs: size, blobId, lfs)
    GET  /api/models/ORG/REPO/tree/REV[/PATH][?recursive=true]  the file listing (type, path, size, oid, lfs)
    HEAD /ORG/REPO/resolve/REV/FILE                          ETag (the sha256, quoted), X-Repo-Commit,
                                                            Content-Length, Accept-Ranges: bytes
    GET  /ORG/REPO/resolve/REV/FILE   [Range: bytes=N-]      the bytes (206 + Content-Range for a range)

Errors carry the Hub's X-Error-Code header, which huggingface_hub turns into its exceptions:
RepoNotFound (404), RevisionNotFound (404), EntryNotFound (404, with X-Repo-Commit), GatedRepo
(401 without a token, 403 with a token the repo does not accept). The commit of a repo is a
sha1 of its file names and sha256s, so it changes when a file does.

For tests: `Hub.stall_after` holds every file response after that many bytes until
`Hub.release()` (a pull to interrupt halfway), and `Hub.requests` records (method, path, Range).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

CHUNK = 1 << 20
GATED_TOKEN = "hf_standin_token"  # the one token gated repos accept


@dataclass
class Repo:
    files: dict[str, Path]                # path in the repo -> file on this disk
    gated: bool = False
    sha256: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, path in self.files.items():
            self.sha256[name] = _sha256(path)

    @property
    def commit(self) -> str:
        h = hashlib.sha1()
        for name in sorted(self.files):
            h.update(f"{name}\0{self.sha256[name]}\n".encode())
        return h.hexdigest()

    def entry(self, name: str, blobs: bool = True) -> dict:
        size = self.files[name].stat().st_size
        lfs = {"size": size, "sha256": self.sha256[name], "pointerSize": 134}
        return {"rfilename": name, **({"size": size, "blobId": _git_oid(name, self), "lfs": lfs} if blobs else {})}


_SHA_CACHE: dict[tuple[str, int, int], str] = {}


def _sha256(path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _SHA_CACHE:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
        _SHA_CACHE[key] = h.hexdigest()
    return _SHA_CACHE[key]


def _git_oid(name: str, repo: Repo) -> str:
    return hashlib.sha1(f"pointer {name} {repo.sha256[name]}".encode()).hexdigest()


class Hub:
    """The app (a starlette ASGI app) over a dict of repos, ORG/REPO -> Repo."""

    def __init__(self, repos: dict[str, Repo]):
        from starlette.applications import Starlette
        from starlette.routing import Route

        self.repos = repos
        self.requests: list[tuple[str, str, str | None]] = []
        self.stall_after: int | None = None
        self._released = threading.Event()
        self.app = Starlette(routes=[
            Route("/api/models/{org}/{name}/tree/{rev}", self.tree),
            Route("/api/models/{org}/{name}/tree/{rev}/{path:path}", self.tree),
            Route("/api/models/{org}/{name}/revision/{rev}", self.info),
            Route("/api/models/{org}/{name}", self.info),
            Route("/{org}/{name}/resolve/{rev}/{path:path}", self.resolve, methods=["GET", "HEAD"]),
        ])

    def release(self) -> None:
        """Let stalled responses go on (and no later one stall)."""
        self.stall_after = None
        self._released.set()

    # ------------------------------------------------------------ answers

    def _repo(self, request) -> tuple[str, Repo | None, object | None]:
        from starlette.responses import JSONResponse

        self.requests.append((request.method, request.url.path, request.headers.get("range")))
        repo_id = f"{request.path_params['org']}/{request.path_params['name']}"
        repo = self.repos.get(repo_id)
        if repo is None:
            return repo_id, None, JSONResponse({"error": "Repository not found"}, 404,
                                               headers={"X-Error-Code": "RepoNotFound"})
        rev = request.path_params.get("rev", "main")
        if rev not in ("main", repo.commit):
            return repo_id, None, JSONResponse({"error": f"Invalid rev id: {rev}"}, 404,
                                               headers={"X-Error-Code": "RevisionNotFound"})
        return repo_id, repo, None

    async def info(self, request):
        from starlette.responses import JSONResponse

        repo_id, repo, error = self._repo(request)
        if error is not None:
            return error
        blobs = request.query_params.get("blobs", "").lower() == "true"
        return JSONResponse({"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
                             "gated": "manual" if repo.gated else False, "tags": ["gguf"],
                             "siblings": [repo.entry(n, blobs) for n in sorted(repo.files)]})

    async def tree(self, request):
        from starlette.responses import JSONResponse

        _, repo, error = self._repo(request)
        if error is not None:
            return error
        prefix = request.path_params.get("path", "").strip("/")
        recursive = request.query_params.get("recursive", "").lower() == "true"
        out, folders = [], set()
        for name in sorted(repo.files):
            if prefix and not name.startswith(prefix + "/"):
                continue
            rest = name[len(prefix) + 1:] if prefix else name
            parts = rest.split("/")
            for i in range(1, len(parts) if recursive else min(2, len(parts))):
                folder = "/".join(([prefix] if prefix else []) + parts[:i])
                if folder not in folders:
                    folders.add(folder)
                    out.append({"type": "directory", "oid": hashlib.sha1(folder.encode()).hexdigest(), "size": 0,
                                "path": folder})
            if recursive or len(parts) == 1:
                e = repo.entry(name)
                out.append({"type": "file", "oid": e["blobId"], "size": e["size"], "path": name,
                            "lfs": {"oid": e["lfs"]["sha256"], "size": e["size"], "pointerSize": 134}})
        return JSONResponse(out)

    async def resolve(self, request):
        from starlette.responses import JSONResponse, Response, StreamingResponse

        _, repo, error = self._repo(request)
        if error is not None:
            return error
        name = request.path_params["path"]
        commit = {"X-Repo-Commit": repo.commit}
        if repo.gated:
            auth = request.headers.get("authorization", "")
            if auth != f"Bearer {GATED_TOKEN}":
                code = 403 if auth else 401
                return JSONResponse({"error": "Access to this model is restricted: you must be authenticated "
                                     "and have accepted its conditions"}, code,
                                    headers={"X-Error-Code": "GatedRepo", **commit})
        if name not in repo.files:
            return JSONResponse({"error": "Entry not found"}, 404, headers={"X-Error-Code": "EntryNotFound", **commit})
        path, size = repo.files[name], repo.files[name].stat().st_size
        headers = {**commit, "ETag": f'"{repo.sha256[name]}"', "Accept-Ranges": "bytes",
                   "Content-Disposition": f'inline; filename="{Path(name).name}"'}
        start, status = 0, 200
        rng = request.headers.get("range")
        if rng and rng.startswith("bytes=") and rng.endswith("-") and rng[6:-1].isdigit():
            start, status = int(rng[6:-1]), 206
            if start >= size:
                return Response(status_code=416, headers={**headers, "Content-Range": f"bytes */{size}"})
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        headers["Content-Length"] = str(size - start)
        if request.method == "HEAD":
            return Response(status_code=status, headers=headers)
        return StreamingResponse(self._body(path, start), status_code=status, headers=headers,
                                 media_type="application/octet-stream")

    async def _body(self, path: Path, start: int):
        sent = 0
        with open(path, "rb") as f:
            f.seek(start)
            while chunk := f.read(CHUNK):
                limit = self.stall_after
                if limit is not None and sent + len(chunk) > limit:
                    chunk = chunk[: max(0, limit - sent)]
                    if chunk:
                        yield chunk
                        sent += len(chunk)
                    while not self._released.is_set():  # hold the connection open, half sent
                        await asyncio.sleep(0.02)
                    f.seek(start + sent)
                    continue
                yield chunk
                sent += len(chunk)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serving:
    """A Hub served by uvicorn in a thread of this process, on a free port of 127.0.0.1."""

    def __init__(self, hub: Hub, port: int | None = None):
        import uvicorn

        self.hub = hub
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(hub.app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Serving:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"the stand-in hub did not start on port {self.port}")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.hub.release()
        self.server.should_exit = True
        self.thread.join(timeout=10)


# ---------------------------------------------------------------- the test pair's repos

ORG = "ssd-edge-test"
TARGET_REPO = f"{ORG}/SmolLM2-135M-Instruct-GGUF"
DRAFT_REPO = f"{ORG}/SmolLM2-135M-first28-GGUF"
SPLIT_REPO = f"{ORG}/SmolLM2-135M-Instruct-split-GGUF"
OTHER_VOCAB_REPO = f"{ORG}/SmolLM2-135M-othervocab-GGUF"
GATED_REPO = f"{ORG}/SmolLM2-135M-gated-GGUF"
NO_GGUF_REPO = f"{ORG}/SmolLM2-135M-safetensors"


def pair_repos(out_dir: Path) -> dict[str, Repo]:
    """The small test pair (tests/testpair.py) as Hub repos, with the variants the tests need:
    a split copy of the target, a draft whose vocabulary differs (two tokens swapped), a gated
    repo, and a repo without GGUF files. Derived files are written once into `out_dir`."""
    sys.path.insert(0, str(Path(__file__).parent))
    import testpair

    target, draft = testpair.ensure_pair()
    out_dir.mkdir(parents=True, exist_ok=True)
    split_first = out_dir / "SmolLM2-135M-Instruct-Q4_1-00001-of-00002.gguf"
    if not split_first.exists():
        testpair.rewrite_gguf(target, out_dir / "SmolLM2-135M-Instruct-Q4_1.gguf", None, split_max_tensors=150)
    other = out_dir / "SmolLM2-135M-othervocab-Q4_1.gguf"
    if not other.exists():
        testpair.rewrite_gguf(draft, other, testpair.DRAFT_LAYERS, _swap_two_tokens)
    readme = out_dir / "README.md"
    if not readme.exists():
        readme.write_text("# SmolLM2-135M, safetensors only\n")
    config = out_dir / "config.json"
    if not config.exists():
        config.write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}) + "\n")
    shards = sorted(out_dir.glob("SmolLM2-135M-Instruct-Q4_1-000*-of-*.gguf"))
    return {
        TARGET_REPO: Repo({"SmolLM2-135M-Instruct-Q4_1.gguf": target, "README.md": readme}),
        DRAFT_REPO: Repo({"SmolLM2-135M-first28-Q4_1.gguf": draft}),
        SPLIT_REPO: Repo({f"Q4_1/{s.name}": s for s in shards}),
        OTHER_VOCAB_REPO: Repo({other.name: other}),
        GATED_REPO: Repo({"SmolLM2-135M-first28-Q4_1.gguf": draft}, gated=True),
        NO_GGUF_REPO: Repo({"README.md": readme, "config.json": config}),
    }


def _swap_two_tokens(tokens: list) -> list:
    tokens = list(tokens)
    tokens[1000], tokens[1001] = tokens[1001], tokens[1000]
    return tokens


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Serve the small test pair as a stand-in Hugging Face Hub.")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--dir", type=Path, default=None, help="where the derived files go (default: beside the "
                   "test models)")
    args = p.parse_args(argv)
    from ssd_edge import paths

    repos = pair_repos(args.dir or paths.home() / "test-models" / "standin-hub")
    import uvicorn

    print(f"stand-in hub on http://127.0.0.1:{args.port} (export HF_ENDPOINT=http://127.0.0.1:{args.port})")
    for repo_id, repo in repos.items():
        print(f"  {repo_id}{' (gated: HF_TOKEN=' + GATED_TOKEN + ')' if repo.gated else ''}: "
              + ", ".join(sorted(repo.files)))
    sys.stdout.flush()
    uvicorn.run(Hub(repos).app, host="127.0.0.1", port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
