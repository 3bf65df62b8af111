"""A generation's Stats (FinishEvent.stats, from metrics.Meter.stats) for a
terminal: one line after each answer, and a table for `/stats`."""

from __future__ import annotations

from collections import Counter
from typing import Mapping

from rich.table import Table
from rich.text import Text

from .events import SPECULATOR_MODE, Stats, ThreadSplit

HEALTH_STYLE = {"healthy": "green", "fair": "yellow", "poor": "red", "n/a": "dim"}


def _num(x: float | None, fmt: str = ".2f") -> str:
    return "–" if x is None else format(x, fmt)


def rate_text(stats: Stats) -> str:
    """The decode speed, or "—" and the end-to-end rate (labelled) when nothing came after the first round."""
    if stats.decoded:
        return f"{stats.tokens_per_s:.1f} tok/s"
    return f"— tok/s · {stats.end_to_end_tokens_per_s:.1f} tok/s end to end"


def ran_text(stats: Stats) -> str:
    """What a generation's rounds ran, as the modes whose rounds they were, the most first: 'ar 94%, sd 6%'."""
    ran: Counter[str] = Counter()
    for speculator, n in stats.speculators.items():
        ran[SPECULATOR_MODE.get(speculator, speculator)] += n
    total = sum(ran.values())
    return ", ".join(f"{mode} {n / total:.0%}" for mode, n in ran.most_common())


def devices_text(devices: Mapping[str, str]) -> str:
    """'on CPU' where every model runs there, else each: 'target on GPU 29/29 layers, draft on CPU'."""
    if set(devices.values()) == {"CPU"}:
        return "on CPU"
    return ", ".join(f"{role} on {where}" for role, where in devices.items())


def split_text(threads: tuple[int, int | None]) -> str:
    """A (target, draft) thread split: '2+2', or '2' with no draft."""
    return f"{threads[0]}" + (f"+{threads[1]}" if threads[1] is not None else "")


def threads_text(splits: tuple[ThreadSplit, ...]) -> str:
    """Each split a generation ran at, with its rounds and its plain steps' speed there:
    '2+2: 40 rounds, 96 steps at 41 ms · 1+1: 2 rounds, 3 steps at 66 ms' (the second a probe)."""
    return " · ".join(f"{split_text((s.target, s.draft))}: {s.rounds} rounds"
                      + (f", {s.steps} steps at {s.ms_per_step:.0f} ms" if s.ms_per_step is not None else "")
                      for s in splits)


def stats_line(stats: Stats, state: str | None = None) -> Text:
    """e.g. '64 tokens · 11.3 tok/s · first token 0.42 s · acceptance 0.78 · hit rate 0.81 healthy · mode ssd'.

    `state` is what ran last (LiveStats.state), shown when it differs from the mode, e.g. 'mode ssd
    (rolled-back)'; mode auto says instead what its rounds ran over the answer: 'mode auto: ar 90%, sd 10%'.
    With nothing decoded after the first round there is no decode speed: '1 token · — tok/s · 2.4 tok/s
    end to end · …'; with no token, no speed at all."""
    out = Text(style="dim")
    out.append(f"{stats.tokens} token{'' if stats.tokens == 1 else 's'}")
    if stats.tokens:
        out.append(f" · {rate_text(stats)}")
    if stats.ttft_s is not None:
        out.append(f" · first token {stats.ttft_s:.2f} s")
    if stats.acceptance_rate is not None:
        out.append(f" · acceptance {stats.acceptance_rate:.2f}")
    pre = stats.prespec
    if pre.lookups:
        out.append(" · hit rate ")
        out.append(f"{_num(pre.hit_rate)} {pre.health}", style=HEALTH_STYLE.get(pre.health, ""))
    if stats.auto is not None and stats.speculators:  # what auto ran, over the whole answer
        out.append(f" · mode {stats.mode}: {ran_text(stats)}")
    else:
        out.append(f" · mode {stats.mode}" + (f" ({state})" if state and state != stats.mode else ""))
    if stats.devices:
        out.append(" · " + devices_text(stats.devices))
    if stats.draft_load_s is not None:  # not in the first token's time: it was loaded before the prompt
        out.append(f" · draft loaded first ({stats.draft_load_s:.1f} s)")
    return out


def stats_table(stats: Stats) -> Table:
    """Every number of one generation, grouped: speed, speculation, pre-speculation."""
    t = Table(show_header=False, box=None, padding=(0, 2))
    t.add_column(style="bold")
    t.add_column(justify="right")
    pre = stats.prespec
    rows = [
        ("mode", stats.mode),
        *([("devices", devices_text(stats.devices))] if stats.devices else []),
        ("prompt tokens", str(stats.prompt_tokens)),
        ("tokens", str(stats.tokens)),
        ("rounds", str(stats.rounds)),
        ("wall", f"{_num(stats.wall_s)} s"),
        ("first token", f"{_num(stats.ttft_s)} s"),
        *([("draft loaded first", f"{stats.draft_load_s:.2f} s")] if stats.draft_load_s is not None else []),
        ("decode speed", f"{_num(stats.tokens_per_s if stats.decoded else None, '.1f')} tok/s"),
        ("end to end", f"{_num(stats.end_to_end_tokens_per_s, '.1f')} tok/s"),
        ("latency p50 / p95", f"{_num(stats.latency_ms_p50, '.0f')} / {_num(stats.latency_ms_p95, '.0f')} ms"),
        ("host per position", f"{_num(stats.host_ms_per_position, '.3f')} ms (outside decodes, "
                              f"{stats.positions} positions)"),
        *([("host per position, by worker", " · ".join(f"{w} {1e3 * s / n:.3f} ms" for w, (s, n)
                                                        in stats.host_by_worker.items() if n))]
          if set(stats.host_by_worker) - {"alone"} else []),  # (beside the verify: nothing, a branch, a tree)
        *([("threads (target+draft)", threads_text(stats.threads))] if stats.threads else []),
        ("drafted / accepted", f"{stats.drafted} / {stats.accepted}"),
        ("acceptance", _num(stats.acceptance_rate)),
        ("mean accepted length", _num(stats.mean_accepted_len)),
        ("per-position acceptance", " ".join(_num(x) for x in stats.per_position_acceptance) or "–"),
        ("target / draft busy", f"{_num(stats.target_util)} / {_num(stats.draft_util)}"),
        ("speculators", ", ".join(f"{k} {v}" for k, v in stats.speculators.items()) or "–"),
    ]
    if stats.seed is not None:  # sampled: this seed replays the answer (--seed), in any mode
        rows.append(("seed", str(stats.seed)))
    if stats.auto is not None:
        rows.append(("auto: rounds by proposer", ", ".join(f"{k} {v}" for k, v in stats.auto.decisions.items()) or "–"))
    if pre.lookups:
        rows += [
            ("prespec hits / partial / misses", f"{pre.hits} / {pre.partial_hits} / {pre.misses}"),
            ("hit rate", f"{_num(pre.hit_rate)} ({pre.health})"),
            ("misses by why", ", ".join(f"{k} {v}" for k, v in sorted(pre.miss_reasons.items(), key=lambda kv: -kv[1]))
             or "–"),
            ("hits by accepted count", " ".join(f"{a}:{h}/{n}" for a, (n, h) in pre.hits_by_accepted.items()) or "–"),
            ("branches complete at a lookup", _num(pre.complete_at_lookup, ".1f")),
            ("worker's first decode after a verify's start p50 / p90",
             f"{_num(pre.first_decode_ms_p50, '.3f')} / {_num(pre.first_decode_ms_p90, '.3f')} ms"),
            ("latency hit p50 / miss p50",
             f"{_num(pre.latency_ms_hit_p50, '.0f')} / {_num(pre.latency_ms_miss_p50, '.0f')} ms"),
            ("prepared / used tokens", f"{pre.prepared_tokens} / {pre.used_tokens}"),
            ("branch cells peak / budget", f"{pre.branch_cells_peak} / {pre.budget_cells}"),
        ]
    for k, v in rows:
        t.add_row(k, v)
    return t
