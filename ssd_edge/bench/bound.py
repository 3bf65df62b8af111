"""The most any planner could make of a pair here: an oracle bound for mode auto, by category.

    python -m ssd_edge.bench.bound -m TARGET -md DRAFT [--prompts FILE] [-n 128] [-o bound.json]

For each prompt, the target's own greedy answer is generated (mode ar), then, knowing that answer,
the cheapest way to produce it from the proposers auto has is found exactly (dynamic programming
over the rounds): each round a plain step, an n-gram copy of m tokens (the lookup auto asks), or
the draft model drafting k tokens (greedy: it is accepted as far as its own greedy choices agree
with the answer), up to the planner's caps (8 and 16). Costs are timed here, for each prompt, in
the middle of its answer (medians of 5 interleaved passes): the target's decode of 1 .. 17 tokens,
the draft's step and catch-up reads, and the draft's reading of the prompt; before it drafts, the
draft reads every token committed since it last drafted. The bound knows every round's outcome in
advance, which no planner does. It leaves out what auto does beyond one proposer a round: a draft
that reads the n-gram copy as its guess, and the pre-speculation worker (which pays only where the
draft runs beside the target; with both models on every core there is no room for it).

Printed and written (JSON), per prompt and category, as speedups over plain steps at the same
prices: the bound, the bound with the draft model alone and with the n-gram copies alone, and
fixed sd at k = 3 (llama.cpp's default; a peer that drafts like sd is about there), each with the
draft's prompt read counted where the draft runs (as auto's decode counts it). A goal above the
bound is out of reach of any plan of one proposer a round, at these prices, on this device.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

UNREAD_CAP = 64  # catch-up reads longer than this cost as much as this (they are rare and priced flat past it)


def runs(agree: Sequence[bool]) -> list[int]:
    """runs[i]: how many predictions in a row, from position i, agree with the answer."""
    out = [0] * (len(agree) + 1)
    for i in range(len(agree) - 1, -1, -1):
        out[i] = out[i + 1] + 1 if agree[i] else 0
    return out[:-1]


@dataclass(frozen=True)
class Prices:
    """A decode's cost in ms: target(n) a target decode of n tokens (a step, or a verify of n - 1
    drafts), draft(n) a draft decode of n tokens (a step, or a catch-up read ending in a step)."""

    target: Callable[[int], float]
    draft: Callable[[int], float]


def best_ms(n: int, prices: Prices, *, draft_runs: Sequence[int] | None, ngram: Sequence[tuple[int, int]] | None,
            draft_cap: int = 8, ngram_cap: int = 16) -> tuple[float, dict[str, int]]:
    """The least time to commit n tokens, and the rounds of each kind it takes.

    draft_runs[i]: tokens from position i the greedy draft gets right (None: no draft model);
    ngram[i]: (tokens the lookup proposes at i, how many of them are right) (None: no lookup).
    A round at i commits its accepted tokens and the target's own next one. The draft has read
    everything before its last draft round; a draft round first reads what it missed (u tokens),
    which is why the state is (i, u)."""
    inf = float("inf")
    # T[i][u]: least ms to commit tokens i..n-1 with the draft u tokens behind
    T = [[inf] * (UNREAD_CAP + 1) for _ in range(n + 1)]
    how: list[list[tuple[str, int] | None]] = [[None] * (UNREAD_CAP + 1) for _ in range(n + 1)]
    T[n] = [0.0] * (UNREAD_CAP + 1)
    step = prices.target(1)
    d1 = prices.draft(1)
    for i in range(n - 1, -1, -1):
        left = n - i
        for u in range(UNREAD_CAP + 1):
            later = lambda j: T[min(n, j)][min(UNREAD_CAP, u + (j - i))]  # noqa: E731  (the draft falls behind)
            best, pick = step + later(i + 1), ("plain", 0)
            if ngram is not None and ngram[i][0]:
                proposed, right = ngram[i]
                for m in range(1, min(proposed, ngram_cap, left - 1) + 1):
                    t = prices.target(m + 1) + later(i + min(right, m) + 1)
                    if t < best:
                        best, pick = t, ("ngram", m)
            if draft_runs is not None:
                read = prices.draft(u + 1)
                for k in range(1, min(draft_cap, left - 1) + 1):
                    a = min(draft_runs[i], k)
                    t = read + (k - 1) * d1 + prices.target(k + 1) + T[min(n, i + a + 1)][int(a == k)]
                    if t < best:
                        best, pick = t, ("draft", k)
            T[i][u], how[i][u] = best, pick
    counts: dict[str, int] = {}
    i, u = 0, 0
    while i < n:
        kind, m = how[i][u]  # type: ignore[misc]
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "draft":
            a = min(draft_runs[i], m)  # type: ignore[index]
            i, u = i + a + 1, int(a == m)
        else:
            a = 0 if kind == "plain" else min(ngram[i][1], m)  # type: ignore[index]
            i, u = i + a + 1, min(UNREAD_CAP, u + a + 1)
    return T[0][0], counts


def fixed_sd_ms(n: int, prices: Prices, draft_runs: Sequence[int], k: int) -> float:
    """Fixed sd at k drafted tokens a round (the draft never behind)."""
    i, ms = 0, 0.0
    while i < n:
        kk = min(k, n - i - 1)
        if kk < 1:
            ms += prices.target(1)
            i += 1
            continue
        a = min(draft_runs[i], kk)
        ms += kk * prices.draft(1) + prices.target(kk + 1)
        i += a + 1
    return ms


@dataclass
class PromptBound:
    id: str
    category: str
    prompt_tokens: int
    tokens: int
    prompt_read_ms: float
    step_ms: float
    verify4_ms: float
    draft_step_ms: float
    bound_x: float       # speedups over plain steps at the same prices
    draft_only_x: float
    ngram_only_x: float
    sd3_x: float
    rounds: dict[str, int]


def measured_prices(engine, prefix: Sequence[int], most: int, passes: int = 5) -> Prices:
    """The pair's decode costs after `prefix`, timed now: the target's and the draft's decodes of
    1 .. most tokens, each the median of `passes` passes over all the sizes (interleaved, so that a
    machine growing busier or quieter moves every size alike); a catch-up read longer than `most`
    extends the draft's last slope."""
    from .timings import filler

    timer = engine.decode_timer()
    times: dict[str, list[list[float]]] = {"target": [[] for _ in range(most)], "draft": [[] for _ in range(most)]}
    for _ in range(passes):
        for model, table in times.items():
            for n in range(1, most + 1):
                table[n - 1].append(timer.decode_ms(model, prefix, filler(n)))
    target, draft = ([float(np.median(x)) for x in times[m]] for m in ("target", "draft"))
    slope = max(0.0, (draft[-1] - draft[most // 2 - 1]) / (most - most // 2))
    return Prices(lambda n: target[n - 1], lambda n: draft[n - 1] if n <= most else draft[-1] + (n - most) * slope)


def measure_prompt(engine, prompt_id: str, category: str, messages, max_tokens: int,
                   draft_cap: int, ngram_cap: int) -> PromptBound | None:
    """The bound on one prompt (None: an answer of fewer than 2 tokens leaves no rounds to plan)."""
    from ..events import FinishEvent
    from ..speculation.drafters import NgramDrafter

    prompt = engine.prompt_tokens(messages=messages)
    answer: list[int] = []
    for ev in engine.generate(tokens=prompt, max_tokens=max_tokens, mode="ar"):
        if not isinstance(ev, FinishEvent):
            answer.extend(ev.tokens)
    # The first token comes from reading the prompt, in every mode: the rounds make the rest (what the
    # bench's decode tokens/s counts), after the history prompt + answer[0].
    history, out = prompt + answer[:1], answer[1:]
    n = len(out)
    if n < 2:
        return None
    kv = engine.draft_kv
    kv.truncate(0)
    t0 = time.perf_counter()
    kv.feed(history)  # what the draft reads before it can draft at all
    read_ms = (time.perf_counter() - t0) * 1e3
    rows = kv.feed(history + out, rows=n + 1)  # row j: the draft's prediction of out[j] after the true history
    draft_runs = runs([int(np.argmax(rows[j])) == out[j] for j in range(n)])
    lookup = NgramDrafter(engine.config.spec.ngram_min, engine.config.spec.ngram_max)
    ngram = []
    for i in range(n):
        prop = lookup.propose(history + out[:i], ngram_cap).tokens
        right = next((j for j, (p, o) in enumerate(zip(prop, out[i:])) if p != o), min(len(prop), n - i))
        ngram.append((len(prop), right))
    prices = measured_prices(engine, history + out[:n // 2], ngram_cap + 1)  # at the answer's middle
    plain = n * prices.target(1)
    both, counts = best_ms(n, prices, draft_runs=draft_runs, ngram=ngram, draft_cap=draft_cap, ngram_cap=ngram_cap)
    draft_only, _ = best_ms(n, prices, draft_runs=draft_runs, ngram=None, draft_cap=draft_cap)
    ngram_only, _ = best_ms(n, prices, draft_runs=None, ngram=ngram, ngram_cap=ngram_cap)
    both, draft_only = min(both + read_ms, ngram_only), draft_only + read_ms
    return PromptBound(prompt_id, category, len(prompt), len(answer), round(read_ms, 1),
                       round(prices.target(1), 1), round(prices.target(4), 1), round(prices.draft(1), 1),
                       round(plain / both, 3),
                       round(plain / draft_only, 3), round(plain / ngram_only, 3),
                       round(plain / (fixed_sd_ms(n, prices, draft_runs, 3) + read_ms), 3), counts)


def main(argv: list[str] | None = None) -> int:
    """The command line: 0 when done; an ssd-edge error prints one line and exits with its code (as
    the ssd-edge command does), Ctrl-C with 130."""
    from ..errors import SSDEdgeError

    try:
        return _main(argv)
    except SSDEdgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ssd_edge.bench.bound", description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True, help="target: a catalog name or a .gguf path")
    ap.add_argument("-md", "--model-draft", required=True, help="draft: a catalog name or a .gguf path")
    ap.add_argument("--prompts", default=None, help="a JSONL prompt file (default: the shipped suite)")
    ap.add_argument("--category", default=None, help="only these categories, comma-separated")
    ap.add_argument("-n", "--n-predict", type=int, default=128, help="tokens per answer (default 128)")
    ap.add_argument("-t", "--threads", type=int, default=None, help="threads of each model (default: all cores)")
    ap.add_argument("-o", "--output", default=None, help="write the result here as JSON (after each prompt, "
                    "with \"complete\": false until the last)")
    args = ap.parse_args(argv)

    from rich.console import Console

    from .args import load_prompts
    from ..config import EngineConfig, usable_cores
    from ..engine import Engine
    from ..planning.planner import DRAFT_CAP, NGRAM_CAP
    from ..progress import Progress

    threads = args.threads or usable_cores()
    config = EngineConfig.build(target={"path": args.model, "threads": threads},
                                draft={"path": args.model_draft, "threads": threads}, mode="ar")
    prompts = load_prompts(args.prompts)
    if args.category:
        prompts = [p for p in prompts if p.category in args.category.split(",")]
        if not prompts:
            print(f"error: no prompt of category {args.category}", file=sys.stderr)
            return 2
    command = ["python", "-m", "ssd_edge.bench.bound", *(argv if argv is not None else sys.argv[1:])]
    results: list[PromptBound] = []
    out = Path(args.output) if args.output else None
    with Engine(config) as engine, Progress(Console(stderr=True)) as progress:
        engine.load_draft()
        task = progress.task("bound", total=len(prompts))
        try:
            for p in prompts:
                task.begin(f"{p.id}: its answer, then the prices (about a minute)")
                r = measure_prompt(engine, p.id, p.category, p.messages, p.max_tokens or args.n_predict,
                                   DRAFT_CAP, NGRAM_CAP)
                task.done()
                if r is None:
                    print(f"{p.id}: an answer of fewer than 2 tokens, left out", flush=True)
                    continue
                results.append(r)
                print(f"{r.id:20s} {r.category:10s} step {r.step_ms:5.1f} ms, verify of 4 {r.verify4_ms / r.step_ms:.2f} "
                      f"steps, draft step {r.draft_step_ms:4.1f} ms, prompt read {r.prompt_read_ms:4.0f} ms")
                print(f"{'':31s} bound {r.bound_x:5.2f}x  draft alone {r.draft_only_x:5.2f}x  "
                      f"n-gram alone {r.ngram_only_x:5.2f}x  sd k=3 {r.sd3_x:5.2f}x  {r.rounds}", flush=True)
                if out is not None:  # after each prompt: Ctrl-C keeps the prompts done
                    write_result(out, command, threads, results, complete=False)
        except KeyboardInterrupt:
            if out is not None and results:
                print(f"kept {len(results)} of {len(prompts)} prompts in {out} (\"complete\": false)", file=sys.stderr)
            raise
    for c, s in summarize(results).items():
        print(f"{c:10s} bound {s['bound_x']:.2f}x  draft alone {s['draft_only_x']:.2f}x  "
              f"n-gram alone {s['ngram_only_x']:.2f}x  sd k=3 {s['sd3_x']:.2f}x  (geometric means over prompts)")
    if out is not None:
        write_result(out, command, threads, results, complete=True)
    return 0


def summarize(results: Sequence[PromptBound]) -> dict[str, dict[str, float]]:
    """Per category, the geometric means over its prompts of each speedup."""
    cats = sorted({r.category for r in results})
    return {c: {key: round(statistics.geometric_mean([getattr(r, key) for r in results if r.category == c]), 3)
                for key in ("bound_x", "draft_only_x", "ngram_only_x", "sd3_x")} for c in cats}


def write_result(path: Path, command: list[str], threads: int, results: Sequence[PromptBound], *,
                 complete: bool) -> None:
    """The JSON: the command, each prompt's bound and the summary; `complete` false while prompts are
    still to come (written after each one, and left so by an interrupted run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"command": command, "threads": threads, "complete": complete,
                               "prompts": [asdict(r) for r in results], "summary": summarize(results)}, indent=1))
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
