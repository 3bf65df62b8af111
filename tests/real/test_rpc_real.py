"""The target on llama.cpp's rpc-server (127.0.0.1, a free port), the draft local, on the small real
pair: the same greedy tokens as the local run in ar, sd and ssd; a wrong port; a server killed
mid-generation and one that stops answering (in child processes: after a lost server llama.cpp's
RPC threads stay parked until the process exits); the CLI's exit code when the server dies.

The rpc-server binary comes from `scripts/build_llama_tools.sh --rpc-server-only` (the vendored
sources of the llama-cpp-python sdist on PyPI; built once, a few minutes, then cached). Every server
here listens on 127.0.0.1 only and is killed at teardown; every wait is bounded."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import make_engine
from ssd_edge.errors import RPCError
from ssd_edge.llama import rpc

pytestmark = pytest.mark.real

REPO = Path(__file__).resolve().parents[2]
HANG = 180  # seconds before a child counts as hung (the CI machine is small and shared)
PROMPT = "The three primary colors are"
MODES = ("ar", "sd", "ssd")


@pytest.fixture(scope="session")
def rpc_server_binary(request) -> Path:
    from ssd_edge.llama import backend

    # In CI (--no-silent-skip) a missing RPC backend or rpc-server is a failure, with the reason.
    skip = pytest.fail if request.config.getoption("no_silent_skip") else pytest.skip
    if not backend.rpc_supported():
        skip("this llama-cpp-python build has no RPC backend (scripts/setup.sh builds it with -DGGML_RPC=ON)")
    found = rpc.find_server()
    if found is not None:
        return found
    env = {**os.environ, "PYTHON": sys.executable}
    try:
        p = subprocess.run(["bash", str(REPO / "scripts" / "build_llama_tools.sh"), "--rpc-server-only"],
                           capture_output=True, text=True, timeout=1800, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        skip(f"could not build llama.cpp's rpc-server: {e}")
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines or not Path(lines[-1]).is_file():
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        skip(f"could not build llama.cpp's rpc-server (scripts/build_llama_tools.sh --rpc-server-only, "
                    f"exit {p.returncode}): {' | '.join(tail)}")
    return Path(lines[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """ggml-rpc-server on 127.0.0.1 with one thread, started as users do (`ssd-edge rpc-server`, which
    exec()s it: the same pid); up once it answers the HELLO probe."""

    def __init__(self, binary: Path) -> None:
        self.endpoint = rpc.Endpoint("127.0.0.1", _free_port())
        argv = [sys.executable, "-m", "ssd_edge.cli.commands", "rpc-server", "--binary", str(binary),
                "--port", str(self.endpoint.port), "-t", "1"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
        deadline = time.monotonic() + 30
        while True:
            try:
                rpc.probe(self.endpoint, timeout_s=2)
                return
            except RPCError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.1)

    def rss_mib(self) -> float:
        return psutil.Process(self.proc.pid).memory_info().rss / 2**20

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def server(rpc_server_binary):
    srv = Server(rpc_server_binary)
    yield srv
    srv.stop()


def test_rpc_target_gives_the_local_greedy_tokens(small_pair, small_engine, server):
    rss_before = server.rss_mib()
    local = {m: small_engine.complete(PROMPT, max_tokens=24, mode=m).tokens for m in MODES}
    # -ngld -1 asks to offload the draft too: with no local GPU it must stay on this CPU, not go to the server
    with make_engine(small_pair, target=dict(rpc=[str(server.endpoint)], n_gpu_layers=-1),
                     draft=dict(n_gpu_layers=-1)) as eng:
        eng.load_draft()  # (made in mode ar: loaded when a mode first drafts)
        assert eng.target.info().gpu_layers == eng.target.n_layer + 1  # every layer and the output offloaded
        assert eng.draft.info().gpu_layers == 0
        # the target's weights went to the server (SmolLM2-135M: 98 MB), the draft's (92 MB) did not
        grown = server.rss_mib() - rss_before
        print(f"rpc-server memory grew by {grown:.0f} MiB")
        assert 60 < grown < 150, grown
        for m in MODES:
            remote = eng.complete(PROMPT, max_tokens=24, mode=m)
            assert remote.tokens == local[m], m
            assert len(remote.tokens) == 24
        # a second model on the same server while the first holds its one connection (a reload in the TUI)
        from unittest import mock

        from ssd_edge.llama import model

        # not probed again: the server is busy with our own connection, a HELLO probe would wait 3 s
        with mock.patch.object(model, "probe", wraps=model.probe) as probed:
            model.Model(small_pair[0], n_gpu_layers=-1, rpc=[str(server.endpoint)]).close()
        assert probed.call_count == 0
    assert local["ar"] == local["sd"] == local["ssd"]  # and the modes agree among themselves


def test_server_survives_a_client_gone_mid_reply(small_pair, server):
    """rpc-server sends with send(..., 0): a client that leaves before its reply (here a probe that gave up
    on the busy server) raises SIGPIPE in it. The launcher starts it with SIGPIPE ignored, so it lives."""
    from ssd_edge.llama.backend import Model

    status = Path(f"/proc/{server.proc.pid}/status").read_text()
    ignored = int(next(ln for ln in status.splitlines() if ln.startswith("SigIgn:")).split()[1], 16)
    assert ignored & (1 << (signal.SIGPIPE - 1))
    m = Model(small_pair[0], n_gpu_layers=-1, rpc=[str(server.endpoint)])  # holds the server's one connection
    try:
        with pytest.raises(RPCError, match="did not answer within 0.5 s"):
            rpc.probe(server.endpoint, timeout_s=0.5)
    finally:
        m.close()  # the server now answers the queued HELLO of a closed socket
    rpc.probe(server.endpoint, timeout_s=5)
    assert server.proc.poll() is None


def test_wrong_port_is_an_error_naming_the_endpoint(small_pair):
    port = _free_port()  # nothing listens there
    with pytest.raises(RPCError, match=f"rpc server 127.0.0.1:{port} is unreachable"):
        make_engine(small_pair, target=dict(rpc=[f"127.0.0.1:{port}"], n_gpu_layers=-1))


def _child(how: str, server: Server, pair: tuple[Path, Path], mode: str) -> dict:
    p = subprocess.run([sys.executable, str(Path(__file__).with_name("rpc_child.py")), how, str(server.proc.pid),
                        str(server.endpoint), str(pair[0]), str(pair[1]), mode],
                       capture_output=True, text=True, timeout=HANG, cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("how, mode", [("kill", "ssd"), ("freeze", "ar")])
def test_server_lost_mid_generation(small_pair, small_engine, server, how, mode):
    """kill: the server dies, the connection resets; freeze: it stops answering (SIGSTOP), and the
    3 s decode timeout ends the generation. Either way: an RPCError, not an abort or a hang; closing
    the engine returns at once; a local engine in the same process still generates."""
    out = _child(how, server, small_pair, mode)
    assert out["tokens_before"] >= 8 and out["error"] is not None and out["exit_code"] == 7
    assert str(server.endpoint) in out["error"]
    # the outcome says which path ended it; the child's HANG limit (_child) is what catches a hang
    if how == "kill":
        assert "lost during a decode" in out["error"]
    else:  # the decode timeout: it cannot fire before its 3 s (a lower bound a busy machine cannot break)
        assert "did not answer within 3 s" in out["error"] and out["seconds_to_error"] >= 3.0
    # a close that waited on the lost server would block until the process exits (llama.cpp's RPC
    # threads stay parked): 30 s is 10 times the decode timeout, a hang-catcher, not a speed bound
    assert out["close_s"] < 30
    assert out["local_tokens"] == list(small_engine.complete(
        "Once upon a time, in a small village by the sea,", max_tokens=12, mode=mode).tokens)


def test_cli_exits_7_when_the_server_dies(small_pair, server):
    """`ssd-edge generate --rpc`: the server killed once text streams -> one error line, exit 7."""
    script = Path(sys.executable).with_name("ssd-edge")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "ssd_edge.cli.commands"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSD_EDGE_") or k in ("SSD_EDGE_HOME",
                                                                                       "SSD_EDGE_MODELS")}
    proc = subprocess.Popen(cmd + ["generate", "-m", str(small_pair[0]), "--no-draft", "--mode", "ar", "-n", "600",
                                   "--rpc", str(server.endpoint), "-t", "1", "Once upon a time"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        first = proc.stdout.read(1)  # blocks until the first text streams
        assert first
        os.kill(server.proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=HANG)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    lines = [ln for ln in err.decode().splitlines() if ln.strip()]
    assert proc.returncode == 7, err.decode()
    assert lines[-1].startswith(f"error: rpc server {server.endpoint} lost during a decode"), err.decode()
    assert "Traceback" not in err.decode()
