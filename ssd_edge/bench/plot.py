"""bench.png: each setting's decode speedup over ar per category, and under it the pre-speculation
hit rate beside sd's acceptance (report.summarize's rows)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from .schema import ALL, CATEGORIES, BenchResult, cells, threads_of


def plot_png(result: BenchResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result.summary
    settings = [s.name for s in result.settings]
    cats = [ALL] + [c for c in CATEGORIES if any(r.category == c for r in rows)]
    fig, axes = plt.subplots(2, len(settings), figsize=(6.5 * len(settings), 8), squeeze=False)
    for j, s in enumerate(settings):
        modes = [m for m in dict.fromkeys(r.mode for r in rows if r.setting == s and r.mode != "ar")]
        ax = axes[0][j]
        width = 0.8 / max(len(modes), 1)
        x = np.arange(len(cats))
        top = 1.0
        for i, mode in enumerate(modes):
            vals = [v or 0.0 for v in cells(rows, s, mode, cats, "speedup_vs_ar")]
            ax.bar(x + (i - (len(modes) - 1) / 2) * width, vals, width, label=mode)
            top = max(top, *vals)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_ylim(0, top * 1.3)  # headroom: the legend sits above the bars, not on them
        ax.set_xticks(x, cats, rotation=20)
        ax.set_ylabel("decode speedup vs ar")
        ax.set_title(f"{s} ({threads_of(result, s)} threads)")
        ax.legend(fontsize=8, ncol=3, loc="upper left")
        ax = axes[1][j]
        # a mode whose worker never prepared a round (auto with both models on every core) has no hit rate
        hits = {m: cells(rows, s, m, cats, "hit_rate") for m in ("ssd", "auto") if m in modes}
        hit_modes = [m for m, got in hits.items() if any(v is not None for v in got)]
        width = 0.8 / max(len(hit_modes) + 1, 1)
        for i, mode in enumerate(hit_modes):
            vals = [v or 0.0 for v in hits[mode]]
            ax.bar(x + (i - len(hit_modes) / 2) * width, vals, width, label=f"{mode} hit rate")
        if "sd" in modes:
            acc = [v or 0.0 for v in cells(rows, s, "sd", cats, "acceptance")]
            ax.plot(x, acc, "ko-", label="sd acceptance")
        ax.set_ylim(0, 1.3)
        ax.set_xticks(x, cats, rotation=20)
        ax.set_ylabel("rate")
        ax.set_title(f"{s}: pre-speculation hit rate" + ("" if hit_modes else " (no pre-speculation ran)"))
        if hit_modes or "sd" in modes:
            ax.legend(fontsize=8, loc="upper left")
    target = next((m.name for m in result.models if m.role == "target"), "")
    priced = result.machine.priced  # a priced run's plot says so in its title, on lines of its own
    fig.suptitle(f"ssd-edge bench, {result.options.max_tokens} tokens\n" + "\n".join(textwrap.wrap(priced, 80))
                 if priced else
                 f"ssd-edge bench: {target}, {result.machine.cores} cores, {result.options.max_tokens} tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
