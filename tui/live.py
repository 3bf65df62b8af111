"""What the live panel shows, folded from the event stream.

Everything here comes from the events themselves (Round.wall_ms, LiveStats,
FinishEvent.stats), not from a wall clock, so a replayed stream gives the same
numbers. Used from the UI thread only.
"""

from __future__ import annotations

import statistics
from collections import deque
from ssd_edge.stats_text import rate_text
from ssd_edge.events import LiveStats, Round, Stats

RATE_WINDOW = 6      # rounds averaged into "tokens/s now"
HISTORY = 120        # points kept for the sparkline
LATENCY_WINDOW = 256  # per-token latencies kept per kind while a generation runs


class LiveModel:
    def __init__(self) -> None:
        self.live: LiveStats | None = None
        self.rate_now: float | None = None
        self.rates: deque[float] = deque(maxlen=HISTORY)  # tokens/s now, one point per round, across generations
        self._recent: deque[tuple[int, float]] = deque(maxlen=RATE_WINDOW)  # (tokens, wall_ms)
        self._latency: dict[str, deque[float]] = {k: deque(maxlen=LATENCY_WINDOW) for k in ("hit", "miss", "all")}
        self.final: Stats | None = None  # FinishEvent.stats of the last finished generation
        self.generating = False

    def start(self) -> None:
        """A new generation begins: per-generation figures restart, the sparkline goes on."""
        self.generating = True
        self.final = None
        self._recent.clear()
        for d in self._latency.values():
            d.clear()

    def observe(self, rnd: Round, n_tokens: int, live: LiveStats, wall_ms: float | None = None) -> None:
        """An event's `n_tokens` in `wall_ms` (default: its round's; several rounds' for plain steps made in
        one call, whose last is `rnd`)."""
        wall_ms = rnd.wall_ms if wall_ms is None else wall_ms
        self.live = live
        self._recent.append((n_tokens, wall_ms))
        ms = sum(w for _, w in self._recent)
        self.rate_now = 1e3 * sum(n for n, _ in self._recent) / ms if ms > 0 else None
        if self.rate_now is not None:
            self.rates.append(self.rate_now)
        if n_tokens:
            per_token = wall_ms / n_tokens
            self._latency["all"].append(per_token)
            if rnd.prespec == "hit":
                self._latency["hit"].append(per_token)
            elif rnd.prespec in ("miss", "partial"):  # as in Meter.summary: a partial hit counts as a miss
                self._latency["miss"].append(per_token)

    def finish(self, stats: Stats | None) -> None:
        """The generation ended: with its Stats, or None when it failed."""
        self.generating = False
        self.final = stats
        self.rate_now = None

    # ------------------------------------------------------------ reading
    def latency_ms(self, kind: str) -> float | None:
        """Median per-token latency of hits, misses or all rounds; the engine's own
        p50 once a generation has finished."""
        if self.final is not None:
            pre = self.final.prespec
            return {"all": self.final.latency_ms_p50, "hit": pre.latency_ms_hit_p50, "miss": pre.latency_ms_miss_p50}[kind]
        values = self._latency[kind]
        return statistics.median(values) if values else None

    def average_rate(self) -> float | None:
        """The live end-to-end rate while generating; then the decode speed (None: no decode after the first round)."""
        if self.final is not None:
            return self.final.tokens_per_s if self.final.decoded else None
        return self.live.tokens_per_s if self.live else None


STOP_WORDS = {"cancelled": "stopped", "length": "max tokens", "context": "context full", "error": "error"}


def finish_note(stop_reason: str, stats: Stats, message: str | None) -> str:
    """The line under a finished reply: why it ended (when unusual) and its figures (decode tokens/s
    as the meter defines it: metrics.decode_rate; "—" and the end-to-end rate when nothing came
    after the first round)."""
    parts = [STOP_WORDS[stop_reason]] if stop_reason in STOP_WORDS else []
    if message and stop_reason != "cancelled":
        parts.append(message)
    if stats.tokens:
        parts.append(f"{stats.tokens} tokens · {rate_text(stats)} · {stats.mode}")
    if stats.acceptance_rate is not None:
        parts.append(f"acceptance {100 * stats.acceptance_rate:.0f}%")
    hit = stats.prespec.hit_rate
    if hit is not None:
        parts.append(f"pre-spec hits {100 * hit:.0f}%")
    return " · ".join(parts)
