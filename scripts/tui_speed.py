#!/usr/bin/env python3
"""The TUI's decode speed next to the engine's and the CLI's, and the UI thread's CPU per token (issue 24).

    # in process: the engine alone vs the app headless (Pilot), interleaved, with a breakdown of the UI's time
    python scripts/tui_speed.py pilot --mode auto -n 213 --runs 2 --json out/tui_pilot.json

    # in a real terminal: `ssd-edge generate --chat` vs `ssd-edge tui` in tmux, interleaved; the UI thread's CPU
    # from /proc (the app's main thread), the tmux server's CPU beside it
    python scripts/tui_speed.py terminal --mode auto -n 213 --runs 2 --size 150x45 --json out/tui_tmux.json

    # the same, the TUI once with its UI thread below the engine (the default) and once as the CLI's
    python scripts/tui_speed.py terminal --mode auto --runs 2 --ui-priority idle,normal

Model flags are the CLI's (-m, -md, --mode, -t, -td; the default pair when none is given). Each
measurement carries the 1-minute load average: the machine may be shared, so compare the ratios
measured back to back rather than absolute speeds. Writes JSON (stdout when --json is not given).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Write a Python function that checks whether a string is a palindrome."


def engine_flags(a: argparse.Namespace) -> list[str]:
    out = ["--mode", a.mode]
    for flag, value in (("-m", a.model), ("-md", a.model_draft), ("-t", a.threads), ("-td", a.threads_draft)):
        if value is not None:
            out += [flag, str(value)]
    return out


# ---------------------------------------------------------------- in process (Pilot)

def pilot(a: argparse.Namespace) -> dict:
    from ssd_edge import settings
    from tui.loader import calibrating_engine_factory
    from tui.speedcheck import compare

    s = settings.resolve({"model": a.model, "model_draft": a.model_draft, "mode": a.mode, "threads": a.threads,
                          "threads_draft": a.threads_draft})
    cfg = settings.engine_config(s)
    engine = calibrating_engine_factory(cfg, str(s.models_dir))
    try:
        w, h = a.size
        return asyncio.run(compare(engine, engine.config, a.prompt, a.n, runs=a.runs, size=(w, h),
                                   breakdown=not a.no_breakdown))
    finally:
        engine.close()


# ---------------------------------------------------------------- in a real terminal (tmux)

def _cpu_s(pid: int, tid: int | None = None) -> float:
    """utime + stime of a process (or one of its threads) from /proc, in seconds."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


SOCKET = f"tuispeed{os.getpid()}"  # a tmux server of our own (-L): its CPU is ours to count, its sessions ours


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", SOCKET, *args], check=True, capture_output=True, text=True).stdout


def _env() -> str:
    """The environment the programs in tmux need from ours (tmux starts them from its server's)."""
    keep = {k: os.environ[k] for k in ("PYTHONPATH", "SSD_EDGE_HOME", "SSD_EDGE_MODELS") if k in os.environ}
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in keep.items())


def _wait(condition, timeout: float, poll: float = 0.25, what: str = "") -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(poll)


def _session_alive(name: str) -> bool:
    return subprocess.run(["tmux", "-L", SOCKET, "has-session", "-t", name], capture_output=True).returncode == 0


def _new_session(name: str, size: tuple[int, int], command: str) -> None:
    w, h = size
    _tmux("new-session", "-d", "-s", name, "-x", str(w), "-y", str(h), command)
    _tmux("set-option", "-t", name, "status", "off")  # the whole window is the program's


STATS = re.compile(r"(\d+) tokens? · (—|[\d.]+)(?: tok/s)?")


def cli_run(a: argparse.Namespace, size: tuple[int, int], tmp: Path, i: int) -> dict:
    """`ssd-edge generate --chat -n N` in a tmux pane of the same size (the answer streams onto the pane);
    its stats line (stderr) read back."""
    err, done = tmp / f"cli{i}.err", tmp / f"cli{i}.done"
    exe = shutil.which("ssd-edge") or f"{sys.executable} -m ssd_edge.cli.commands"
    cmd = (f"{exe} generate --chat -n {a.n} {' '.join(engine_flags(a))} {shlex.quote(a.prompt)} "
           f"2> {shlex.quote(str(err))}; touch {shlex.quote(str(done))}")
    name = f"tuispeed-cli{os.getpid()}-{i}"
    load = os.getloadavg()[0]
    _new_session(name, size, f"env {_env()} bash -c {shlex.quote(cmd)}")
    _wait(done.exists, a.timeout, what="the CLI run")
    _wait(lambda: not _session_alive(name), 30, what="the CLI to exit")
    line = err.read_text()
    m = STATS.search(line)
    if not m:
        raise RuntimeError(f"no stats line from the CLI: {line[-500:]}")
    return {"load_avg_1m": load, "stats_line": m.group(0), "tokens": int(m.group(1)),
            "tokens_per_s": float(m.group(2)) if m.group(2) != "—" else None}


def tui_run(a: argparse.Namespace, size: tuple[int, int], tmp: Path, i: int, priority: str) -> dict:
    """`ssd-edge tui` in tmux, its UI thread at `priority` (tui/cores.py): wait for Ready, type the prompt,
    wait for the reply's note in the saved chat, reading the screen 4 times a second meanwhile (the
    longest it stood still: a UI starved of the cores draws nothing for seconds)."""
    chats = tmp / f"chats{i}-{priority.replace(':', '')}"
    exe = shutil.which("ssd-edge") or f"{sys.executable} -m ssd_edge.cli.commands"
    cmd = (f"env {_env()} SSD_EDGE_CHATS={shlex.quote(str(chats))} SSD_EDGE_TUI_PRIORITY={shlex.quote(priority)} "
           f"{exe} tui -n {a.n} {' '.join(engine_flags(a))}")
    name = f"tuispeed-tui{os.getpid()}-{i}-{priority.replace(':', '')}"
    _new_session(name, size, cmd)
    try:
        pid = int(_tmux("list-panes", "-t", name, "-F", "#{pane_pid}").split()[0])
        server = int(_tmux("display-message", "-p", "-t", name, "#{pid}").strip())
        _wait(lambda: "Ready" in _tmux("capture-pane", "-p", "-t", name), a.timeout, what="the models to load")
        load = os.getloadavg()[0]
        ui0, proc0, srv0, t0 = _cpu_s(pid, pid), _cpu_s(pid), _cpu_s(server), time.monotonic()
        _tmux("send-keys", "-t", name, "-l", a.prompt)
        _tmux("send-keys", "-t", name, "Enter")

        def reply() -> dict | None:
            for p in chats.glob("*.json"):
                try:
                    msgs = json.loads(p.read_text())["messages"]
                except (ValueError, KeyError, OSError):
                    continue
                if len(msgs) >= 2 and msgs[-1]["note"]:
                    return msgs[-1]
            return None

        still, shown, changed = 0.0, "", time.monotonic()

        def done() -> bool:  # meanwhile: the longest the screen stood still while the reply was written
            nonlocal still, shown, changed
            now, screen = time.monotonic(), _tmux("capture-pane", "-p", "-t", name)
            if screen != shown:
                shown, changed = screen, now
            still = max(still, now - changed)
            return reply() is not None

        _wait(done, a.timeout, poll=0.25, what="the reply")
        ui, proc, srv, wall = _cpu_s(pid, pid) - ui0, _cpu_s(pid) - proc0, _cpu_s(server) - srv0, time.monotonic() - t0
        screen = _tmux("capture-pane", "-p", "-t", name)
        note = reply()["note"]
        m = STATS.search(note)
        tokens = int(m.group(1)) if m else None
        rate = float(m.group(2)) if m and m.group(2) != "—" else None
        _tmux("send-keys", "-t", name, "C-q")
        _wait(lambda: not _session_alive(name), 60, what="the app to quit")
    finally:
        if _session_alive(name):
            subprocess.run(["tmux", "-L", SOCKET, "kill-session", "-t", name], capture_output=True)
    per = (lambda x: 1e3 * x / tokens) if tokens else (lambda x: None)
    return {"ui_priority": priority, "load_avg_1m": load, "note": note, "tokens": tokens, "tokens_per_s": rate,
            "ui_thread_cpu_ms_per_token": per(ui), "process_cpu_ms_per_token": per(proc),
            "tmux_server_cpu_ms_per_token": per(srv), "wall_s": wall, "longest_still_s": round(still, 2),
            "screen_tail": screen.rstrip().splitlines()[-3:]}


def terminal(a: argparse.Namespace) -> dict:
    if not shutil.which("tmux"):
        raise SystemExit("tmux is not installed: the terminal measurement runs the app in tmux")
    size = tuple(a.size)
    runs = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        try:
            for i in range(a.runs):  # interleaved: CLI, TUI (each priority), CLI, TUI ...
                cli = cli_run(a, size, tmp, i)
                for priority in a.ui_priority:
                    ui = tui_run(a, size, tmp, i, priority)
                    ratio = ui["tokens_per_s"] / cli["tokens_per_s"] if ui["tokens_per_s"] and cli["tokens_per_s"] else None
                    runs.append({"run": i, "cli": cli, "tui": ui, "ratio": ratio})
                    print(json.dumps({**runs[-1], "tui": {k: v for k, v in ui.items() if k != "screen_tail"}}),
                          file=sys.stderr)
        finally:
            subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True)
    medians, still = {}, {}
    for priority in a.ui_priority:
        mine = [r for r in runs if r["tui"]["ui_priority"] == priority]
        ratios = [r["ratio"] for r in mine if r["ratio"]]
        medians[priority] = statistics.median(ratios) if ratios else None
        still[priority] = statistics.median(r["tui"]["longest_still_s"] for r in mine)
    return {"prompt": a.prompt, "max_tokens": a.n, "mode": a.mode, "size": list(size), "cpus": os.cpu_count(),
            "runs": runs, "median_ratio": medians[a.ui_priority[0]], "median_ratio_by_ui_priority": medians,
            "median_longest_still_s_by_ui_priority": still}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("where", choices=("pilot", "terminal"))
    p.add_argument("-m", "--model")
    p.add_argument("-md", "--model-draft")
    p.add_argument("--mode", default="auto")
    p.add_argument("-t", "--threads", type=int)
    p.add_argument("-td", "--threads-draft", type=int)
    p.add_argument("-n", type=int, default=213, help="max tokens per reply")
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--size", type=lambda s: [int(x) for x in s.lower().split("x")], default=[150, 45],
                   help="terminal size, WxH (default 150x45)")
    p.add_argument("--no-breakdown", action="store_true", help="pilot: do not wrap the UI's methods with timers")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for a load or a reply")
    p.add_argument("--json", type=Path, help="write the report here")
    p.add_argument("--ui-priority", type=lambda s: s.split(","), default=["idle"],
                   help="terminal: the TUI's UI thread priority, comma-separated to compare (idle, nice:N, normal; "
                        "tui/cores.py; default idle, the app's own)")
    a = p.parse_args()
    if a.n < 1 or a.runs < 1 or len(a.size) != 2:
        p.error("-n and --runs must be at least 1, --size is WxH")
    report = pilot(a) if a.where == "pilot" else terminal(a)
    report["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    text = json.dumps(report, indent=1, default=str)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
