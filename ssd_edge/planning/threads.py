"""Which thread count runs the target's plain steps fastest here, now: ThreadChoice, kept by the engine
over generations, and LiveThreads, one generation's use of it.

A machine's other work comes and goes (a browser, an indexer, a build). With a core busy, llama.cpp's
every-core default runs a step about 2x slower than one thread fewer (its threads wait at each barrier
for the one that shares a core); on a quiet machine every core is fastest. A profile measured once
cannot know which holds now, so it is only the prior: the engine times the plain steps it runs at the
count it uses, and now and then runs one plain round at another candidate (every core, one fewer, the
split the generation started from), keeping the faster.

The rule, counted in plain target steps (the rounds that draft nothing, after the prompt's):
  - explore: after `gap` steps at the current count, one plain round at the next other candidate
    (the first after GAP_FIRST steps: the prior is a profile's, or a rule of thumb); the gap doubles after each probe that finds nothing faster (GAP_MIN .. GAP_MAX: on a steady
    machine probes are at most PROBE_SHARE of the steps over a generation of 100 or more), and
    falls back to GAP_MIN after a switch, or at once when the current count's last SLOW_ROUNDS rounds
    all ran SLOWER times slower than when it was last compared (the machine changed, not one stray
    step: a probe follows at once);
  - switch: to a candidate whose probe ran under (1 - MARGIN) x the current count's recent ms per step;
    and back at once where its next SLOW_ROUNDS rounds all ran slower than the count it left did in
    its last rounds (a probe that won on a moment's interference with the other count).
Lossless: a thread count changes how fast a step runs, not which token it draws, but for the rare
near-tie that another reduction order in llama.cpp's kernels can flip (tests/lossless_check.py proves
those), as a batched and a one-token decode can.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from ..metrics import Ema

GAP_FIRST = 4      # plain steps at a new choice's first count before its first probe (the prior is unchecked)
GAP_MIN = 32       # plain steps at the current count between probes after a change
GAP_MAX = 1024     # the longest wait between probes on a steady machine
MARGIN = 0.10      # a probe must beat the current count's recent ms per step by this share
SLOWER = 1.5       # the current count's steps this many times slower than when compared: probe now
SLOW_ROUNDS = 3    # ... in this many rounds in a row
PROBE_SHARE = 0.05  # the stated bound on probed steps over a steady generation of >= 100 steps (tests hold it)


def candidates(cores: int, start: int) -> list[int]:
    """The target thread counts worth comparing on `cores` cores: every core, one fewer, and the count
    the generation starts from (a profile's split), most first."""
    return sorted({max(1, cores), max(1, cores - 1), max(1, start)}, reverse=True)


class ThreadChoice:
    """The target's thread count for plain steps, decided by live timings (the module's rule). One per
    engine, kept over generations: what a generation learnt of the machine the next one starts from."""

    def __init__(self) -> None:
        self.options: list[int] = []        # candidate target thread counts (adopt)
        self.current: int | None = None     # the count plain steps run at, but for probes
        self.recent: dict[int, Ema] = {}    # ms per plain step, recent rounds, by count
        self.gap = GAP_FIRST                # plain steps at `current` before the next probe
        self.since = 0                      # plain steps at `current` since the last probe or switch
        self.compared: float | None = None  # current's ms per step when last compared
        self.last: deque[float] = deque(maxlen=SLOW_ROUNDS)  # current's latest rounds, ms per step
        self.left: tuple[int, float] | None = None  # after a switch: the count left, its best recent round
        self.probing: int | None = None     # the candidate the pending plain round runs at
        self.steps = 0                      # plain steps observed, and those that probed
        self.probed = 0
        self._next = 0                      # round-robin over the other candidates

    def adopt(self, start: int, cores: int) -> None:
        """A generation that starts at `start` target threads on `cores` cores: the first sets the
        current count (the profile's or the rule of thumb's prior); later ones add their start as a
        candidate, and the current count stays: a live choice outranks the prior."""
        if self.current is None:
            self.current = start
        for t in candidates(cores, start):
            if t not in self.recent:
                self.recent[t] = Ema(None, 0.3)
        self.options = sorted(self.recent, reverse=True)

    def pick(self) -> int:
        """The thread count for the next plain round: a probe when one is due, else the current."""
        assert self.current is not None, "adopt() a generation's start first"
        others = [t for t in self.options if t != self.current]
        if others and self.since >= self.gap:
            self.probing = others[self._next % len(others)]
            self._next += 1
            return self.probing
        self.probing = None
        return self.current

    def reading(self) -> int:
        """The count a prompt is read at, the target alone: of the counts its plain steps were timed at
        lately, the fastest, once two are; before that every core (a batch keeps every core busy, where a
        step's count may have been set by a split's prior)."""
        timed = {t: e.value for t, e in self.recent.items() if e.value is not None}
        return min(timed, key=lambda t: timed[t]) if len(timed) >= 2 else max(self.options)

    def observe(self, threads: int, ms_per_step: float, steps: int) -> None:
        """A plain round of `steps` steps at `threads`, `ms_per_step` each."""
        if threads not in self.recent or steps < 1:
            return
        self.steps += steps
        if threads == self.probing:
            self.probing = None
            self.probed += steps
            self.recent[threads] = Ema(ms_per_step, 0.3)
            self.since = 0
            best = min(self.last, default=None)  # the current count's best round of late
            self.last.clear()
            now = self.recent[self.current].value
            if now is not None and ms_per_step < now * (1 - MARGIN):
                self.left = (self.current, best if best is not None else now)
                self.current, self.gap, self.compared = threads, GAP_MIN, ms_per_step
            else:
                self.gap, self.compared = max(GAP_MIN, min(2 * self.gap, GAP_MAX)), now
            return
        if threads != self.current:
            return
        self.since += steps
        ms = self.recent[threads].add(ms_per_step)
        self.last.append(ms_per_step)
        if self.left is not None and len(self.last) == SLOW_ROUNDS:
            back, best = self.left
            self.left = None
            if min(self.last) > best:  # every round since the switch slower than the count left: go back
                self.current, self.compared, self.since = back, best, 0
                self.last.clear()
                return
        if self.compared is None:
            self.compared = ms
        elif len(self.last) == SLOW_ROUNDS and min(self.last) > SLOWER * self.compared:  # the machine changed
            self.gap = GAP_MIN
            self.since = max(self.since, self.gap)


class LiveThreads:
    """One generation's threads: plain rounds at the ThreadChoice's pick; the other rounds at the
    current count where the two models take turns with the same cores, or at the generation's own
    split where the draft runs beside the target on cores of its own."""

    def __init__(self, choice: ThreadChoice | None, split: tuple[int, int | None], beside: bool,
                 use: Callable[[int | None, int | None], None]) -> None:
        self.choice, self.split, self.beside, self._use = choice, split, beside, use
        self.now = split  # the (target, draft) threads the contexts run at

    def before(self, plain: bool, turns: bool = False) -> tuple[int, int | None]:
        """Set the contexts' threads for the next round (plain: it drafts nothing; turns: the two models
        take turns in it, though the draft could run beside: the prompt's round, which the target reads
        alone, and whose threads the draft then reads the prompt with as the next round drafts)."""
        if self.choice is None:
            return self.now
        assert self.choice.current is not None  # adopted
        if plain:
            t = self.choice.pick()
            self.now = (t, self.split[1] if self.beside or self.split[1] is None else t)
        elif self.beside and not turns:
            self.now = self.split
        else:
            t = self.choice.reading() if turns else self.choice.current
            self.now = (t, t if self.split[1] is not None else None)
        self._use(*self.now)
        return self.now

    def after(self, threads: tuple[int, int | None], plain_steps: int, decode_ms: float) -> None:
        """A round ran at `threads`; plain_steps: its plain steps after the prompt (0: none to time)."""
        if self.choice is not None and plain_steps:
            self.choice.observe(threads[0], decode_ms / plain_steps, plain_steps)
