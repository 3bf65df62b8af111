"""llama.cpp's RPC backend, the parts that need no compiled library: a liveness probe
and the command line of the `rpc-server` that `ssd-edge rpc-server` launches.

    --rpc 192.168.1.20:50052,192.168.1.21:50052      the target's offloaded layers go there

model.py registers the endpoints with ggml (`ggml_backend_rpc_add_server`). Before it does, every
endpoint is probed here with the protocol's own HELLO: llama.cpp's client calls abort() when it
cannot connect or the handshake fails, so a wrong port must be caught in Python first.

The protocol (vendored ggml/src/ggml-rpc/ggml-rpc.cpp, protocol 7.0.0) has no authentication and no
encryption: anyone who reaches the port can read and write the server's memory buffers. Run it on a
trusted network only; the launcher binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import struct
from pathlib import Path
from typing import Sequence

from ..config import RPC_PORT, Endpoint
from ..errors import ConfigError, RPCError

PROTO_MAJOR = 7               # RPC_PROTO_MAJOR_VERSION of the vendored ggml-rpc.h (llama-cpp-python 0.3.36)
PROTO_MINOR = 0
_CMD_HELLO = 14               # RPC_CMD_HELLO ("must be always 14")
_CAPS = 24                    # RPC_CONN_CAPS_SIZE: zero caps ask for plain TCP
SERVER_NAMES = ("ggml-rpc-server", "rpc-server")  # the target is ggml-rpc-server in this llama.cpp


def probe(ep: Endpoint, timeout_s: float = 3.0) -> None:
    """Connect and do the protocol's HELLO, as llama.cpp's client will; RPCError naming the endpoint if that
    fails. The server serves one client at a time, so a busy server times out here too."""
    try:
        with socket.create_connection((ep.host, ep.port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(struct.pack("<BQ", _CMD_HELLO, _CAPS) + bytes(_CAPS))
            head = _recv_exactly(sock, 8)
            (size,) = struct.unpack("<Q", head)
            if size != 4 + _CAPS:
                raise RPCError(f"rpc server {ep} answered the handshake with {size} bytes: not a llama.cpp "
                               f"rpc-server of protocol {PROTO_MAJOR}.x")
            major, minor, patch = _recv_exactly(sock, size)[:3]
    except socket.timeout:
        raise RPCError(f"rpc server {ep} did not answer within {timeout_s:g} s (busy with another client, "
                       "or not an rpc-server)") from None
    except socket.gaierror as e:
        raise RPCError(f"rpc server {ep}: unknown host ({e.strerror})") from None
    except OSError as e:
        raise RPCError(f"rpc server {ep} is unreachable: {e.strerror or e}") from None
    if major != PROTO_MAJOR or minor > PROTO_MINOR:
        raise RPCError(f"rpc server {ep} speaks protocol {major}.{minor}.{patch}, this build {PROTO_MAJOR}."
                       f"{PROTO_MINOR}: build its rpc-server from the same llama-cpp-python (scripts/"
                       "build_llama_tools.sh --rpc-server-only)")


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionResetError("the connection closed during the handshake")
        buf += chunk
    return buf


# ---------------------------------------------------------------- the launcher

def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_command(binary: str | os.PathLike[str], host: str = "127.0.0.1", port: int = RPC_PORT,
                   threads: int | None = None, cache: bool = False, devices: Sequence[str] = ()) -> list[str]:
    """argv for llama.cpp's rpc-server (flags of vendored tools/rpc/rpc-server.cpp)."""
    if not 1 <= port <= 65535:
        raise ConfigError(f"invalid --port {port}: must be from 1 to 65535")
    if threads is not None and threads < 1:
        raise ConfigError(f"invalid --threads {threads}: must be at least 1")
    if not host or any(c.isspace() for c in host):
        raise ConfigError(f"invalid --host {host!r}")
    argv = [str(binary), "--host", host, "--port", str(port)]
    if threads is not None:
        argv += ["--threads", str(threads)]
    if devices:
        argv += ["--device", ",".join(devices)]
    if cache:
        argv.append("--cache")
    return argv


def exposure_warning(host: str) -> str | None:
    """The warning for a server reachable from other machines; None on a loopback address."""
    if is_loopback(host):
        return None
    return (f"rpc-server on {host}: llama.cpp's RPC protocol has no authentication and no encryption; anyone who "
            "reaches this port can read and write its memory. Use it on a trusted network only.")


def find_server(explicit: str | None = None) -> Path | None:
    """The rpc-server binary: `explicit`, $SSD_EDGE_RPC_SERVER, what scripts/build_llama_tools.sh built
    (llama-tools/bin, or the --rpc-server-only cache rpc-server/VERSION-FLAGS/, newest first), then PATH."""
    from .. import paths

    given = explicit or os.environ.get("SSD_EDGE_RPC_SERVER")
    if given:
        p = Path(given).expanduser()
        return p if p.is_file() and os.access(p, os.X_OK) else None
    tools = os.environ.get("SSD_EDGE_LLAMA_TOOLS")
    dirs = ([Path(tools).expanduser() / "bin"] if tools else []) + [paths.home() / "llama-tools" / "bin"]
    candidates = [d / n for d in dirs for n in SERVER_NAMES]
    keyed = [p for p in (paths.home() / "rpc-server").glob("*/ggml-rpc-server") if p.is_file()]
    candidates += sorted(keyed, key=lambda p: -p.stat().st_mtime)
    for p in candidates:
        if p.is_file() and os.access(p, os.X_OK):
            return p
    for name in SERVER_NAMES:
        found = shutil.which(name)
        if found:
            return Path(found)
    return None
