"""The SSD policy: what the SAGUARO design asks of pre-speculation, as inputs to the round planner.

- the window (how many outcomes to prepare) grows while the hit rate and acceptance are high and
  shrinks when they are low;
- after `backup_after_misses` consecutive misses the n-gram backup is offered to the planner
  (backup_ready), which serves a miss with it when it is expected faster than drafting just in time;
- after `rollback_after_misses` consecutive misses pre-speculation is switched off (the planner
  drafts just in time, as plain speculative decoding does) and probed again `probe_every` rounds later;
- with an SLA (ms per token), pre-speculation is cut while latency exceeds it.

Which outcomes are likeliest, how long a round's draft is and whether preparing pays are the
planner's (planning/planner.py): this module holds no costs and no acceptance of its own.

Pure state on the engine thread. The pre-speculation worker (prespec/worker.py) never reads the policy,
only the frozen PolicySnapshot the engine takes when it starts a verify and hands over with it.
"""

from __future__ import annotations

from collections import deque
from typing import Literal, NamedTuple

import numpy as np

from ..config import PrespecConfig
from ..metrics import Ema

State = Literal["ssd", "rolled-back", "sla-cut"]

# The window's own thresholds (the UI's health colours, events.HIT_RATE_*, are a separate choice
# that happens to share these values): over the last 16 lookups,
GROW_HIT_RATE = 0.70     # at least this hit rate (with acceptance >= GROW_ACCEPTANCE): one more outcome
GROW_ACCEPTANCE = 0.6
SHRINK_HIT_RATE = 0.50   # below this: one fewer


class PolicySnapshot(NamedTuple):
    """What pre-speculating one round needs, as it stood when the round's verify began."""

    p_accept: np.ndarray    # P(a of the verified draft's tokens accepted), a = 0..k (the planner's)
    fanout: int             # the window: most outcomes to prepare
    depth: int              # tokens to draft on each branch (the planner's)


class PrespecPolicy:
    def __init__(self, cfg: PrespecConfig) -> None:
        self.cfg = cfg
        self.recent_hits: deque[bool] = deque(maxlen=16)
        self.latency_ms = Ema(None, alpha=0.3)
        self.fanout = min(max(cfg.fanout_min, 2), cfg.fanout_max)
        self.miss_streak = 0
        self.state: State = "ssd"
        self._rounds_off = 0

    # ------------------------------------------------------------ observations
    def observe_lookup(self, outcome: Literal["hit", "partial", "miss"], acceptance: float) -> None:
        """A round's lookup of what the worker prepared, and the draft's mean acceptance now."""
        self.recent_hits.append(outcome == "hit")
        self.miss_streak = 0 if outcome != "miss" else self.miss_streak + 1
        if self.miss_streak >= self.cfg.rollback_after_misses and self.state == "ssd":
            self._switch_off("rolled-back")
        rate = self.hit_rate()
        if rate is not None and len(self.recent_hits) >= 4:
            if rate >= GROW_HIT_RATE and acceptance >= GROW_ACCEPTANCE:
                self.fanout = min(self.fanout + 1, self.cfg.fanout_max)
            elif rate < SHRINK_HIT_RATE:
                self.fanout = max(self.fanout - 1, self.cfg.fanout_min)

    def observe_round(self, ms_per_token: float) -> None:
        """Once per round: latency, and the clock of a rolled-back or cut state."""
        lat = self.latency_ms.add(ms_per_token)
        if self.state != "ssd":
            self._rounds_off += 1
            if self._rounds_off >= self.cfg.probe_every:  # probe: try pre-speculation again
                self.state = "ssd"
                self.miss_streak = 0
                self.recent_hits.clear()
                self.latency_ms = Ema(None, alpha=0.3)  # judge the probe on its own latency
        elif self.cfg.sla_ms_per_token is not None and lat > self.cfg.sla_ms_per_token:
            if self.fanout > self.cfg.fanout_min:
                self.fanout = self.cfg.fanout_min
            else:
                self._switch_off("sla-cut")

    def _switch_off(self, state: State) -> None:
        self.state = state
        self._rounds_off = 0
        self.fanout = self.cfg.fanout_min

    # ------------------------------------------------------------ inputs to the planner
    @property
    def prespec_enabled(self) -> bool:
        return self.state == "ssd" and self.cfg.budget_cells > 0

    @property
    def backup_ready(self) -> bool:
        """Whether a miss may be served by the n-gram backup (after a streak of misses)."""
        return self.miss_streak >= self.cfg.backup_after_misses

    def hit_rate(self) -> float | None:
        return sum(self.recent_hits) / len(self.recent_hits) if self.recent_hits else None

    def snapshot(self, p_accept: np.ndarray, depth: int) -> PolicySnapshot:
        return PolicySnapshot(p_accept, self.fanout, depth)
