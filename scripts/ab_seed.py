"""An A/B of two versions of ssd-edge on real models: speed side by side, and the same tokens seed for seed.

    .venv/bin/python scripts/ab_seed.py --base 466468b -m qwen2.5-coder-1.5b --modes ar,sd,auto --temps 0,1 \\
        -n 96 --reps 2 -o ab.jsonl

The base revision is checked out into a git worktree, its own ssd_edge.native compiled there, and run
from there (PYTHONPATH), this checkout as it is beside it: one process per version and pass, loading
the pair once and running every mode and temperature on the same chat prompts and seed, the two
versions in turn (the order swapped every other pass, so a warm or a loaded machine favours neither). Prints a markdown table of decode tokens/s
(medians), each version's host time per decoded position (Stats.host_ms_per_position, where the
version has it) and how many answers are the same token for token. --priced TABLE runs the priced pair
(an H200's prices waited on this CPU) instead of model files. Each generation is a JSON line in -o.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [[{"role": "user", "content": "Write a Python function that merges two sorted lists, with a docstring and tests."}],
           [{"role": "user", "content": "Explain in a short paragraph how a hash map handles collisions."}]]


def build_native(tree: Path) -> None:
    """The base's own compiled part (ssd_edge.native: its ssd_edge/csrc/*.c, or ssd_edge/native.c before
    the split) built into its worktree. Without it the base would not run on numpy's paths but on this
    checkout's library: the editable install maps ssd_edge.native to it wherever the package itself comes
    from, so a change to the C would be on both sides."""
    sources = sorted((tree / "ssd_edge" / "csrc").glob("*.c")) or \
        [p for p in [tree / "ssd_edge" / "native.c"] if p.exists()]
    if not sources:
        return  # a base from before the compiled part
    target = tree / "ssd_edge" / ("native" + sysconfig.get_config_var("EXT_SUFFIX"))
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    done = subprocess.run([*cc, "-O3", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
                           *map(str, sources), "-o", str(target), "-lm"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the base's ssd_edge.native did not build:\n{done.stderr[-2000:]}")


def run_version(args: argparse.Namespace, tag: str) -> None:
    """In a child process: this version's generations, one JSON line each on stdout."""
    import llama_cpp  # noqa: F401  (llama.cpp's library before numpy: llama/preload.py)

    from ssd_edge.config import EngineConfig
    from ssd_edge.engine import Engine

    cfg = EngineConfig.build(target=dict(path=args.model), draft=dict(path=args.model_draft), mode="auto",
                             **({"spec": {"k": args.k}} if args.k else {}))
    if args.priced:  # the priced pair of that table instead of model files (either version's ssd_edge.priced)
        from ssd_edge import priced

        table, _, agreement = args.priced.partition("@")  # TABLE[@AGREEMENT], as bench --priced
        engine = priced.engine(cfg, table, **({"agreement": float(agreement)} if agreement else {}))
    else:
        engine = Engine(cfg)
    engine.complete(messages=PROMPTS[0], max_tokens=4)  # warm-up
    prompts = PROMPTS if not args.prompts else \
        [json.loads(line)["messages"] for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    for temp in (float(t) for t in args.temps.split(",")):
        sampling = cfg.sampling.model_copy(update=dict(temperature=temp, seed=args.seed))
        for mode in args.modes.split(","):
            for i, messages in enumerate(prompts):
                engine.reset()
                c = engine.complete(messages=messages, max_tokens=args.n, sampling=sampling, mode=mode)
                print(json.dumps(dict(tag=tag, mode=mode, temp=temp, prompt=i, tok_s=c.stats.tokens_per_s,
                                      tokens=list(c.tokens), host=getattr(c.stats, "host_ms_per_position", None))),
                      flush=True)


def report(rows: list[dict]) -> str:
    speed, host, answers = defaultdict(list), defaultdict(list), defaultdict(dict)
    for r in rows:
        key = (r["mode"], r["temp"])
        speed[key + (r["tag"],)].append(r["tok_s"])
        if r["host"] is not None:
            host[key + (r["tag"],)].append(r["host"])
        answers[key + (r["prompt"],)].setdefault(r["tag"], r["tokens"])
    lines = ["| mode | T | base tok/s | new tok/s | new/base | base host ms/pos | new host ms/pos | new/base |",
             "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for mode, temp in sorted({(m, t) for m, t, _ in speed}):
        base, new = speed.get((mode, temp, "base"), []), speed.get((mode, temp, "new"), [])
        if base and new:
            b, n = statistics.median(base), statistics.median(new)
            hb, hn = host.get((mode, temp, "base")), host.get((mode, temp, "new"))
            hosts = "| – | – | –" if not (hb and hn) else \
                f"| {statistics.median(hb):.3f} | {statistics.median(hn):.3f} | " \
                f"{statistics.median(hn) / statistics.median(hb):.3f}"
            lines.append(f"| {mode} | {temp:g} | {b:.2f} | {n:.2f} | {n / b:.3f} {hosts} |")
    pairs = [v for v in answers.values() if "base" in v and "new" in v]
    lines.append(f"\nthe same tokens, base and new (first pass of each answer): {sum(v['base'] == v['new'] for v in pairs)} "
                 f"of {len(pairs)}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the git revision to compare against")
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("-md", "--model-draft", default="qwen2.5-coder-0.5b:q4_0")
    ap.add_argument("--modes", default="ar,sd,auto")
    ap.add_argument("--temps", default="0,1")
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("-k", type=int, default=None, help="--draft-max (default: each mode's own)")
    ap.add_argument("--priced", default=None, metavar="TABLE",
                    help="run the priced pair of this price table (h200-1.5b, h200-7b; TABLE@0.8: the draft's "
                         "agreement, as bench --priced) instead of the model files")
    ap.add_argument("--prompts", default=None, metavar="FILE.jsonl",
                    help="the bench's prompts (a JSON object with messages a line, as docs/bench-regimes.jsonl) "
                         "instead of the two built in")
    ap.add_argument("-o", "--output", default=None, help="the generations as JSON lines")
    ap.add_argument("--run", choices=("base", "new"), help=argparse.SUPPRESS)  # a child: one version
    args = ap.parse_args()
    if args.run:
        run_version(args, args.run)
        return 0
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base), args.base], check=True)
        try:
            build_native(base)
            for rep in range(args.reps):
                for tag in (("base", "new") if rep % 2 == 0 else ("new", "base")):
                    env = {"PYTHONPATH": str(base)} if tag == "base" else {}
                    prompts = ["--prompts", str(Path(args.prompts).resolve())] if args.prompts else []  # (run from tmp)
                    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), *sys.argv[1:], *prompts,
                                          "--run", tag],
                                         env={**os.environ, **env}, cwd=tmp, capture_output=True,
                                         text=True, check=True)
                    rows += [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
                    print(f"pass {rep + 1}/{args.reps}: {tag} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    if args.output:
        Path(args.output).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
