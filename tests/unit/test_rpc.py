"""rpc.py without the compiled library: endpoint parsing, the HELLO probe against sockets on
127.0.0.1, the rpc-server command line and the exposure warning. The real rpc-server is
exercised in tests/real/test_rpc_real.py."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from ssd_edge.config import EngineConfig
from ssd_edge.config import Endpoint, parse_endpoint, parse_endpoints
from ssd_edge.errors import ConfigError, RPCError
from ssd_edge.llama import rpc


@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1:50052", Endpoint("127.0.0.1", 50052)),
    (" gpu-box.lan:1 ", Endpoint("gpu-box.lan", 1)),
    ("10.0.0.2:65535", Endpoint("10.0.0.2", 65535)),
])
def test_parse_endpoint(text, expected):
    assert parse_endpoint(text) == expected and str(expected) == text.strip()


@pytest.mark.parametrize("text, why", [
    ("127.0.0.1", "expected HOST:PORT"),
    (":50052", "expected HOST:PORT"),
    ("host:", "expected HOST:PORT"),
    ("host:port", "the port must be a number"),
    ("host:0", "the port must be a number from 1 to 65535"),
    ("host:70000", "from 1 to 65535"),
    ("::1:50052", "IPv6"),
    ("-H:1", "bad host name"),
])
def test_parse_endpoint_rejects(text, why):
    with pytest.raises(ConfigError, match=why) as e:
        parse_endpoint(text)
    assert repr(text) in str(e.value)  # the message names what the user typed


def test_parse_endpoints_list_order_and_repeats():
    assert parse_endpoints("a:1,b:2,a:1") == [Endpoint("a", 1), Endpoint("b", 2)]
    assert parse_endpoints(["a:1", "b:2,c:3"]) == [Endpoint("a", 1), Endpoint("b", 2), Endpoint("c", 3)]
    assert parse_endpoints(None) == [] and parse_endpoints("") == [] and parse_endpoints([]) == []
    with pytest.raises(ConfigError, match="empty endpoint"):
        parse_endpoints("a:1,,b:2")
    with pytest.raises(ConfigError, match="at most 16"):
        parse_endpoints(",".join(f"h:{p}" for p in range(1, 18)))


def test_engine_config_validates_endpoints_and_keeps_the_draft_local():
    cfg = EngineConfig.build(target=dict(path="t.gguf", rpc=["127.0.0.1:50052", "127.0.0.1:50052"]))
    assert cfg.target.rpc == ["127.0.0.1:50052"] and cfg.target.rpc_timeout_s == 60
    with pytest.raises(ConfigError, match="target.rpc"):
        EngineConfig.build(target=dict(path="t.gguf", rpc=["nope"]))
    with pytest.raises(ConfigError, match="the draft runs on this machine"):
        EngineConfig.build(target=dict(path="t.gguf"), draft=dict(path="d.gguf", rpc=["127.0.0.1:1"]))


# ---------------------------------------------------------------- the probe, on loopback sockets

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Listener:
    """A loopback server thread that answers one connection with `reply(request)` (None: stays silent)."""

    def __init__(self, reply):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(5)
        self.port = self.sock.getsockname()[1]
        self.request = b""
        self.reply = reply
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(5)
            while len(self.request) < 1 + 8 + 24:
                chunk = conn.recv(64)
                if not chunk:
                    return
                self.request += chunk
            answer = self.reply(self.request)
            if answer is None:
                time.sleep(1.0)
                return
            conn.sendall(answer)

    def close(self):
        self.sock.close()
        self.thread.join(5)


def _hello(major, minor, patch=0):
    return struct.pack("<Q", 28) + bytes([major, minor, patch, 0]) + bytes(24)


def test_probe_speaks_hello_like_llama_cpp():
    srv = _Listener(lambda req: _hello(rpc.PROTO_MAJOR, rpc.PROTO_MINOR))
    try:
        rpc.probe(Endpoint("127.0.0.1", srv.port), timeout_s=3)
    finally:
        srv.close()
    # | cmd 14 (HELLO) | size 24, little-endian u64 | 24 bytes of zero caps (plain TCP) |
    assert srv.request == bytes([14]) + struct.pack("<Q", 24) + bytes(24)


def test_probe_refused_port_names_the_endpoint():
    port = _closed_port()
    with pytest.raises(RPCError, match=f"rpc server 127.0.0.1:{port} is unreachable"):
        rpc.probe(Endpoint("127.0.0.1", port), timeout_s=2)


@pytest.mark.timeout(60)  # the point is that the probe gives up (the message says after 0.3 s), not hangs
def test_probe_silent_server_times_out():
    srv = _Listener(lambda req: None)
    try:
        with pytest.raises(RPCError, match=r"did not answer within 0.3 s"):
            rpc.probe(Endpoint("127.0.0.1", srv.port), timeout_s=0.3)
    finally:
        srv.close()


@pytest.mark.parametrize("reply, why", [
    (lambda req: _hello(rpc.PROTO_MAJOR + 1, 0), "speaks protocol 8.0.0"),
    (lambda req: _hello(rpc.PROTO_MAJOR, rpc.PROTO_MINOR + 1), "speaks protocol 7.1.0"),
    (lambda req: struct.pack("<Q", 3) + b"abc", "not a llama.cpp rpc-server"),
    (lambda req: b"HTTP/1.1 400 Bad Request\r\n\r\n", "not a llama.cpp rpc-server"),
])
def test_probe_rejects_other_servers(reply, why):
    srv = _Listener(reply)
    try:
        with pytest.raises(RPCError, match=why):
            rpc.probe(Endpoint("127.0.0.1", srv.port), timeout_s=2)
    finally:
        srv.close()


# ---------------------------------------------------------------- the launcher's command line

def test_server_command():
    assert rpc.server_command("/x/ggml-rpc-server") == ["/x/ggml-rpc-server", "--host", "127.0.0.1",
                                                        "--port", "50052"]
    assert rpc.server_command("s", "0.0.0.0", 6000, threads=2, cache=True, devices=["CPU"]) == [
        "s", "--host", "0.0.0.0", "--port", "6000", "--threads", "2", "--device", "CPU", "--cache"]
    with pytest.raises(ConfigError, match="--port 0"):
        rpc.server_command("s", port=0)
    with pytest.raises(ConfigError, match="--threads 0"):
        rpc.server_command("s", threads=0)
    with pytest.raises(ConfigError, match="--host"):
        rpc.server_command("s", host="a b")


@pytest.mark.parametrize("host, exposed", [("127.0.0.1", False), ("127.0.0.2", False), ("localhost", False),
                                           ("::1", False), ("0.0.0.0", True), ("192.168.1.5", True),
                                           ("box.lan", True)])
def test_exposure_warning(host, exposed):
    warning = rpc.exposure_warning(host)
    assert (warning is not None) == exposed
    if exposed:
        assert "no authentication and no encryption" in warning and host in warning


def test_find_server_prefers_explicit_then_env(tmp_path, monkeypatch):
    exe = tmp_path / "ggml-rpc-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("SSD_EDGE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SSD_EDGE_LLAMA_TOOLS", raising=False)
    monkeypatch.setenv("SSD_EDGE_RPC_SERVER", str(exe))
    assert rpc.find_server() == exe
    assert rpc.find_server(str(tmp_path / "missing")) is None
    monkeypatch.delenv("SSD_EDGE_RPC_SERVER")
    keyed = tmp_path / "home" / "rpc-server" / "0.3.36-abc" / "ggml-rpc-server"
    keyed.parent.mkdir(parents=True)
    keyed.write_text("#!/bin/sh\n")
    keyed.chmod(0o755)
    assert rpc.find_server() == keyed  # what `build_llama_tools.sh --rpc-server-only` leaves


# ---------------------------------------------------------------- the guard around calls that wait on a server

def _state():
    from ssd_edge.llama.rpc_guard import RpcGuard  # importing the guard loads no library

    return RpcGuard()


EP = [Endpoint("127.0.0.1", 50052)]


def test_guarded_call_returns_the_result_at_once():
    st = _state()
    assert st.call("a decode", EP, 5.0, lambda a, b: a + b, 2, 3) == 5
    assert st.lost is None
    assert st.call("a decode", EP, 5.0, lambda: "again") == "again"  # and the next call runs too


def test_guarded_call_times_out_and_marks_rpc_lost():
    st = _state()
    with pytest.raises(RPCError, match=r"rpc server 127.0.0.1:50052 did not answer within 0.2 s during a decode"):
        st.call("a decode", EP, 0.2, time.sleep, 2.0)
    assert st.lost == "no answer within 0.2 s"
    with pytest.raises(RPCError, match="RPC is unusable in this process"):  # and refuses what comes after
        st.call("a decode", EP, 5.0, lambda: None)


def test_guarded_call_ends_when_another_thread_reports_the_loss():
    st = _state()
    parked = threading.Event()  # set only after the call has returned: the decode it stands for never ends

    def decode():
        parked.wait(60)  # stands for a decode parked with its dispatcher

    threading.Timer(0.1, st.lose, ["Remote RPC server crashed or returned malformed response"]).start()
    try:
        # order, not time: the call ends with the loss while the decode is still parked (with the 30 s
        # timeout it would end with "did not answer within 30 s" instead, after the loss went unseen)
        with pytest.raises(RPCError, match=r"lost during a decode \(Remote RPC server crashed"):
            st.call("a decode", EP, 30.0, decode)
        assert not parked.is_set()
    finally:
        parked.set()


def test_interrupt_waits_for_the_call_to_end_before_it_propagates():
    """Ctrl-C during a guarded call: the C call cannot be stopped and its context must not be used from two
    threads, so KeyboardInterrupt comes out only once the call has ended."""
    import signal

    st = _state()
    ended = []

    def slow():
        time.sleep(0.4)
        ended.append(time.monotonic())

    previous = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    signal.setitimer(signal.ITIMER_REAL, 0.1)
    try:
        with pytest.raises(KeyboardInterrupt):
            st.call("a decode", EP, 5.0, slow)
        assert ended and time.monotonic() >= ended[0]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
