"""Per-generation measurements: throughput, acceptance, pre-speculation hit
rate, latency split by hit and miss, utilization. One Meter per generation,
owned by the engine thread that runs it. The pre-speculation worker thread
(speculation/prespec/) writes only through two parts made for it, each under its own
lock: BusyClock (the draft's busy seconds) and BranchTally (what the branches
prepared, handed over and hold)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, Mapping

import numpy as np

from .events import AutoStats, LiveStats, PrespecStats, Round, Stats, ThreadSplit, hit_rate_health
from .interface import DECODES


class BusyClock:
    """Seconds a role (draft or target) spent computing; safe to add from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds = 0.0

    def add(self, dt: float) -> None:
        with self._lock:
            self.seconds += dt


class Ema:
    """Exponential moving average; with no initial value the first sample sets it."""

    def __init__(self, value: float | None, alpha: float = 0.2) -> None:
        self.value = value
        self.alpha = alpha

    def add(self, x: float) -> float:
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)
        return self.value


class BranchTally:
    """Pre-speculation's counts: written by the worker thread as it drafts branches and hands them
    over, read by the engine thread for each round's gauges and the final Stats; under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prepared = 0    # draft tokens made ahead of time
        self._used = 0        # of those, handed to the target
        self._cells = 0       # KV cells the branches hold now
        self._cells_peak = 0
        self._misses: Counter[str] = Counter()  # lookups that found no branch, by why (MISS_REASONS)
        self._by_accepted: dict[int, list[int]] = {}  # the round's accepted count -> [lookups, hits]
        self._complete = [0, 0]  # branches complete at a lookup: their sum, the lookups counted
        self._first_decode: list[float] = []  # ms from a verify's start to the worker's first decode beside it

    def add_miss(self, reason: str) -> None:
        with self._lock:
            self._misses[reason] += 1

    def add_lookup(self, accepted: int | None, hit: bool, complete: int) -> None:
        """A lookup of the round that accepted `accepted` drafted tokens (None: off the prepared path),
        whether it found a finished branch, and how many branches were complete then."""
        with self._lock:
            if accepted is not None:
                row = self._by_accepted.setdefault(accepted, [0, 0])
                row[0] += 1
                row[1] += hit
            self._complete[0] += complete
            self._complete[1] += 1

    def lookups(self) -> tuple[dict[int, tuple[int, int]], float | None]:
        """({accepted count: (lookups, hits)}, the mean count of branches complete at a lookup)."""
        with self._lock:
            by = {a: (n, h) for a, (n, h) in sorted(self._by_accepted.items())}
            return by, self._complete[0] / self._complete[1] if self._complete[1] else None

    def add_first_decode(self, ms: float) -> None:
        with self._lock:
            self._first_decode.append(ms)

    def first_decode(self) -> tuple[float | None, float | None]:
        """(p50, p90) ms from a verify's start to the worker's first decode beside it."""
        with self._lock:
            ms = list(self._first_decode)
        return _pct(ms, 50), _pct(ms, 90)

    def misses(self) -> dict[str, int]:
        with self._lock:
            return dict(self._misses)

    def add_prepared(self, n: int) -> None:
        with self._lock:
            self._prepared += n

    def add_used(self, n: int) -> None:
        with self._lock:
            self._used += n

    def set_cells(self, cells: int) -> None:
        with self._lock:
            self._cells = cells
            self._cells_peak = max(self._cells_peak, cells)

    def read(self) -> tuple[int, int, int, int]:
        """(prepared, used, cells, cells_peak), one consistent reading."""
        with self._lock:
            return self._prepared, self._used, self._cells, self._cells_peak


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def decode_rate(tokens: int, first_round_tokens: int, wall_s: float, ttft_s: float | None) -> float:
    """Decode tokens/s, the one definition (the stats line, the TUI, the bench, the server): the
    tokens after the first round over the time after it, since the first round carries the prompt;
    a reply that ended in its first round has only its end-to-end rate."""
    decode_s = wall_s - ttft_s if ttft_s is not None else 0.0
    if tokens > first_round_tokens and decode_s > 0:
        return (tokens - first_round_tokens) / decode_s
    return tokens / wall_s


WORKER_BESIDE = ("alone", "branch", "tree")  # a round's verify with no worker beside it, one branch, several


def worker_beside(branches: int) -> str:
    return WORKER_BESIDE[min(branches, 2)]


class Meter:
    def __init__(self, mode: str, k: int | None, budget_cells: int = 0) -> None:
        """k: the longest draft expected (the per-position tallies grow past it as needed)."""
        self.mode = mode
        self.t0 = time.perf_counter()
        self.t_first: float | None = None  # when the first round's tokens were verified
        self.first_round_tokens = 0
        self.n_prompt = 0
        self.tokens = 0
        self.forced = 0  # kept tokens a grammar forced (provenance "grammar")
        self.rounds: list[Round] = []
        self.steps = 0  # the rounds' target steps (a plain run of one C call stands for several)
        self.accepted_at = np.zeros(max(k or 1, 1) + 1, dtype=np.int64)  # accepted_at[i]: rounds accepting pos i
        self.drafted_at = np.zeros(max(k or 1, 1) + 1, dtype=np.int64)   # drafted_at[i]: rounds drafting pos i
        self.drafted = self.accepted = 0  # their sums, kept as they grow (read every round by live())
        self.draft_busy = BusyClock()  # added by the worker too
        self.target_busy_s = 0.0  # the engine's thread alone decodes on the target
        self.latency_ms: dict[str, list[float]] = {"hit": [], "partial": [], "miss": [], "none": []}
        self.speculators: Counter[str] = Counter()
        self.prespec: Counter[str] = Counter()
        self.branches = BranchTally()  # written by the pre-speculation worker
        self.budget_cells = budget_cells
        self.cell_bytes = 0  # draft KV bytes per cell, when known
        self.state = mode
        self.decodes0 = DECODES.read()  # this thread's time in decodes so far (host time is the rest)
        self._decodes = DECODES.here()  # the same totals, read each round (no call into interface.py)
        self._mark = (self.t0, *self.decodes0)  # (time, decode seconds, rows) when the last round was recorded
        self.host_by_worker: dict[str, list[float]] = {}  # WORKER_BESIDE -> [host seconds, positions]
        self.threads: dict[tuple[int, int | None], list[float]] = {}  # Round.threads -> [rounds, plain steps, their ms]

    # ------------------------------------------------------------ recording
    def first_token(self) -> None:
        if self.t_first is None:
            self.t_first = time.perf_counter()

    def record(self, r: Round, emitted: int) -> None:
        """A round and how many of its tokens the answer kept (Stats.rounds counts its steps)."""
        self.rounds.append(r)
        self.steps += r.steps
        now, seconds, rows = time.perf_counter(), self._decodes.seconds, self._decodes.rows  # the round's host share
        t, s0, n0 = self._mark
        tally = self.host_by_worker.setdefault(worker_beside(r.beside), [0.0, 0])
        tally[0] += (now - t) - (seconds - s0)
        tally[1] += rows - n0
        self._mark = (now, seconds, rows)
        if r.threads is not None:
            split = self.threads.setdefault(r.threads, [0, 0, 0.0])
            split[0] += 1
            if r.index and not r.drafted:  # plain steps after the prompt's
                split[1] += r.steps
                split[2] += r.verify_ms
        self.tokens += emitted
        if "grammar" in r.provenance[:emitted]:
            self.forced += r.provenance[:emitted].count("grammar")
        if len(self.rounds) == 1:
            self.first_round_tokens = emitted
        self.speculators[r.speculator] += r.steps
        if r.prespec:
            self.prespec[r.prespec] += 1
        n = len(self.drafted_at)
        if r.drafted:
            if r.drafted >= n:
                self.drafted_at = np.pad(self.drafted_at, (0, r.drafted - n + 1))
                self.accepted_at = np.pad(self.accepted_at, (0, r.drafted - n + 1))
            self.drafted_at[: r.drafted] += 1
            self.accepted_at[: r.accepted] += 1
            self.drafted += r.drafted
            self.accepted += r.accepted
        if emitted:
            per_token = r.wall_ms / emitted
            self.latency_ms[r.prespec or "none"].extend([per_token] * emitted)

    # ------------------------------------------------------------ reading
    def elapsed(self) -> float:
        return max(time.perf_counter() - self.t0, 1e-9)

    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def hit_rate(self) -> float | None:
        n = sum(self.prespec.values())
        return self.prespec["hit"] / n if n else None

    def live(self) -> LiveStats:
        wall = self.elapsed()
        cells = self.branches.read()[2] if self.budget_cells else 0  # no budget: no branches
        return LiveStats(
            tokens=self.tokens, tokens_per_s=self.tokens / wall, acceptance=self.acceptance(),
            hit_rate=self.hit_rate(), draft_util=min(1.0, self.draft_busy.seconds / wall),
            target_util=min(1.0, self.target_busy_s / wall), branch_cells=cells,
            budget_cells=self.budget_cells, mode=self.mode, state=self.state,
            threads=self.rounds[-1].threads if self.rounds else None)

    def stats(self, seed: int | None = None, auto: Mapping[str, Any] | None = None,
              draft_load_s: float | None = None, memory: Mapping[str, int] | None = None,
              devices: Mapping[str, str] | None = None, native: str | None = None) -> Stats:
        """The generation's Stats, once it has ended. seed: a sampled generation's seed (None when
        greedy); auto: mode auto's report (the planner's figures and "concurrent"); draft_load_s: the
        draft model was loaded before this generation, in that many seconds; native: which path read
        the rows (sampling.native_path)."""
        wall = self.elapsed()
        ttft = (self.t_first - self.t0) if self.t_first else None
        drafted = self.drafted
        spec_rounds = [r for r in self.rounds if r.drafted]
        lookups = sum(self.prespec.values())
        all_lat = [x for v in self.latency_ms.values() for x in v]
        miss_lat = self.latency_ms["miss"] + self.latency_ms["partial"]
        prepared, used, _, cells_peak = self.branches.read()
        by_accepted, complete = self.branches.lookups()
        first_decode = self.branches.first_decode()
        seconds, rows = DECODES.read()
        in_decode_s, positions = seconds - self.decodes0[0], rows - self.decodes0[1]
        prespec = PrespecStats(
            lookups=lookups, hits=self.prespec["hit"], partial_hits=self.prespec["partial"],
            misses=self.prespec["miss"], hit_rate=self.hit_rate(),
            partial_rate=self.prespec["partial"] / lookups if lookups else None,
            health=hit_rate_health(self.hit_rate()),
            latency_ms_hit_p50=_pct(self.latency_ms["hit"], 50), latency_ms_hit_p95=_pct(self.latency_ms["hit"], 95),
            latency_ms_miss_p50=_pct(miss_lat, 50), latency_ms_miss_p95=_pct(miss_lat, 95),
            prepared_tokens=prepared, used_tokens=used, waste=1 - used / prepared if prepared else None,
            branch_cells_peak=cells_peak, budget_cells=self.budget_cells, branch_bytes_peak=cells_peak * self.cell_bytes, budget_bytes=self.budget_cells * self.cell_bytes,
            miss_reasons=self.branches.misses(), hits_by_accepted=by_accepted, complete_at_lookup=complete,
            first_decode_ms_p50=first_decode[0], first_decode_ms_p90=first_decode[1])
        return Stats(
            mode=self.mode, prompt_tokens=self.n_prompt, tokens=self.tokens, rounds=self.steps, wall_s=wall,
            ttft_s=ttft, tokens_per_s=decode_rate(self.tokens, self.first_round_tokens, wall, ttft),
            end_to_end_tokens_per_s=self.tokens / wall,
            drafted=drafted, accepted=self.accepted, acceptance_rate=self.acceptance(),
            mean_accepted_len=float(np.mean([r.accepted for r in spec_rounds])) if spec_rounds else None,
            per_position_acceptance=tuple(float(a / d) for a, d in zip(self.accepted_at.tolist(),
                                                                       self.drafted_at.tolist()) if d),
            draft_busy_s=self.draft_busy.seconds, target_busy_s=self.target_busy_s,
            draft_util=min(1.0, self.draft_busy.seconds / wall), target_util=min(1.0, self.target_busy_s / wall),
            latency_ms_p50=_pct(all_lat, 50), latency_ms_p95=_pct(all_lat, 95), prespec=prespec,
            speculators=dict(self.speculators), seed=seed, auto=AutoStats.of(auto) if auto is not None else None,
            first_round_tokens=self.first_round_tokens, draft_load_s=draft_load_s, memory=memory, devices=devices,
            in_decode_s=in_decode_s, positions=positions,
            host_ms_per_position=(wall - in_decode_s) / positions * 1e3 if positions else None, native=native,
            forced=self.forced, host_by_worker={w: (s, int(n)) for w, (s, n) in self.host_by_worker.items()},
            threads=tuple(ThreadSplit(t, d, int(n), int(steps), ms / steps if steps else None)
                          for (t, d), (n, steps, ms) in self.threads.items()))
