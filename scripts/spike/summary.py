"""Throwaway spike code for issue 53, part 1 (see scripts/spike_draft_side.py): the runs' summary, all rounds
and quiet rounds, as JSON and Markdown tables. Not production quality."""

from __future__ import annotations

import statistics

MIN_QUIET = 10      # quiet rounds a run needs for its own figures (the [min-max] of the quiet summary)


def quiet(runs: list[dict], delay_ms: float) -> list[dict]:
    """Each run with its quiet rounds' verify and first-decode times (q_verify_ms, q_first_ms): the rounds in
    which neither side waited for a core longer than delay_ms."""
    out = []
    for r in runs:
        pr = r["per_round"]
        keep = [d < delay_ms for d in pr["delay_ms"]]
        qv = [v for v, k in zip(pr["verify_ms"], keep) if k]
        qf = [f for f, k in zip(pr["first_ms"], keep) if k and f == f]
        out.append({**r, "quiet_rounds": len(qv), "q_verify_ms": qv, "q_first_ms": qf})
    return out


def summarise(runs: list[dict], variants: list[str]) -> dict:
    """Per variant: each per-run figure's median over its runs, [min, max]. verify_slowdown: a run's mean verify
    over the median of the `alone` runs' means (the issue's verify_slowdown). The quiet rounds (q_*) are pooled
    over all runs of a variant: the slowdown is the pooled mean verify over the alone runs' pooled mean (p50: of
    the medians), the first decode's p50 and p90 of the pooled values; their [min, max] are the same figures per
    run, over runs with at least MIN_QUIET quiet rounds."""
    alone = [r for r in runs if r["variant"] == "alone"]
    q = lambda xs, f: sorted(xs)[int(f * (len(xs) - 1))] if xs else None  # noqa: E731
    if alone:
        base_mean = statistics.median(r["verify_ms_mean"] for r in alone)
        runs = [{**r, "verify_slowdown": r["verify_ms_mean"] / base_mean} for r in runs]
        qa = [v for r in alone for v in r.get("q_verify_ms", [])]
        qbase, qbase50 = (statistics.fmean(qa), q(qa, 0.5)) if qa else (None, None)
    out = {}
    for v in variants:
        rs = [r for r in runs if r["variant"] == v]
        s = {"runs": [len(rs)] * 3}
        if not rs:
            out[v] = s
            continue
        for key in dict.fromkeys(k for r in rs for k in r):
            if key in ("variant", "rep", "per_round") or key.startswith("q_"):
                continue
            xs = [r[key] for r in rs if r.get(key) is not None]
            if xs:
                s[key] = [round(statistics.median(xs), 3), round(min(xs), 3), round(max(xs), 3)]
        pooled_v = [x for r in rs for x in r.get("q_verify_ms", [])]
        pooled_f = [x for r in rs for x in r.get("q_first_ms", [])]
        s["quiet_rounds"] = [len(pooled_v), min(r.get("quiet_rounds", 0) for r in rs),
                             max(r.get("quiet_rounds", 0) for r in rs)]
        per_run = [r for r in rs if len(r.get("q_verify_ms", [])) >= MIN_QUIET]

        def fig(f, pooled, key):
            if not pooled:
                return
            each = [f(r[key]) for r in per_run if r.get(key)]
            s["q_" + name] = [round(f(pooled), 3)] + ([round(min(each), 3), round(max(each), 3)] if each else
                                                      [float("nan")] * 2)
        if alone and qbase:
            name = "verify_slowdown"
            fig(lambda xs: statistics.fmean(xs) / qbase, pooled_v, "q_verify_ms")
            name = "verify_slowdown_p50"
            fig(lambda xs: q(xs, 0.5) / qbase50, pooled_v, "q_verify_ms")
        name = "first_decode_ms_p50"
        fig(lambda xs: q(xs, 0.5), pooled_f, "q_first_ms")
        name = "first_decode_ms_p90"
        fig(lambda xs: q(xs, 0.9), pooled_f, "q_first_ms")
        out[v] = s
    return out


ALL_COLS = [("runs", "runs"), ("verify_slowdown", "verify / alone"), ("verify_over_priced", "verify / priced"),
            ("first_decode_ms_p50", "first decode p50 ms"), ("first_decode_ms_p90", "first decode p90 ms"),
            ("complete_at_lookup", "complete at lookup"), ("round_ms_mean", "round ms"),
            ("cpu_per_wall", "CPU / wall"), ("engine_spin_lost", "engine core lost")]
QUIET_COLS = [("quiet_rounds", "quiet rounds"), ("q_verify_slowdown", "verify / alone"),
              ("q_verify_slowdown_p50", "p50 verify / alone"), ("q_first_decode_ms_p50", "first decode p50 ms"),
              ("q_first_decode_ms_p90", "first decode p90 ms")]


def table(summary: dict, cols: list[tuple[str, str]]) -> str:
    """The summary as a Markdown table: each cell the median over runs [min-max]."""
    lines = ["| variant | " + " | ".join(c[1] for c in cols) + " |", "|---|" + "--:|" * len(cols)]
    for v, s in summary.items():
        cells = []
        for key, _ in cols:
            m = s.get(key)
            cells.append("-" if m is None else str(m[0]) if key == "runs" else
                         f"{m[0]:.0f} [{m[1]:.0f}-{m[2]:.0f}]" if key == "quiet_rounds" else
                         f"{m[0]:.3f} [{m[1]:.3f}-{m[2]:.3f}]")
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(runs: list[dict], variants: list[str], delay_ms: float) -> tuple[dict, str]:
    summary = summarise(quiet(runs, delay_ms), variants)
    text = ("all rounds (median over runs [min-max]):\n" + table(summary, ALL_COLS) +
            f"\n\nquiet rounds (in the verify, each side runnable but not running < {delay_ms:.2f} ms), pooled "
            f"[min-max over runs with >= {MIN_QUIET}]; quiet rounds: pooled [min-max per run]:\n"
            + table(summary, QUIET_COLS))
    return summary, text
