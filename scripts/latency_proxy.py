"""A TCP forwarder that adds network latency, for measuring --rpc where `tc netem` is not available
(docs/rpc.md): every chunk is passed on half the round-trip time after it arrived, in each
direction, in order. Latency only; bandwidth is loopback's.

    python scripts/latency_proxy.py --listen 127.0.0.1:50300 --to 127.0.0.1:50052 --rtt-ms 5
    ssd-edge generate --rpc 127.0.0.1:50300 ...

Runs until Ctrl-C or SIGTERM (or --seconds). Loopback addresses only, on purpose.
"""

from __future__ import annotations

import argparse
import queue
import signal
import socket
import threading
import time


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        raise argparse.ArgumentTypeError("loopback addresses only")
    return host, int(port)


def _pipe(src: socket.socket, dst: socket.socket, delay_s: float) -> None:
    """src -> dst, each chunk held until delay_s after it arrived (a reader and a writer thread)."""
    q: queue.Queue = queue.Queue()

    def read() -> None:
        try:
            while chunk := src.recv(1 << 16):
                q.put((time.monotonic() + delay_s, chunk))
        except OSError:
            pass
        q.put((0.0, b""))

    def write() -> None:
        try:
            while True:
                due, chunk = q.get()
                if not chunk:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                dst.sendall(chunk)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    threading.Thread(target=read, daemon=True).start()
    threading.Thread(target=write, daemon=True).start()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", type=_addr, required=True, help="HOST:PORT to accept on (loopback)")
    ap.add_argument("--to", type=_addr, required=True, help="HOST:PORT of the rpc-server (loopback)")
    ap.add_argument("--rtt-ms", type=float, required=True, help="added round-trip time, half each way")
    ap.add_argument("--seconds", type=float, default=3600, help="stop after this long (default 3600)")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    server = socket.create_server(a.listen)
    server.settimeout(0.5)
    delay = a.rtt_ms / 2e3
    end = time.monotonic() + a.seconds
    print(f"forwarding {a.listen[0]}:{a.listen[1]} -> {a.to[0]}:{a.to[1]} with {a.rtt_ms:g} ms added RTT", flush=True)
    try:
        while time.monotonic() < end:
            try:
                client, _ = server.accept()
            except socket.timeout:
                continue
            upstream = socket.create_connection(a.to)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _pipe(client, upstream, delay)
            _pipe(upstream, client, delay)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


if __name__ == "__main__":
    main()
