"""`-hf`, `models pull hf:...`, `models pair`, `models rm` against a stand-in Hub on 127.0.0.1
(tests/standin_hub.py, through HF_ENDPOINT): the real huggingface_hub client, real HTTP, small
GGUF files with real headers (tests/tiny_gguf.py). Each error is one line and its exit code;
a killed pull resumes with a Range request; HF_HUB_OFFLINE=1 makes no request."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import standin_hub
import tiny_gguf
from ssd_edge import engine as engine_module
from ssd_edge.cli import loader
from test_chat import one_word_engine
from test_cli import one_error, run

BIG = 4 << 20  # bytes of weights in the target's file
CHUNK = 10 << 20  # huggingface_hub writes a download in chunks of this many bytes (DOWNLOAD_CHUNK_SIZE)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hub-files")
    vocab = tiny_gguf.tokens(1000)
    other = list(vocab)
    other[500], other[501] = other[501], other[500]
    shard1 = tiny_gguf.write(d / "tiny-7b-Q8_0-00001-of-00002.gguf", vocab, weight_bytes=BIG)
    (d / "tiny-7b-Q8_0-00002-of-00002.gguf").write_bytes(b"GGUF" + b"\0" * 4096)  # a second shard's bytes
    readme = d / "README.md"
    readme.write_text("# no GGUF here\n")
    return {
        "7b": tiny_gguf.write(d / "tiny-7b-Q4_K_M.gguf", vocab, weight_bytes=BIG),
        "big": tiny_gguf.write(d / "big-Q4_K_M.gguf", vocab, weight_bytes=CHUNK * 5 // 2),  # 2.5 chunks
        "7b-q8-1": shard1, "7b-q8-2": d / "tiny-7b-Q8_0-00002-of-00002.gguf",
        "1b": tiny_gguf.write(d / "tiny-1b-Q4_K_M.gguf", vocab, weight_bytes=64 << 10),
        "0.5b": tiny_gguf.write(d / "tiny-0.5b-q4_k_m.gguf", tiny_gguf.tokens(1000, pad=64), eos=7,
                                weight_bytes=16 << 10),
        "other": tiny_gguf.write(d / "other-0.5b-Q4_K_M.gguf", other, weight_bytes=16 << 10),
        "readme": readme,
    }


@pytest.fixture(scope="module")
def served(files):
    repos = {
        "t/Tiny-7B-GGUF": standin_hub.Repo({"tiny-7b-Q4_K_M.gguf": files["7b"],
                                            "Q8_0/tiny-7b-Q8_0-00001-of-00002.gguf": files["7b-q8-1"],
                                            "Q8_0/tiny-7b-Q8_0-00002-of-00002.gguf": files["7b-q8-2"],
                                            "README.md": files["readme"]}),
        "t/Big-GGUF": standin_hub.Repo({"big-Q4_K_M.gguf": files["big"]}),
        "t/Tiny-1B-GGUF": standin_hub.Repo({"tiny-1b-Q4_K_M.gguf": files["1b"]}),
        "t/Tiny-0.5B-GGUF": standin_hub.Repo({"tiny-0.5b-q4_k_m.gguf": files["0.5b"]}),
        "t/Other-0.5B-GGUF": standin_hub.Repo({"other-0.5b-Q4_K_M.gguf": files["other"]}),
        "t/Gated-GGUF": standin_hub.Repo({"tiny-1b-Q4_K_M.gguf": files["1b"]}, gated=True),
        "t/Tiny-safetensors": standin_hub.Repo({"README.md": files["readme"]}),
    }
    with standin_hub.Serving(standin_hub.Hub(repos)) as s:
        yield s


@pytest.fixture
def hub(served, monkeypatch, tmp_path):
    """The stand-in, reset; an empty models folder; no token or offline switch from the caller's shell."""
    served.hub.requests.clear()
    served.hub.release()
    served.hub._released.clear()
    monkeypatch.setenv("HF_ENDPOINT", served.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no token stored by `hf auth login`
    monkeypatch.setenv("SSD_EDGE_MODELS", str(tmp_path / "models"))
    for key in ("HF_TOKEN", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    return served.hub


def last_error(err: str) -> str:
    """A failure after progress lines: the last line is the one error line."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: ") and sum(ln.startswith("error") for ln in lines) == 1, err
    assert "Traceback" not in err
    return lines[-1]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def listing() -> list[dict]:
    code, out, err = run(["models", "list", "--json"])
    assert code == 0, err
    return [m for m in json.loads(out)["models"] if m["role"] == "hub"]


def test_pull_picks_q4_k_m_by_default_lists_and_removes(hub, files):
    code, out, err = run(["models", "pull", "hf:t/Tiny-7B-GGUF"])
    assert code == 0, err
    assert "✓ hf:t/Tiny-7B-GGUF:Q4_K_M pulled" in out and "sha256 checked" in out
    [entry] = listing()
    assert entry["name"] == "hf:t/Tiny-7B-GGUF:Q4_K_M" and entry["quant"] == "Q4_K_M"
    assert sha256(Path(entry["path"])) == sha256(files["7b"]) and entry["size"] == files["7b"].stat().st_size
    code, out, _ = run(["models", "pull", "hf:t/Tiny-7B-GGUF:q4_k_m"])  # the quant is case-insensitive
    assert code == 0 and "is already here" in out
    assert [r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]].__len__() == 1  # fetched once
    code, out, err = run(["models", "rm", "hf:t/Tiny-7B-GGUF:Q4_K_M"])
    assert code == 0 and "removed hf:t/Tiny-7B-GGUF:Q4_K_M (1 file)" in out, err
    assert listing() == []
    assert not list((Path(os.environ["SSD_EDGE_MODELS"]) / "hub").rglob("blobs/*[0-9a-f]"))


def test_a_split_model_pulls_every_shard_and_opens_at_the_first(hub, files):
    code, out, err = run(["models", "pull", "hf:t/Tiny-7B-GGUF:Q8_0"])
    assert code == 0, err
    assert "2 files" in out
    [entry] = listing()
    assert entry["files"] == 2 and entry["path"].endswith("Q8_0/tiny-7b-Q8_0-00001-of-00002.gguf")
    second = Path(entry["path"]).with_name("tiny-7b-Q8_0-00002-of-00002.gguf")
    assert sha256(second) == sha256(files["7b-q8-2"])


@pytest.mark.parametrize("args, code, words", [
    (["models", "pull", "hf:t/Missing-GGUF"], 3, "no repo t/Missing-GGUF on http://127.0.0.1:"),
    (["models", "pull", "hf:t/Tiny-safetensors"], 3, "t/Tiny-safetensors has no GGUF file"),
    (["models", "pull", "hf:t/Tiny-7B-GGUF:Q5_K_M"], 3, "t/Tiny-7B-GGUF has no Q5_K_M GGUF; it has Q4_K_M, Q8_0"),
    (["models", "pull", "hf:t/Gated-GGUF"], 4, "t/Gated-GGUF is gated: accept its terms at http://127.0.0.1:"),
    (["models", "pull", "hf:not a repo"], 3, "invalid Hugging Face repo 'hf:not a repo'"),
    (["generate", "-hf", "t/Missing-GGUF", "hi"], 3, "no repo t/Missing-GGUF"),
    (["generate", "-m", "qwen2.5-coder-1.5b", "-hf", "t/Tiny-7B-GGUF", "hi"], 2, "both name the target"),
])
def test_each_failure_is_one_line_and_its_exit_code(hub, args, code, words):
    got, out, err = run(args)
    assert got == code, err
    assert words in one_error(err)
    assert not list((Path(os.environ["SSD_EDGE_MODELS"]) / "hub").rglob("snapshots/*/*"))  # nothing half-there


def test_a_gated_repo_opens_with_hf_token(hub, monkeypatch):
    got, _, err = run(["models", "pull", "hf:t/Gated-GGUF"])
    assert "hf auth login" in one_error(err) and "HF_TOKEN" in err
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    got, _, err = run(["models", "pull", "hf:t/Gated-GGUF"])
    assert got == 4 and "is gated" in one_error(err)
    monkeypatch.setenv("HF_TOKEN", standin_hub.GATED_TOKEN)
    got, out, err = run(["models", "pull", "hf:t/Gated-GGUF"])
    assert got == 0 and "pulled" in out, err


def test_offline_serves_the_cache_without_a_request(hub, monkeypatch):
    assert run(["models", "pull", "hf:t/Tiny-1B-GGUF"])[0] == 0
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.requests.clear()
    code, out, err = run(["models", "pull", "hf:t/Tiny-1B-GGUF"])
    assert code == 0 and "is already here" in out, err
    code, out, err = run(["models", "pull", "hf:t/Tiny-0.5B-GGUF"])
    assert code == 4 and "not in the cache" in one_error(err) and "HF_HUB_OFFLINE=1" in err
    assert hub.requests == []


def test_disk_full_is_one_line_and_leaves_nothing(hub, monkeypatch):
    import shutil as shutil_module
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil_module, "disk_usage", lambda path: usage(10 << 20, 10 << 20, 1 << 20))
    code, _, err = run(["models", "pull", "hf:t/Tiny-7B-GGUF"])
    assert code == 4 and "not enough disk space" in one_error(err) and "0.00 GB free" in err


def _pull_in_child(name: str) -> subprocess.Popen:
    env = {**os.environ, "SSD_EDGE_DEBUG": "0"}
    # SIGINT as a terminal sends it, even when the suite runs in the background (which ignores it)
    return subprocess.Popen([sys.executable, "-m", "ssd_edge.cli.commands", "models", "pull", name], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for_partial(size: int) -> Path:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        partials = list((Path(os.environ["SSD_EDGE_MODELS"]) / "hub").rglob("blobs/*.incomplete"))
        if partials and partials[0].stat().st_size >= size:
            return partials[0]
        time.sleep(0.02)
    raise AssertionError(f"the pull did not write {size} bytes")


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGKILL])
def test_a_pull_stopped_halfway_resumes_and_verifies(hub, files, stop):
    hub.stall_after = files["big"].stat().st_size // 2  # the server stops sending there, the client waits
    child = _pull_in_child("hf:t/Big-GGUF")
    partial = _wait_for_partial(CHUNK)  # the first chunk is on disk
    child.send_signal(stop)
    _, err = child.communicate(timeout=30)
    if stop == signal.SIGINT:  # Ctrl-C: a line saying the partial file stays, exit 130
        assert child.returncode == 130, err
        assert "interrupted: the partial download is kept; pull again to resume it" in err
    else:
        assert child.returncode == -signal.SIGKILL
    assert partial.stat().st_size == CHUNK
    hub.release()
    hub.requests.clear()
    code, out, err = run(["models", "pull", "hf:t/Big-GGUF"])
    assert code == 0 and "pulled" in out and "sha256 checked" in out, err
    assert ("GET", f"/t/Big-GGUF/resolve/{hub.repos['t/Big-GGUF'].commit}/big-Q4_K_M.gguf",
            f"bytes={CHUNK}-") in hub.requests
    [entry] = listing()
    assert sha256(Path(entry["path"])) == sha256(files["big"])
    assert not partial.exists()


def test_a_corrupt_partial_is_caught_by_the_checksum_and_removed(hub, files):
    run(["models", "pull", "hf:t/Tiny-1B-GGUF"])
    [entry] = listing()
    blob = Path(entry["path"]).resolve()
    run(["models", "rm", "hf:t/Tiny-1B-GGUF:Q4_K_M"])
    partial = blob.with_name(blob.name + ".incomplete")
    partial.write_bytes(b"X" * 1000)  # wrong bytes where the resumed download continues
    code, _, err = run(["models", "pull", "hf:t/Tiny-1B-GGUF"])
    assert code == 4 and "does not match the Hub's sha256" in last_error(err)
    assert not partial.exists()
    assert run(["models", "pull", "hf:t/Tiny-1B-GGUF"])[0] == 0


def test_models_pair_lists_fitting_drafts_smallest_first(hub):
    for repo in ("t/Tiny-7B-GGUF", "t/Tiny-1B-GGUF", "t/Tiny-0.5B-GGUF", "t/Other-0.5B-GGUF"):
        assert run(["models", "pull", f"hf:{repo}"])[0] == 0
    code, out, err = run(["models", "pair", "hf:t/Tiny-7B-GGUF:Q4_K_M", "--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert [(d["name"], d["fit"]) for d in doc["drafts"]] == [
        ("hf:t/Tiny-0.5B-GGUF:Q4_K_M", "padded"), ("hf:t/Tiny-1B-GGUF:Q4_K_M", "same")]
    assert "BOS/EOS 1/2 vs 1/7 (the target's are used)" in doc["drafts"][0]["notes"]
    code, out, _ = run(["models", "pair", "hf:t/Tiny-7B-GGUF:Q4_K_M"])
    assert out.index("hf:t/Tiny-0.5B-GGUF:Q4_K_M") < out.index("hf:t/Tiny-1B-GGUF:Q4_K_M")
    assert "same tokens, the draft padded by 64" in out and "Other" not in out


def test_a_mismatched_pair_is_refused_before_loading(hub, monkeypatch):
    loaded = []
    monkeypatch.setattr(engine_module, "Engine", lambda *a, **k: loaded.append(a))
    code, _, err = run(["generate", "-hf", "t/Tiny-7B-GGUF", "-hfd", "t/Other-0.5B-GGUF", "hi"])
    assert code == 3
    line = last_error(err)
    assert line.startswith("error: draft other-0.5b-Q4_K_M.gguf (tiny vocabulary of 1,000 tokens #")
    assert "does not fit target tiny-7b-Q4_K_M.gguf (tiny vocabulary of 1,000 tokens #" in line
    assert "token 500 is b'tok500' in the target, b'tok501' in the draft" in line
    assert loaded == []


def test_a_hub_target_gets_the_smallest_fitting_draft_or_none(hub, monkeypatch):
    seen = []
    monkeypatch.setattr(loader, "load_engine", lambda cfg, s: seen.append(cfg) or one_word_engine())
    code, _, err = run(["generate", "-hf", "t/Tiny-7B-GGUF", "-n", "4", "hi"])
    assert code == 0, err
    assert err.count("no draft here fits t/Tiny-7B-GGUF: running without one") == 1
    assert seen[-1].draft is None
    for repo in ("t/Tiny-1B-GGUF", "t/Tiny-0.5B-GGUF", "t/Other-0.5B-GGUF"):
        run(["models", "pull", f"hf:{repo}"])
    code, _, err = run(["generate", "-hf", "t/Tiny-7B-GGUF", "-n", "4", "hi"])
    assert code == 0, err
    assert "draft: hf:t/Tiny-0.5B-GGUF:Q4_K_M, the smallest draft here that fits t/Tiny-7B-GGUF" in err
    assert seen[-1].draft.path.endswith("tiny-0.5b-q4_k_m.gguf")
