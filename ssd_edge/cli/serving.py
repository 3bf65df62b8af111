"""ssd-edge serve and rpc-server: this machine serving others, an OpenAI-compatible API over one
engine (server/), or llama.cpp's rpc-server lending its CPU to another machine's --rpc."""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from .. import settings
from ..errors import SSDEdgeError
from ..models import catalog
from . import loader, sources
from .app import ENGINE_OPTIONS, EPILOG, app, with_options
from .reporting import reported, stderr

log = logging.getLogger("ssd_edge.cli")


@app.command(epilog=EPILOG)
@with_options(ENGINE_OPTIONS + settings.SERVER_OPTIONS)
def serve(*, flags: dict[str, Any]) -> None:
    """Serve an OpenAI-compatible API (chat, completions, streaming) and Prometheus /metrics.

    One engine, one generation at a time, a bounded queue behind it. Listens on 127.0.0.1:8080;
    --host opens it to other machines and then needs --api-key. SIGTERM or Ctrl-C stops it (exit 0)."""
    from ..server.runner import serve as run_server

    with reported(flags):
        s = sources.with_hub_models(settings.resolve(flags))
        label = loader.model_label(s["model"] or catalog.load_catalog().default_target)
        code = run_server(s, loader.load_engine, label, lambda line: stderr().print(escape(line)))
    raise typer.Exit(code)


@app.command("rpc-server")
def rpc_server(
    host: Annotated[str, typer.Option("-H", "--host", help="address to listen on; anything but a loopback "
                                      "address lets other machines in, with no authentication")] = "127.0.0.1",
    port: Annotated[int, typer.Option("-p", "--port", help="port to listen on")] = 50052,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", help="CPU threads (default: rpc-server's, "
                                                   "the cores)", show_default=False)] = None,
    cache: Annotated[bool, typer.Option("-c", "--cache", help="keep received tensors in a local file cache "
                                        "(faster reloads)")] = False,
    device: Annotated[Optional[str], typer.Option("-d", "--device", help="comma-separated devices to expose "
                                                  "(default: all)", show_default=False)] = None,
    binary: Annotated[Optional[str], typer.Option("--binary", help="the rpc-server executable (default: "
                                                  "$SSD_EDGE_RPC_SERVER, then what scripts/build_llama_tools.sh "
                                                  "built, then PATH)", show_default=False)] = None,
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks")] = False,
) -> None:
    """Start llama.cpp's rpc-server, so another machine's `ssd-edge ... --rpc THIS_HOST:PORT` runs its target here.

    The RPC protocol has no authentication and no encryption: the server listens on 127.0.0.1 unless
    --host says otherwise, and then warns. Ctrl-C stops it."""
    from ..llama import rpc

    with reported({"debug": debug}):
        exe = rpc.find_server(binary)
        if exe is None:
            where = f"{binary} is not an executable file" if binary else "no rpc-server found"
            raise SSDEdgeError(f"{where}; build it with scripts/build_llama_tools.sh --rpc-server-only (or set "
                               "SSD_EDGE_RPC_SERVER)")
        argv = rpc.server_command(exe, host, port, threads, cache, device.split(",") if device else ())
        warning = rpc.exposure_warning(host)
        if warning:
            stderr().print(f"[yellow]warning:[/] {escape(warning)}")
        log.debug("exec %s", " ".join(argv))
        sys.stdout.flush()
        sys.stderr.flush()
        # rpc-server writes with send(..., 0): a client gone mid-reply (killed, or a probe that gave up on a busy
        # server) raises SIGPIPE, which would end the server. An ignored signal stays ignored across exec.
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        try:
            os.execv(argv[0], argv)  # the launcher steps aside: the other signals and the exit code are rpc-server's
        except OSError as e:
            raise SSDEdgeError(f"cannot start {argv[0]}: {e.strerror}") from None
