"""The SSD policy: what the SAGUARO design asks of pre-speculation, as inputs to the round planner.

- the window (how many outcomes to prepare) starts at the whole tree (a branch per acceptance length),
  shrinks when branches are found unfinished and grows back when the outcome was one it did not hold;
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
from typing import Any, Literal, NamedTuple

import numpy as np

from ..config import PrespecConfig
from ..metrics import Ema

State = Literal["ssd", "rolled-back", "sla-cut"]

NARROW = ("wrong-count", "wrong-token")  # misses of an outcome the window did not hold (outcomes.why_missed)


class PolicySnapshot(NamedTuple):
    """What pre-speculating one round needs, as it stood when the round's verify began."""

    p_accept: np.ndarray    # P(a of the verified draft's tokens accepted), a = 0..k (the planner's)
    fanout: int             # the window: most outcomes to prepare
    depth: int              # tokens to draft on each branch (the planner's)
    width: int = 1          # branches grown together from the first step (the planner's: what the verify hides)
    short: int = 0          # how deep those after the likeliest go (0: depth; the planner's)


class TreeChoice:
    """Whether the worker grows its tree (the planner's width: many branches at once) or the likeliest
    branch alone.

    Where the worker costs the verify nothing to speak of (a quiet device: Costs.contention at most
    IDLE_QUIET, as a GPU target's is), the tree: there its only price is the time it must fit in, which
    the planner's tree_shape already weighs, and its extra branches are hits the likeliest branch cannot
    give (priced H200 tables, the tree always against this timed choice, side by side: ssd 1.03x at draft
    agreement 0.95, greedy and T=1, 1.04x at 0.8, 1.06x on the 7B table, hits 6-12 points more; a block's
    rate swings more than the tree's gain, so timing it there took the likeliest branch alone in 40% of
    the rounds; docs/performance.md).

    Elsewhere (a CPU, where the two models share cores and memory) timed: the tree while it made
    tokens at least MARGIN faster, in blocks of BLOCK rounds (a block's tokens over its wall time: a
    tree's cost, the verify it slows through the shared interpreter and cores, and its gain, the rounds
    its branches serve, both land there), the other tried again every EXPLORE blocks. The likeliest
    branch alone first: a tree has to earn its place. Where the planner finds no room for a tree
    (width 1) the two are the same."""

    BLOCK = 8
    EXPLORE = 5
    MARGIN = 0.03

    def __init__(self) -> None:
        self.rate: dict[bool, float | None] = {True: None, False: None}  # tokens a ms, by tree on/off
        self.on = False
        self.blocks = 0
        self._ms = self._tokens = 0.0
        self._rounds = 0
        self.quiet = False  # the last wanted(): the tree taken without timing, blocks not counted
        self.timings: Any = None  # the planner's timings of the tree (planning.prepared.TreeTimings), kept here

    def wanted(self, quiet: bool) -> bool:
        """Whether the round's worker grows the tree; quiet: the worker costs the verify nothing to speak of."""
        self.quiet = quiet
        return quiet or self.on

    def observe(self, ms: float, tokens: int) -> None:
        if self.quiet:  # (a block must be all of one choice, timed)
            self._ms = self._tokens = 0.0
            self._rounds = 0
            return
        self._ms += ms
        self._tokens += tokens
        self._rounds += 1
        if self._rounds < self.BLOCK:
            return
        r = self._tokens / max(self._ms, 1e-9)
        old = self.rate[self.on]
        self.rate[self.on] = r if old is None else 0.5 * (old + r)
        self._ms = self._tokens = 0.0
        self._rounds = 0
        self.blocks += 1
        on, off = self.rate[True], self.rate[False]
        if on is None or off is None:
            self.on = on is None
        else:
            self.on = (on >= off * (1.0 + self.MARGIN)) != (self.blocks % self.EXPLORE == 0)


class PrespecPolicy:
    def __init__(self, cfg: PrespecConfig, tree: TreeChoice | None = None) -> None:
        """tree: what earlier generations found of the tree (the engine keeps one a mode), else a new one."""
        self.cfg = cfg
        self.recent_hits: deque[bool] = deque(maxlen=16)
        self.latency_ms = Ema(None, alpha=0.3)
        self.fanout = cfg.fanout_max  # the whole tree from the first round; poor hits shrink it
        self.miss_streak = 0
        self.tree = tree if tree is not None else TreeChoice()
        self.state: State = "ssd"
        self._rounds_off = 0

    # ------------------------------------------------------------ observations
    def observe_lookup(self, outcome: Literal["hit", "partial", "miss"], why: str | None = None) -> None:
        """A round's lookup of what the worker prepared; a miss's reason (MISS_REASONS) in `why`. The
        window follows why lookups fail: a branch found unfinished (a partial hit, a ranked outcome not
        begun) says it is wider than the verify lets the worker finish, one less; an outcome it did not
        hold (the accepted count or the next token not ranked) that it is too narrow, one more. Which
        outcomes fill it follows the acceptance (the planner's P(a), PolicySnapshot.p_accept)."""
        self.recent_hits.append(outcome == "hit")
        self.miss_streak = 0 if outcome != "miss" else self.miss_streak + 1
        if self.miss_streak >= self.cfg.rollback_after_misses and self.state == "ssd":
            self._switch_off("rolled-back")
        if outcome == "partial" or why == "not-ready":
            self.fanout = max(self.fanout - 1, self.cfg.fanout_min)
        elif why in NARROW:
            self.fanout = min(self.fanout + 1, self.cfg.fanout_max)

    def observe_round(self, ms_per_token: float, tokens: int = 1) -> None:
        """Once per round: latency (and the tree's blocks), and the clock of a rolled-back or cut state."""
        lat = self.latency_ms.add(ms_per_token)
        if self.state == "ssd":
            self.tree.observe(ms_per_token * tokens, tokens)
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

    def snapshot(self, p_accept: np.ndarray, depth: int, width: int = 1, short: int = 0) -> PolicySnapshot:
        return PolicySnapshot(p_accept, self.fanout, depth, min(width, self.fanout), short or depth)
