"""A child process for tests/real/test_rpc_real.py: an engine whose target lives on an rpc-server,
a generation during which that server is killed (SIGKILL: the connection resets) or frozen
(SIGSTOP: it stops answering, the decode timeout must fire), then a local engine in the same
process. Prints one JSON line. Its own process, because after a lost server llama.cpp's RPC
threads stay parked until the process exits (ssd_edge/llama/rpc_guard.py).

    python rpc_child.py kill|freeze SERVER_PID HOST:PORT TARGET DRAFT MODE
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from ssd_edge.config import EngineConfig
from ssd_edge.engine import Engine
from ssd_edge.errors import RPCError
from ssd_edge.events import TokenEvent

PROMPT = "Once upon a time, in a small village by the sea,"


def main() -> None:
    how, pid, endpoint, target, draft, mode = sys.argv[1:7]
    base = dict(target=dict(path=target, threads=1), draft=dict(path=draft, threads=1), n_ctx=1024, mode=mode,
                sampling=dict(temperature=0.0))
    remote = EngineConfig.build(**{**base, "target": dict(path=target, threads=1, rpc=[endpoint], n_gpu_layers=-1,
                                                           rpc_timeout_s=3.0)})
    out: dict = {"how": how}
    engine = Engine(remote)
    tokens = 0
    t_fault = None
    try:
        for ev in engine.generate(PROMPT, max_tokens=600):
            if isinstance(ev, TokenEvent):
                tokens += len(ev.tokens)
                if tokens >= 8 and t_fault is None:
                    os.kill(int(pid), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
                    t_fault = time.monotonic()
        out["error"] = None
    except RPCError as e:
        out["error"] = str(e)
        out["exit_code"] = e.exit_code
    out["seconds_to_error"] = time.monotonic() - t_fault if t_fault is not None else None
    out["tokens_before"] = tokens
    t0 = time.monotonic()
    engine.close()  # must not wait on the lost server
    out["close_s"] = time.monotonic() - t0
    if how == "freeze":
        os.kill(int(pid), signal.SIGKILL)
    with Engine(EngineConfig.build(**base)) as local:  # local models keep working in this process
        done = local.complete(PROMPT, max_tokens=12)
    out["local_tokens"] = list(done.tokens)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
