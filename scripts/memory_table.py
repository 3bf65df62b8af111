#!/usr/bin/env python3
"""Peak memory (RSS) of one short answer, by mode, context size and KV cache type, beside llama.cpp's
own tools at the same settings (issue 23). Each row is one process under /usr/bin/time; the table
gives the command that made it.

    .venv/bin/python scripts/memory_table.py -o docs/memory              # the default pair
    .venv/bin/python scripts/memory_table.py --ctx 4096 --kv f16 --modes ar auto -o mem

Rows: `ssd-edge generate --chat` in each --modes (a quantized KV cache with flash attention on,
for the target and the draft alike), llama.cpp's `llama-speculative-simple` (the same pair, the same
-c, KV types and -fa) and `llama-simple` (the target alone; it sizes its context to the prompt and
the answer, so it is the floor). The llama.cpp tools come from scripts/build_llama_tools.sh; rows
whose tool is missing are left out and say so. Writes memory.json and memory.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Write a haiku about rain."


def peak_rss(cmd: list[str], timeout: float) -> tuple[int | None, str]:
    """(peak RSS in bytes, the command's stderr tail) of `cmd` run under /usr/bin/time."""
    proc = subprocess.run(["/usr/bin/time", "-f", "@@maxrss %M", *cmd], capture_output=True, text=True,
                          timeout=timeout, errors="replace")
    m = re.search(r"@@maxrss (\d+)", proc.stderr)
    tail = " | ".join(ln for ln in proc.stderr.strip().splitlines()[-3:] if "@@maxrss" not in ln)
    if proc.returncode != 0 or not m:
        return None, f"exit {proc.returncode}: {tail}"
    return int(m.group(1)) * 1024, ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctx", type=int, nargs="+", default=[4096, 32768])
    ap.add_argument("--kv", nargs="+", default=["f16", "q8_0", "q4_0"], choices=["f16", "q8_0", "q4_0"])
    ap.add_argument("--modes", nargs="+", default=["ar", "auto", "ssd"])
    ap.add_argument("-n", type=int, default=32, help="answer tokens")
    ap.add_argument("-m", "--model", help="target (default: the catalog's)")
    ap.add_argument("-md", "--model-draft", help="draft (default: the catalog's, as bench and calibrate pick it)")
    ap.add_argument("--llama-tools", type=Path, default=Path.home() / ".cache/ssd-edge/llama-tools/bin")
    ap.add_argument("-o", "--output", type=Path, required=True)
    a = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from ssd_edge.bench.calibrate import default_pair
    from ssd_edge.models.catalog import resolve_model

    target_name, draft_name = default_pair(a.model, a.model_draft, None)
    target, draft = resolve_model(target_name, None), resolve_model(draft_name, None)
    ssd_edge = str(Path(sys.executable).with_name("ssd-edge"))
    rows = []

    def add(what: str, ctx: int, kv: str, cmd: list[str]) -> None:
        t0 = time.perf_counter()
        rss, error = peak_rss(cmd, timeout=600)
        shown = " ".join(c if " " not in c else repr(c) for c in cmd).replace(str(Path.home()), "~")
        rows.append(dict(what=what, ctx=ctx, kv=kv, peak_rss=rss, error=error or None, command=shown,
                         seconds=round(time.perf_counter() - t0, 1)))
        print(f"{what:<34} -c {ctx:<6} {kv:<5} {rss / 2**30 if rss else float('nan'):6.2f} GiB {error}", file=sys.stderr)

    tools = {name: a.llama_tools / name for name in ("llama-speculative-simple", "llama-simple")}
    env_cmd = ["env", "SSD_EDGE_NO_CALIBRATE=1"]  # a missing profile must not turn a row into a calibration
    for ctx in a.ctx:
        for kv in a.kv:
            memory = ["-ctk", kv, "-ctv", kv, "-ctkd", kv, "-ctvd", kv] + (["-fa", "on"] if kv != "f16" else [])
            for mode in a.modes:
                add(f"ssd-edge --mode {mode}", ctx, kv, env_cmd + [ssd_edge, "generate", "--chat", "-q", "-m", str(target),
                    "-md", str(draft), "-n", str(a.n), "--mode", mode, "-c", str(ctx), *memory, PROMPT])
            spec = tools["llama-speculative-simple"]
            if spec.exists():
                add("llama-speculative-simple", ctx, kv, [str(spec), "--spec-type", "draft-simple", "-m", str(target), "-md", str(draft), "-c", str(ctx),
                    *memory, "-n", str(a.n), "-p", PROMPT])
    if tools["llama-simple"].exists():
        add("llama-simple (target alone)", 0, "f16", [str(tools["llama-simple"]), "-m", str(target), "-n", str(a.n), PROMPT])
    missing = [n for n, p in tools.items() if not p.exists()]

    a.output.mkdir(parents=True, exist_ok=True)
    result = dict(created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), target=str(target), draft=str(draft),
                  tokens=a.n, prompt=PROMPT, load_avg=os.getloadavg(), missing_tools=missing, rows=rows)
    (a.output / "memory.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"Peak RSS of one {a.n}-token answer (`{PROMPT}`), {target.name} + {draft.name}.", "",
             "| what | -c | KV | peak RSS | command |", "|---|--:|---|--:|---|"]
    for r in rows:
        rss = f"{r['peak_rss'] / 2**30:.2f} GiB" if r["peak_rss"] else f"failed: {r['error']}"
        lines.append(f"| {r['what']} | {r['ctx'] or 'prompt + answer'} | {r['kv']} | {rss} | `{r['command']}` |")
    if missing:
        lines += ["", f"Not run (build them with scripts/build_llama_tools.sh): {', '.join(missing)}"]
    (a.output / "memory.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {a.output / 'memory.json'}, {a.output / 'memory.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
