"""`ssd-edge bench --fim`: the completion bench. The editing sequence of fim.py (llama.vim's requests, the
cursor moving down standard-library files) sent to each set-up in turn, each a server started fresh on the
same target, context size and threads, and stopped after it (also on Ctrl-C):

    llama-server         llama.cpp's server (scripts/build_llama_tools.sh builds it from the pinned llama.cpp
                         sources) with its FIM presets' flags: --cache-reuse 256 -ub 1024 -b 1024
    llama-server+draft   the same with the draft model (-md DRAFT --spec-type draft-simple)
    llama-server+ngram   the same with its n-gram drafts (--spec-type ngram-simple)
    ssd-edge MODE        `ssd-edge serve` (its /infill, as an editor reaches it) with -b 1024 --cache-reuse 256
                         and the draft, in each mode asked (default ar and auto)

Both servers answer the same /infill body, so one client times both: wall time per request, time to the
first streamed token, and the server's own tokens_cached and timings. Without llama-server (not built,
or --no-peer), ssd-edge's side runs alone and the run says how to build it."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import ConfigError
from .args import BenchArgs
from .fim import Completion, first_line, first_line_ok, sequence, stdlib_sources, FILES
from .fim_report import FimRecord, FimResult, FimSetup, goal, markdown, summarize, write
from .peer_server import LlamaServer, find

PRESET = ("--cache-reuse", "256", "-ub", "1024", "-b", "1024")  # llama.cpp's --fim-qwen-* presets
OURS = ("-b", "1024", "--cache-reuse", "256")
ENTRY = "from ssd_edge.cli.entry import main; main()"
BUILD_HINT = "build it with scripts/build_llama_tools.sh (into ~/.cache/ssd-edge/llama-tools/bin), or point --llama-tools at it"


class SsdServe(LlamaServer):
    """`ssd-edge serve` in `mode` over the pair, as a child process (this Python, the installed package)."""

    def __init__(self, target: Path, draft: Path, mode: str, *, threads: int, n_ctx: int,
                 extra: Sequence[str] = ()) -> None:
        super().__init__(Path(sys.executable), target, threads=threads, n_ctx=n_ctx, ready_s=900, extra=extra)
        self.name, self.draft, self.mode = "ssd-edge serve", draft, mode

    def command(self) -> list[str]:
        return [sys.executable, "-c", ENTRY, "serve", "-m", str(self.target), "-md", str(self.draft), "--mode",
                self.mode, "-t", str(self.threads), "-c", str(self.n_ctx), "--host", "127.0.0.1", "--port",
                str(self.port), *self.extra]


def shown(server: LlamaServer) -> list[str]:
    """The server's command line as a user would type it (no port: each run picks a free one)."""
    cmd = server.command()
    cmd = ["ssd-edge", *cmd[3:]] if isinstance(server, SsdServe) else [Path(cmd[0]).name, *cmd[1:]]
    i = cmd.index("--port")
    return cmd[:i] + cmd[i + 2:]


def setups(args: BenchArgs, target: Path, draft: Path, threads: int, server_bin: Path | None,
           modes: Sequence[str]) -> list[tuple[str, LlamaServer]]:
    """The set-ups to run, in order: llama-server's three (where found), then ssd-edge's modes."""
    out: list[tuple[str, LlamaServer]] = []
    if server_bin is not None:
        t = str(threads)
        kinds = {"llama-server": (), "llama-server+draft": ("-md", str(draft), "--spec-type", "draft-simple",
                                                            "-td", t, "-tbd", t),
                 "llama-server+ngram": ("--spec-type", "ngram-simple")}
        out += [(name, LlamaServer(server_bin, target, threads=threads, n_ctx=args.ctx_size, extra=(*PRESET, *more)))
                for name, more in kinds.items()]
    extra = (*OURS, *(("--no-calibrate",) if args.no_calibrate else ()))
    out += [(f"ssd-edge {m}", SsdServe(target, draft, m, threads=threads, n_ctx=args.ctx_size, extra=extra))
            for m in modes]
    return out


@dataclass
class Answer:
    seconds: float
    ttft_s: float | None
    final: dict[str, Any]
    content: str


def ask(client: Any, body: dict[str, Any]) -> Answer:
    """One /infill request, streamed (its events read as they come) or whole; RuntimeError on a refusal."""
    t0 = time.perf_counter()
    if not body.get("stream"):
        r = client.post("/infill", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"/infill answered {r.status_code}: {r.text[:200]}")
        return Answer(time.perf_counter() - t0, None, r.json(), "")
    ttft, parts, final = None, [], {}
    with client.stream("POST", "/infill", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"/infill answered {r.status_code}: {r.read().decode(errors='replace')[:200]}")
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise RuntimeError(f"/infill failed: {event['error']}")
            if event.get("content") and ttft is None:
                ttft = time.perf_counter() - t0
            parts.append(event.get("content", ""))
            if event.get("stop"):
                final = event
    return Answer(time.perf_counter() - t0, ttft, final, "".join(parts))


def record(name: str, c: Completion, a: Answer) -> FimRecord:
    t = a.final.get("timings") or {}

    def num(d: dict[str, Any], k: str) -> Any:
        return d.get(k) if isinstance(d.get(k), (int, float)) else None

    return FimRecord(setup=name, index=c.index, file=c.file, row=c.row + 1, seconds=a.seconds, ttft_s=a.ttft_s,
                     tokens_cached=num(a.final, "tokens_cached"), prompt_n=num(t, "prompt_n"),
                     predicted_n=num(t, "predicted_n"), predicted_ms=num(t, "predicted_ms"),
                     prompt_ms=num(t, "prompt_ms"), first_line_ok=first_line_ok(c.typed, c.cut, a.content),
                     first_line=first_line(c.typed, a.content), cut=c.cut)


def run_setup(name: str, server: LlamaServer, steps: Sequence[tuple[str, Any]], records: list[FimRecord],
              tick: Callable[[str], None]) -> tuple[float, str | None]:
    """The sequence against one server; its warm-ups' time and the error that stopped it (None)."""
    import httpx

    warm = 0.0
    tick(f"{name}: starting the server")
    try:
        # a connection a request (llama.vim runs curl for each): llama-server drops the one a streamed answer
        # came on, and a client that reused it would read "disconnected without sending a response"
        with server, httpx.Client(base_url=server.url, timeout=httpx.Timeout(900.0, connect=5.0),
                                  headers={"Connection": "close"}) as client:
            for kind, step in steps:
                if kind == "warm":
                    warm += ask(client, step).seconds
                    continue
                tick(f"{name}: {step.file}:{step.row + 1} ({step.index + 1})")
                rec = record(name, step, ask(client, step.body))
                records.append(rec)
                tick("")
    except (RuntimeError, OSError, httpx.HTTPError) as e:
        return warm, str(e)
    return warm, None


def main(args: BenchArgs) -> int:
    """Run the completion bench, write bench.json and bench.md, print the table; 130 if Ctrl-C cut it short."""
    from rich.console import Console

    from ..models.catalog import resolve_model
    from ..planning.profile import device_info
    from ..progress import Progress
    from .calibrate import default_pair
    from .. import paths
    from .machine import PortablePaths, machine_info

    args = args.checked()
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    target_name, draft_name = default_pair(args.model, args.model_draft, args.models_dir)
    target, draft = resolve_model(target_name, args.models_dir), resolve_model(draft_name, args.models_dir)
    out = Path(args.output).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create the output folder {out}: {e.strerror}") from None
    steps = list(sequence(stdlib_sources(), args.fim_cursors, seed=args.seed, n_predict=args.max_tokens))
    n_fim = sum(1 for k, _ in steps if k == "fim")
    threads = device_info().cores
    notes = []
    server_bin = None if args.no_peer else find(args.llama_tools)
    if server_bin is None and not args.no_peer:
        notes.append(f"llama-server not found: ssd-edge's side ran alone ({BUILD_HINT})")
        console.print(f"[yellow]note:[/] llama-server not found; running ssd-edge's side alone ({BUILD_HINT})")
    runs = setups(args, target, draft, threads, server_bin, args.modes)
    records: list[FimRecord] = []
    done: list[FimSetup] = []
    machine = machine_info(threads)
    portable = PortablePaths(paths.models_dir(args.models_dir))  # a result names no machine (machine.py)
    interrupted = False
    with Progress(console) as progress:
        task = progress.task("loading", total=len(runs) * n_fim)

        def tick(what: str) -> None:
            task.begin(what) if what else task.done()

        for name, server in runs:
            setup = FimSetup(name=name, server="ssd-edge" if isinstance(server, SsdServe) else "llama-server",
                             command=[portable.text(x) for x in shown(server)])
            warm, error = 0.0, None
            try:
                warm, error = run_setup(name, server, steps, records, tick)
            except KeyboardInterrupt:  # the server is stopped on leaving its `with`
                interrupted = True
            done.append(summarize(setup, records, warm).model_copy(update={"error": error and portable.text(error)}))
            if error:
                console.print(f"[red]{name} failed:[/] {error}")
            if interrupted:
                break
    machine = machine.model_copy(update={"load_avg_end": os.getloadavg()})
    result = FimResult(command="ssd-edge bench " + " ".join(portable.text(x) for x in args.argv), created=dt.datetime.now().isoformat(
        timespec="seconds"), machine=machine, models={"target": target.name, "draft": draft.name},
        files=list(FILES), per_file=args.fim_cursors, n_predict=args.max_tokens, n_ctx=args.ctx_size, threads=threads,
        notes=notes, setups=done, goal=goal(done), interrupted=interrupted, records=records)
    written = write(result, out)
    console.print(markdown(result).split("\n## Set-ups")[0].strip())
    console.print("wrote " + ", ".join(str(p) for p in written))
    return 130 if interrupted else 0
