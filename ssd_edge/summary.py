"""A generation's stats (FinishEvent.stats, from metrics.Meter.summary) for a
terminal: one line after each answer, and a table for `/stats`."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

HEALTH_STYLE = {"healthy": "green", "fair": "yellow", "poor": "red", "n/a": "dim"}

def _num(x: float | None, fmt: str = ".2f") -> str:
    return "–" if x is None else format(x, fmt)


def stats_line(stats: dict[str, Any], state: str | None = None) -> Text:
    """e.g. '64 tokens · 11.3 tok/s · first token 0.42 s · acceptance 0.78 · hit rate 0.81 healthy · mode ssd'.

    `state` is what ran last (LiveStats.state), shown when it differs from the mode,
    e.g. 'mode ssd (rolled-back)'."""
    out = Text(style="dim")
    out.append(f"{stats.get('tokens', 0)} tokens · {stats.get('tokens_per_s', 0.0):.1f} tok/s")
    if stats.get("ttft_s") is not None:
        out.append(f" · first token {stats['ttft_s']:.2f} s")
    if stats.get("acceptance_rate") is not None:
        out.append(f" · acceptance {stats['acceptance_rate']:.2f}")
    pre = stats.get("prespec") or {}
    if pre.get("lookups"):
        out.append(" · hit rate ")
        health = pre.get("health", "n/a")
        out.append(f"{_num(pre.get('hit_rate'))} {health}", style=HEALTH_STYLE.get(health, ""))
    mode = stats.get("mode", "?")
    out.append(f" · mode {mode}" + (f" ({state})" if state and state != mode else ""))
    return out


def stats_table(stats: dict[str, Any]) -> Table:
    """Every number of one generation, grouped: speed, speculation, pre-speculation."""
    t = Table(show_header=False, box=None, padding=(0, 2))
    t.add_column(style="bold")
    t.add_column(justify="right")
    pre = stats.get("prespec") or {}
    rows = [
        ("mode", str(stats.get("mode"))),
        ("prompt tokens", str(stats.get("prompt_tokens"))),
        ("tokens", str(stats.get("tokens"))),
        ("rounds", str(stats.get("rounds"))),
        ("wall", f"{_num(stats.get('wall_s'))} s"),
        ("first token", f"{_num(stats.get('ttft_s'))} s"),
        ("decode speed", f"{_num(stats.get('tokens_per_s'), '.1f')} tok/s"),
        ("end to end", f"{_num(stats.get('end_to_end_tokens_per_s'), '.1f')} tok/s"),
        ("latency p50 / p95", f"{_num(stats.get('latency_ms_p50'), '.0f')} / {_num(stats.get('latency_ms_p95'), '.0f')} ms"),
        ("drafted / accepted", f"{stats.get('drafted')} / {stats.get('accepted')}"),
        ("acceptance", _num(stats.get("acceptance_rate"))),
        ("mean accepted length", _num(stats.get("mean_accepted_len"))),
        ("per-position acceptance", " ".join(_num(x) for x in stats.get("per_position_acceptance") or []) or "–"),
        ("target / draft busy", f"{_num(stats.get('target_util'))} / {_num(stats.get('draft_util'))}"),
        ("speculators", ", ".join(f"{k} {v}" for k, v in (stats.get("speculators") or {}).items()) or "–"),
    ]
    if stats.get("seed") is not None:  # sampled: this seed replays the answer (--seed), in any mode
        rows.append(("seed", str(stats["seed"])))
    if (plan := stats.get("auto")) is not None:
        rows.append(("auto: rounds by proposer", ", ".join(f"{k} {v}" for k, v in plan["decisions"].items()) or "–"))
    if pre.get("lookups"):
        rows += [
            ("prespec hits / partial / misses", f"{pre.get('hits')} / {pre.get('partial_hits')} / {pre.get('misses')}"),
            ("hit rate", f"{_num(pre.get('hit_rate'))} ({pre.get('health')})"),
            ("latency hit p50 / miss p50",
             f"{_num(pre.get('latency_ms_hit_p50'), '.0f')} / {_num(pre.get('latency_ms_miss_p50'), '.0f')} ms"),
            ("prepared / used tokens", f"{pre.get('prepared_tokens')} / {pre.get('used_tokens')}"),
            ("branch cells peak / budget", f"{pre.get('branch_cells_peak')} / {pre.get('budget_cells')}"),
        ]
    for k, v in rows:
        t.add_row(k, v)
    return t
