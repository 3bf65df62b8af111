"""The SSD policy: every decision about *whether* and *how much* to pre-speculate.

- outcome probabilities P(a) from per-position acceptance history;
- the window (how many outcomes to prepare) grows while hit rate and
  acceptance are high and shrinks when they are low;
- after `backup_after_misses` consecutive misses, a miss is served by the
  n-gram backup when it is predicted faster than drafting just in time;
- each round verifies the number of draft tokens (0..k) of most expected
  tokens per ms, given what is prepared and the device's verify cost curve
  (plan_round); 0 is a plain target step;
- after `rollback_after_misses` consecutive misses, pre-speculation is switched
  off (plain `sd`) and probed again `probe_every` rounds later;
- with an SLA (ms per token), pre-speculation is cut while latency exceeds it.

Pure state and arithmetic, no models; tested with plain numbers. Used by the
engine thread alone: the pre-speculation worker (prespec.py) never reads the
policy, only the frozen PolicySnapshot the engine takes when it starts a
verify and hands over with it (PrespecWorker.verifying).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
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
    """What pre-speculating one round needs of the policy, as it stood when the round's verify began."""

    enabled: bool           # prespec_enabled
    p_accept: np.ndarray    # outcome_probs(k) for the draft being verified: P(a accepted), a = 0..k
    fanout: int             # the window: most outcomes to prepare


@dataclass
class Costs:
    """Measured step costs (ms), for choosing between just-in-time drafting and the backup."""

    verify_ms: Ema       # a verify of a drafted round
    draft_step_ms: Ema   # one just-in-time draft step
    step_ms: Ema         # a round with nothing drafted: one target step (None until seen)


class PrespecPolicy:
    def __init__(self, cfg: PrespecConfig, k: int, step_ms: float | None = None,
                 verify_curve: list[float] | None = None) -> None:
        """step_ms: what one plain target step is known to cost here (earlier rounds, the profile);
        verify_curve: ms of a target decode of 1, 2, ... tokens on this device (the profile)."""
        self.verify_curve = verify_curve
        self.cfg = cfg
        self.k = k
        self.alpha = [Ema(0.8) for _ in range(max(k, 1))]  # P(accept draft pos i | accepted all before)
        self.ngram_accept = Ema(0.3)                           # accepted / proposed for n-gram drafts
        self.costs = Costs(Ema(100.0), Ema(40.0), Ema(step_ms))
        self._verifies_timed = False
        self.recent_hits: deque[bool] = deque(maxlen=16)
        self.latency_ms = Ema(None, alpha=0.3)
        self.fanout = min(max(cfg.fanout_min, 2), cfg.fanout_max)
        self.miss_streak = 0
        self.state: State = "ssd"
        self._rounds_off = 0

    # ------------------------------------------------------------ observations
    def observe_costs(self, drafted: int, verify_ms: float, draft_step_ms: float | None) -> None:
        """A round's timings: its verify (or plain step), and the just-in-time draft step if any."""
        if drafted:
            self.costs.verify_ms.add(verify_ms)
            self._verifies_timed = True
        else:
            self.costs.step_ms.add(verify_ms)
        if draft_step_ms is not None:
            self.costs.draft_step_ms.add(draft_step_ms)

    def observe_verify(self, drafted: int, accepted: int, speculator: str) -> None:
        if drafted == 0:
            return
        if speculator == "ngram":
            self.ngram_accept.add(accepted / drafted)
            return
        for i in range(min(drafted, len(self.alpha))):
            if i > accepted:
                break
            self.alpha[i].add(1.0 if i < accepted else 0.0)  # position i was reached; was it accepted?

    def observe_lookup(self, outcome: Literal["hit", "partial", "miss"]) -> None:
        hit = outcome != "miss"
        self.recent_hits.append(outcome == "hit")
        self.miss_streak = 0 if hit else self.miss_streak + 1
        if self.miss_streak >= self.cfg.rollback_after_misses and self.state == "ssd":
            self._switch_off("rolled-back")
        rate = self.hit_rate()
        acc = self.acceptance()
        if rate is not None and len(self.recent_hits) >= 4:
            if rate >= GROW_HIT_RATE and acc >= GROW_ACCEPTANCE:
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

    # ------------------------------------------------------------ decisions
    @property
    def prespec_enabled(self) -> bool:
        return self.state == "ssd" and self.cfg.budget_cells > 0

    def snapshot(self, k: int) -> PolicySnapshot:
        """The policy as the worker may see it while it pre-speculates after a draft of k tokens."""
        return PolicySnapshot(self.prespec_enabled, self.outcome_probs(k), self.fanout)

    def hit_rate(self) -> float | None:
        return float(np.mean(self.recent_hits)) if self.recent_hits else None

    def acceptance(self) -> float:
        return float(np.mean([a.value for a in self.alpha]))

    def outcome_probs(self, k: int) -> np.ndarray:
        """P(a accepted), a = 0..k, from per-position acceptance: P(a) = prod_{i<a} alpha_i * (1 - alpha_a)."""
        al = np.array([self.alpha[min(i, len(self.alpha) - 1)].value for i in range(k)])
        reach = np.concatenate([[1.0], np.cumprod(al)])  # reach[a] = P(first a accepted)
        out = reach.copy()
        out[:k] *= 1.0 - al
        return out

    def use_backup(self, ngram_len: int, k: int) -> bool:
        """On a miss: serve the round with the n-gram backup instead of drafting just in time?

        Expected tokens per ms: JIT draft (1 + E[accepted]) / (verify + k * draft_step) against
        the backup (1 + E[accepted_ngram]) / verify; only after a streak of misses."""
        if ngram_len == 0 or self.miss_streak < self.cfg.backup_after_misses:
            return False
        probs = self.outcome_probs(k)
        e_draft = float(np.dot(np.arange(k + 1), probs))
        e_ngram = self.ngram_accept.value * ngram_len
        v, c = self.costs.verify_ms.value, self.costs.draft_step_ms.value
        return (1 + e_ngram) / v > (1 + e_draft) / (v + k * c)

    def verify_cost(self, n: int, k: int) -> float:
        """ms of a target decode of n tokens. From the device's curve when there is one (scaled to
        the verifies timed here), else a line from one step to the timed verify of k + 1 tokens;
        with no step timed yet, flat (as on a GPU, where a small batch costs what one token does)."""
        v = self.costs.verify_ms.value
        curve = self.verify_curve
        if curve:
            at = lambda i: curve[min(i, len(curve)) - 1]  # noqa: E731
            return at(n) * (v / at(k + 1) if self._verifies_timed else 1.0)
        step = self.costs.step_ms.value if self.costs.step_ms.value is not None else v
        return step + (v - step) * (n - 1) / max(k, 1)

    def plan_round(self, ready: int, k: int) -> int:
        """How many draft tokens to verify this round, 0..k, when `ready` are prepared (the rest
        would be drafted just in time): the m of most expected tokens per ms,

            (1 + sum_{i=1..m} P(first i accepted)) / (verify(m + 1) + max(0, m - ready) * draft_step).

        m = 0 is a plain target step (the worker pre-speculates the next round meanwhile). On a
        CPU, where verifying 4 tokens costs 1.5 steps and 2 tokens 1.6, it mostly picks 0 or 3.
        With plan_rounds off: always k."""
        if not self.cfg.plan_rounds or (not self.verify_curve and not self._verifies_timed):
            return k  # no verify timed yet (and no profile): draft, so that one is
        al = np.array([self.alpha[min(i, len(self.alpha) - 1)].value for i in range(k)])
        gain = np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(al))])  # gain[m] = E[tokens | m drafted]
        c = self.costs.draft_step_ms.value
        rate = [gain[m] / (self.verify_cost(m + 1, k) + max(0, m - ready) * c) for m in range(k + 1)]
        return int(np.argmax(rate))
