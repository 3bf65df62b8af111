"""What `ssd-edge bench` makes of its runs: summary rows per (setting, mode,
category), the goals checked against them, a markdown report in the style of
llama-bench, and the files it writes (bench.png: plot.py).

Aggregates are ratios of sums, not means of ratios: decode tokens/s is a
group's decode tokens over its decode time, each run's counted as the meter
counts them (metrics.decode_rate: the tokens after the first round over the time
after it), and every speedup divides two such numbers measured in the same run.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Iterable

import numpy as np

from ..metrics import WORKER_BESIDE
from .schema import ALL, CATEGORIES, BenchResult, Goal, PeerRecord, RunRecord, SummaryRow, row_of, threads_of

FIXED = ("sd", "lookup", "ssd")
STRUCTURED = "structured"  # every structured prompt (response_format or tools), whatever its category


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _rows_for(setting: str, mode: str, category: str, runs: list[RunRecord], k: int | None) -> SummaryRow:
    tokens = sum(r.tokens for r in runs)
    decode_tokens = sum(r.tokens_per_s * r.decode_s for r in runs)  # the meter's: rate x its time
    decode_s = sum(r.decode_s for r in runs)
    lat = [x for r in runs for x in r.latencies_ms]
    ttfts = [r.ttft_s for r in runs if r.ttft_s is not None]
    wall = sum(r.wall_s for r in runs)
    lookups = sum(r.lookups for r in runs)
    drafted = sum(r.drafted for r in runs)
    positions = sum(r.positions for r in runs)
    return SummaryRow(
        setting=setting, mode=mode, category=category, k=k, runs=len(runs), tokens=tokens,
        tokens_per_s=decode_tokens / decode_s if decode_s else 0.0,
        tokens_per_s_std=statistics.pstdev([r.tokens_per_s for r in runs]) if len(runs) > 1 else 0.0,
        speedup_vs_ar=None,
        answer_tokens_per_s=tokens / wall if wall else None,
        ttft_ms=1e3 * statistics.fmean(ttfts) if ttfts else None,
        latency_p50_ms=float(np.percentile(lat, 50)) if lat else None,
        latency_p95_ms=float(np.percentile(lat, 95)) if lat else None,
        acceptance=_ratio(sum(r.accepted for r in runs), drafted) if drafted else None,
        mean_accepted_len=_ratio(sum(r.accepted for r in runs), sum(r.spec_rounds for r in runs))
        if drafted else None,
        hit_rate=_ratio(sum(r.hits for r in runs), lookups) if lookups else None,
        draft_util=_ratio(sum(r.draft_busy_s for r in runs), wall),
        target_util=_ratio(sum(r.target_busy_s for r in runs), wall),
        host_ms_per_position=_ratio(1e3 * (wall - sum(r.in_decode_s for r in runs)), positions) if positions else None,
        host_ms_per_position_by_worker=_host_by_worker(runs), **_first_decode(runs),
        peak_rss_mib=max(r.peak_rss_mib for r in runs), answer_s=wall / len(runs), **_structured(runs))


def _host_by_worker(runs: list[RunRecord]) -> dict[str, float]:
    """Host ms per position by what the worker did beside a round's verify, over the runs (WORKER_BESIDE's
    order; only what ran)."""
    out = {}
    for w in WORKER_BESIDE:
        parts = [r.host_by_worker[w] for r in runs if w in r.host_by_worker]
        positions = sum(n for _, n in parts)
        if positions:
            out[w] = 1e3 * sum(s for s, _ in parts) / positions
    return out


def _first_decode(runs: list[RunRecord]) -> dict[str, float]:
    """The runs' median first_decode_ms_p50 and _p90 (where the SSD worker ran)."""
    out = {}
    for q in ("p50", "p90"):
        got = [v for r in runs if (v := getattr(r, f"first_decode_ms_{q}")) is not None]
        if got:
            out[f"first_decode_ms_{q}"] = statistics.median(got)
    return out


def _verify_slowdowns(rows: list[SummaryRow], groups: dict[tuple[str, str, str], list[RunRecord]]) -> None:
    """Each row's verify_slowdown: its verifies' time with the SSD worker beside them over what the same
    sizes took alone in its setting (every mode's verifies alone pooled: sd's, ar's steps, rests)."""
    alone: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for (setting, _, category), runs in groups.items():
        if category == ALL:
            for r in runs:
                for size, (n, ms, _, _) in r.verify_ms.items():
                    alone[(setting, size)][0] += n
                    alone[(setting, size)][1] += ms
    for row in rows:
        beside = expected = 0.0
        for r in groups.get((row.setting, row.mode, row.category), ()):
            for size, (_, _, n, ms) in r.verify_ms.items():
                base = alone.get((row.setting, size))
                if n and base and base[0]:
                    beside += ms
                    expected += n * base[1] / base[0]
        row.verify_slowdown = beside / expected if expected else None


def _host_table(rows: list[SummaryRow]) -> list[str]:
    """Host ms per position by what the pre-speculation worker did beside each verify, for the modes
    where it ran: a tree's cost to the engine thread (the interpreter lock the two share) shows as its
    column above alone's."""
    shown = [r for r in rows if r.category == ALL and set(r.host_ms_per_position_by_worker) - {"alone"}]
    if not shown:
        return []
    out = ["", "Host ms/pos by what the SSD worker did beside the verify (alone: nothing; branch: the likeliest "
           "outcome's; tree: several at once); the verifies' time beside the worker over alone (same sizes); ms "
           "from a verify's start to the worker's first decode:", "",
           "| setting | mode | " + " | ".join(WORKER_BESIDE) + " | verify beside / alone | first decode p50 / p90 ms |",
           "|---|---|" + "--:|" * (len(WORKER_BESIDE) + 2)]
    for r in shown:
        by = r.host_ms_per_position_by_worker
        out.append(f"| {r.setting} | {r.mode} | " + " | ".join(_f(by.get(w), '.3f') for w in WORKER_BESIDE) +
                   f" | {_f(r.verify_slowdown, '.3f')} | {_f(r.first_decode_ms_p50, '.3f')} / "
                   f"{_f(r.first_decode_ms_p90, '.3f')} |")
    return out


def _structured(runs: list[RunRecord] | list[PeerRecord]) -> dict[str, float | None]:
    """valid_share and forced_share over the structured runs of a group (None where it has none; a peer
    counts no forced tokens)."""
    shaped = [r for r in runs if r.valid is not None]
    if not shaped:
        return {}
    forced = _ratio(sum(r.forced for r in shaped), sum(r.tokens for r in shaped)) \
        if all(isinstance(r, RunRecord) for r in shaped) else None
    return dict(valid_share=sum(r.valid for r in shaped) / len(shaped), forced_share=forced)


def _peer_row(setting: str, kind: str, k: int, category: str, runs: list[PeerRecord]) -> SummaryRow:
    tokens = sum(r.tokens for r in runs)
    decode_s = sum(r.decode_s for r in runs)
    drafted = sum(r.drafted for r in runs)
    whole = sum(r.encode_s + r.decode_s for r in runs) if all(r.encode_s is not None for r in runs) else None
    return SummaryRow(
        setting=setting, mode=peer_mode(k, kind), category=category, k=k, runs=len(runs), tokens=tokens,
        tokens_per_s=tokens / decode_s if decode_s else 0.0,
        tokens_per_s_std=statistics.pstdev([r.tokens_per_s for r in runs]) if len(runs) > 1 else 0.0,
        speedup_vs_ar=None, answer_tokens_per_s=tokens / whole if whole else None,
        ttft_ms=None, latency_p50_ms=None, latency_p95_ms=None,
        acceptance=_ratio(sum(r.accepted for r in runs), drafted) if drafted else None, mean_accepted_len=None,
        hit_rate=None, draft_util=None, target_util=None, peak_rss_mib=None,
        answer_s=statistics.fmean(r.answer_s for r in runs) if all(r.answer_s is not None for r in runs) else None,
        **_structured(runs))


def peer_mode(k: int, kind: str = "draft") -> str:
    """A peer's row name: `llama.cpp k=3` (speculative-simple, the draft model), `llama.cpp lookup k=3`,
    `llama.cpp-grammar` and `llama.cpp-json_schema` (llama-server under a constraint, no draft)."""
    if kind in ("grammar", "json_schema"):
        return f"llama.cpp-{kind}"
    return f"llama.cpp k={k}" if kind == "draft" else f"llama.cpp {kind} k={k}"


def summarize(runs: Iterable[RunRecord], peer: Iterable[PeerRecord] = (), k: int | None = None) -> list[SummaryRow]:
    """Summary rows per (setting, mode, category), per (setting, mode) over all categories ('all'), and
    over the structured prompts ('structured', where there are any)."""
    groups: dict[tuple[str, str, str], list[RunRecord]] = defaultdict(list)
    for r in runs:
        if r.rep < 0:
            continue
        groups[(r.setting, r.mode, r.category)].append(r)
        groups[(r.setting, r.mode, ALL)].append(r)
        if r.valid is not None:
            groups[(r.setting, r.mode, STRUCTURED)].append(r)
    rows = [_rows_for(s, m, c, rs, 0 if m == "ar" else (None if m == "auto" else k)) for (s, m, c), rs in groups.items()]
    _verify_slowdowns(rows, groups)
    pgroups: dict[tuple[str, str, int, str], list[PeerRecord]] = defaultdict(list)
    for r in peer:
        pgroups[(r.setting, r.kind, r.k, r.category)].append(r)
        pgroups[(r.setting, r.kind, r.k, ALL)].append(r)
        if r.valid is not None:
            pgroups[(r.setting, r.kind, r.k, STRUCTURED)].append(r)
    rows += [_peer_row(s, kind, kk, c, rs) for (s, kind, kk, c), rs in pgroups.items()]
    base = {(r.setting, r.category): r.tokens_per_s for r in rows if r.mode == "ar"}
    for r in rows:
        ar = base.get((r.setting, r.category))
        r.speedup_vs_ar = r.tokens_per_s / ar if ar else None
    order = {c: i for i, c in enumerate((ALL, STRUCTURED, *CATEGORIES))}
    rows.sort(key=lambda r: (r.setting != "separate", order.get(r.category, 99), _mode_order(r.mode)))
    return rows


def _mode_order(mode: str) -> tuple[int, str]:
    fixed = ("ar", "sd", "lookup", "ssd", "auto")
    return (fixed.index(mode), "") if mode in fixed else (len(fixed), mode)


# ---------------------------------------------------------------- goals

# What auto must reach against ar where verifying is cheap (the memory-bound stand-in), per category
STAND_IN_SPEEDUP = {"code": 1.6, "code-edit": 2.5, "prose": 1.15}


def goals(rows: list[SummaryRow], modes: Iterable[str], stand_ins: Iterable[str] = ()) -> list[Goal]:
    """The release bounds of the default mode (auto). Everywhere: never slower than plain decoding
    (0.97x, the noise of two passes), close to the best fixed mode (0.95x), its first token within
    1.1x of ar's. In `stand_ins`, the settings where the memory-bound stand-in runs with every core
    (issue 20's bounds are set at 2+2 threads): the speedups of STAND_IN_SPEEDUP, 0.97x the best
    fixed mode, 1.25x llama.cpp's own speculative decoding."""
    modes = list(modes)
    stand_ins = set(stand_ins)
    out: list[Goal] = []
    settings = sorted({r.setting for r in rows})

    def best(setting: str, category: str, pool: Iterable[str]) -> SummaryRow | None:
        cand = [r for r in rows if r.setting == setting and r.category == category and r.mode in pool]
        return max(cand, key=lambda r: r.tokens_per_s, default=None)

    def ratio_goal(name: str, threshold: float, num: SummaryRow | None, den: SummaryRow | None,
                   answer: bool = False) -> None:
        rate = (lambda r: r.answer_tokens_per_s or 0.0) if answer else (lambda r: r.tokens_per_s)  # noqa: E731
        v = rate(num) / rate(den) if num and den and rate(den) else None
        out.append(Goal(name=name, threshold=f">= {threshold:.2f}x", value=v, met=None if v is None else v >= threshold,
                        detail=f"{num.mode} {rate(num):.2f} vs {den.mode} {rate(den):.2f} tok/s"
                        if num and den and rate(den) else "no data"))

    if "auto" in modes:
        for s in settings:
            memory = s in stand_ins
            for c in (ALL, *CATEGORIES):
                auto, ar = row_of(rows, s, "auto", c), row_of(rows, s, "ar", c)
                if auto is None or ar is None:
                    continue
                ratio_goal(f"{s}, {c}: auto vs ar", STAND_IN_SPEEDUP.get(c, 1.0) if memory else 0.97, auto, ar)
                ratio_goal(f"{s}, {c}: auto vs the best fixed mode", 0.97 if memory else 0.95, auto,
                           best(s, c, ["ar", *FIXED]))
                if auto.ttft_ms is not None and ar.ttft_ms:
                    v = auto.ttft_ms / ar.ttft_ms
                    out.append(Goal(name=f"{s}, {c}: auto's first token vs ar's", threshold="<= 1.10x", value=v,
                                    met=v <= 1.10, detail=f"{auto.ttft_ms:.0f} vs {ar.ttft_ms:.0f} ms"))
            peer = best(s, ALL, [r.mode for r in rows if r.mode.startswith("llama.cpp k=")])  # speculative-simple
            if memory and peer is not None:
                auto = row_of(rows, s, "auto", ALL)
                ratio_goal(f"{s}, {ALL}: auto vs llama.cpp's speculative decoding", 1.25, auto, peer)
                # the same, prompt to last token: llama.cpp (and sd) read the prompt into the draft before
                # the first token, auto in its decode
                ratio_goal(f"{s}, {ALL}: auto vs llama.cpp's speculative decoding, prompt to answer", 1.25, auto,
                           peer, answer=True)
    return [g for g in out if g.detail != "no data"]


# ---------------------------------------------------------------- markdown

def _f(x: float | None, fmt: str = ".2f", none: str = "–") -> str:
    return none if x is None else format(x, fmt)


def auto_choices(result: BenchResult) -> dict[tuple[str, str], str]:
    """What auto ran per (setting, category): share of rounds per mode."""
    out = {}
    groups: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in result.runs:
        if r.mode == "auto" and r.rep >= 0:
            for m, n in r.modes_run.items():
                groups[(r.setting, r.category)][m] += n
                groups[(r.setting, ALL)][m] += n
    for key, counts in groups.items():
        total = sum(counts.values())
        out[key] = " ".join(f"{m} {n / total:.0%}" for m, n in sorted(counts.items(), key=lambda x: -x[1]))
    return out


def agreement(result: BenchResult) -> tuple[int, int]:
    """(runs whose output tokens equal ar's on the same setting and prompt, runs compared); greedy only."""
    ar = {(r.setting, r.prompt_id, r.rep): r.output_sha for r in result.runs if r.mode == "ar"}
    same = total = 0
    for r in result.runs:
        if r.mode != "ar" and (r.setting, r.prompt_id, r.rep) in ar and r.rep >= 0:
            total += 1
            same += r.output_sha == ar[(r.setting, r.prompt_id, r.rep)]
    return same, total


def markdown(result: BenchResult, brief: bool = False) -> str:
    rows = result.summary
    m = result.machine
    lines: list[str] = []
    # a priced run (--priced) says so first, brief or not: never to be read as a GPU's numbers
    priced = [f"**{m.priced}**: synthetic models whose decodes wait a GPU's measured prices on this CPU "
              f"({m.cpu}), not a GPU measurement", ""] if m.priced else []
    if brief:
        lines += priced
    else:
        models = ", ".join(f"{x.role} {x.name} ({x.size / 2**20:.0f} MiB)" for x in result.models)
        lines += [
            f"# ssd-edge bench — {result.created}",
            "",
            *priced,
            f"- command: `{' '.join(result.command)}`",
            f"- machine: {m.cpu}, {m.cores} cores, {m.ram_gib} GiB RAM{', ' + m.gpus if m.gpus else ''}, {m.os}; "
            f"load average at start "
            f"{m.load_avg_start[0]:.2f}, at end {_f(m.load_avg_end[0] if m.load_avg_end else None)}",
            f"- models: {models}",
            f"- libraries: " + ", ".join(f"{k} {v}" for k, v in result.libraries.items()),
            f"- {len(result.prompts)} prompts ({', '.join(result.options.categories)}), {result.options.max_tokens} "
            f"tokens each, {result.options.reps} pass(es), seed {result.options.seed}, temperature "
            f"{result.options.temperature}, k = {result.options.k}; run took {result.duration_s / 60:.1f} min"
            + (" — INTERRUPTED, partial" if result.interrupted else ""),
            f"- llama.cpp peer: {result.peer.version or ''} {result.peer.note}".rstrip(),
            "",
        ]
        for s in result.settings:
            lines.append(f"- setting `{s.name}`: {s.description}")
        lines.append("")
    regimes = [s for s in result.settings if s.regime]
    if regimes:
        lines += ["The regime of each setting's target (from its calibrated verify curve; a priced run's: its "
                  "table):", ""]
        for s in regimes:
            head = (s.verify_ms or [])[:9]
            curve = ", ".join(f"{x:.2f}" if max(head) < 10 else f"{x:.0f}" for x in head)  # GPU prices: ms to 0.01
            lines.append(f"- `{s.name}`: {s.regime}" + (f" (ms of a decode of 1..9 tokens: {curve})" if curve else ""))
        lines.append("")
    lines += ["t/s: decode tokens/s (after the first token); answer t/s: prompt to last token (TTFT and decode; "
              "llama.cpp: its encode and decode).", "",
              "host ms/pos: wall time outside llama_decode per decoded position (verified and drafted).", "",
              "| setting | mode | k | threads | t/s | speedup | answer t/s | TTFT ms | p50 ms | p95 ms | accept | "
              "mean acc | hit rate | draft util | target util | host ms/pos | peak MiB |",
              "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        if r.category != ALL:
            continue
        lines.append(
            f"| {r.setting} | {r.mode} | {_f(r.k, 'd', 'auto')} | {threads_of(result, r.setting)} | "
            f"{r.tokens_per_s:.2f} ± {r.tokens_per_s_std:.2f} | {_f(r.speedup_vs_ar)}x | "
            f"{_f(r.answer_tokens_per_s)} | {_f(r.ttft_ms, '.0f')} | "
            f"{_f(r.latency_p50_ms, '.0f')} | {_f(r.latency_p95_ms, '.0f')} | {_f(r.acceptance)} | "
            f"{_f(r.mean_accepted_len)} | {_f(r.hit_rate)} | {_f(r.draft_util)} | {_f(r.target_util)} | "
            f"{_f(r.host_ms_per_position, '.3f')} | {_f(r.peak_rss_mib, '.0f')} |")
    lines += _host_table(rows)
    cats = [c for c in CATEGORIES if any(r.category == c for r in rows)]
    lines += ["", "Decode tokens/s per category (speedup vs ar in the same setting):", "",
              "| setting | mode | " + " | ".join(cats) + " |", "|---|---|" + "--:|" * len(cats)]
    seen = []
    for r in rows:
        if r.category == ALL and (r.setting, r.mode) not in seen:
            seen.append((r.setting, r.mode))
    for s, mode in seen:
        cells = []
        for c in cats:
            x = row_of(rows, s, mode, c)
            cells.append("–" if x is None else f"{x.tokens_per_s:.2f} ({_f(x.speedup_vs_ar)}x)")
        lines.append(f"| {s} | {mode} | " + " | ".join(cells) + " |")
    from .report_structured import markdown as structured_tables

    lines += structured_tables(result)
    choices = auto_choices(result)
    if choices:
        lines += ["", "What auto ran (share of rounds):", "", "| setting | " + " | ".join([ALL, *cats]) + " |",
                  "|---|" + "---|" * (len(cats) + 1)]
        for s in [x.name for x in result.settings]:
            lines.append(f"| {s} | " + " | ".join(choices.get((s, c), "–") for c in [ALL, *cats]) + " |")
    if result.goals:
        lines += ["", "| goal | threshold | value | met | detail |", "|---|---|--:|---|---|"]
        for g in result.goals:
            met = "–" if g.met is None else ("yes" if g.met else "**no**")
            lines.append(f"| {g.name} | {g.threshold} | {_f(g.value)} | {met} | {g.detail} |")
    if not brief:
        same, total = agreement(result)
        if result.options.temperature == 0 and total:
            lines += ["", f"Greedy outputs identical to ar's: {same} of {total} runs (batched and one-token "
                          "kernels can differ on near-ties; tests/lossless_check.py tells such a tie from a bug)."]
        if result.peer.errors:
            lines += ["", "llama.cpp peer errors:", ""] + [f"- {e}" for e in result.peer.errors[:10]]
        if result.notes:
            lines += ["", "Notes:", ""] + [f"- {n}" for n in result.notes]
    return "\n".join(lines) + "\n"


def write(result: BenchResult, out: Path, plot: bool = True) -> list[Path]:
    """bench.json (validated on the way out), bench.md and bench.png in `out`."""
    data = json.loads(result.model_dump_json())
    BenchResult.model_validate(data)  # the file we write is one the schema accepts
    paths = [out / "bench.json", out / "bench.md"]
    paths[0].write_text(json.dumps(data, indent=1))
    paths[1].write_text(markdown(result))
    if plot and result.summary:
        from .plot import plot_png  # (matplotlib: loaded only to draw)

        paths.append(plot_png(result, out / "bench.png"))
    return paths
