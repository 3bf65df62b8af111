"""`ssd-edge serve`: load the engine once, serve the app with uvicorn, stop gracefully.

On SIGTERM or Ctrl-C uvicorn stops accepting connections; this server's scheduler then refuses
what waits (503), cancels the running generation at its next round (its client gets a 503, or an
error event on a stream), and the process exits 0. A second Ctrl-C stops without waiting.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from typing import Any, Callable

import uvicorn

from ..settings import Settings, engine_config
from ..config import EngineConfig
from ..errors import ConfigError
from .app import MAX_BODY, create_app
from .scheduler import Scheduler

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_MAX_QUEUE = 8


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int) -> socket.socket:
    """Bind before the models load, so a port in use fails fast and in words; and listen at once, so a
    client that connects as soon as the "serving" line appears waits in the backlog until uvicorn
    accepts instead of being refused (a bound socket that does not listen yet refuses)."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise ConfigError(f"invalid --host {host!r}: {e.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror} (another server there? pick --port)") from None
    sock.listen(2048)  # uvicorn's default backlog
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, which also tells the scheduler to stop when a signal arrives."""

    def __init__(self, config: uvicorn.Config, scheduler: Scheduler) -> None:
        super().__init__(config)
        self.scheduler = scheduler
        self.loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        if self.loop is not None:  # a signal handler: leave the locking to the loop
            self.loop.call_soon_threadsafe(self.scheduler.shutdown)


def options(s: Settings) -> dict[str, Any]:
    """The server's own settings, checked before any model loads."""
    host = s["host"] or DEFAULT_HOST
    port = DEFAULT_PORT if s["port"] is None else s["port"]
    if not 0 <= port <= 65535:
        raise s.invalid("port", "must be in 0..65535")
    api_key = s["api_key"] or None
    if not is_loopback(host) and api_key is None:
        raise ConfigError(f"--host {host} lets other machines reach the server: give --api-key KEY (or set "
                          "SSD_EDGE_API_KEY); clients then send 'Authorization: Bearer KEY'")
    max_queue = DEFAULT_MAX_QUEUE if s["max_queue"] is None else s["max_queue"]
    if max_queue < 0:
        raise s.invalid("max_queue", "must be at least 0")
    max_body = MAX_BODY if s["max_body"] is None else s["max_body"]
    if max_body < 1024:
        raise s.invalid("max_body", "must be at least 1024 bytes")
    return dict(host=host, port=port, api_key=api_key, max_queue=max_queue, max_body=max_body)


def serve(s: Settings, load: Callable[[EngineConfig, Settings], Any], model_id: str,
          announce: Callable[[str], None]) -> int:
    opts = options(s)
    cfg = engine_config(s)
    default_max = None if s["n_predict"] in (None, -1) else s.max_tokens(-1, cfg.n_ctx)
    sock = listen(opts["host"], opts["port"])
    try:
        engine = load(cfg, s)
        try:
            app = create_app(engine, model_id=model_id, api_key=opts["api_key"], max_queue=opts["max_queue"],
                             max_body=opts["max_body"], default_max_tokens=default_max)
            config = uvicorn.Config(app, log_level="debug" if log.isEnabledFor(logging.DEBUG) else "info",
                                    timeout_graceful_shutdown=10, lifespan="on")
            server = _Server(config, app.state.api.scheduler)
            host, port = sock.getsockname()[:2]
            where = f"[{host}]" if ":" in host else host
            announce(f"serving {model_id} (mode {cfg.mode}) at http://{where}:{port}/v1 · metrics at /metrics"
                     f"{' · API key required' if opts['api_key'] else ''} · Ctrl-C stops")
            try:
                server.run(sockets=[sock])
            except KeyboardInterrupt:  # uvicorn re-raises the signal it stopped on; the stop was graceful
                pass
            scheduler = app.state.api.scheduler
            scheduler.shutdown()  # a no-op after a graceful stop
            if not scheduler.join(30.0):
                log.warning("the generation did not stop within 30 s; exiting without closing the models")
                engine = None
        finally:
            if engine is not None:
                engine.close()
    finally:
        sock.close()
    return 0
