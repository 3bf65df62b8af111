"""The calibration's timed decodes (bench/calibrate.py measures a profile with them): each model's
decode costs over 1 .. k_max + 1 tokens at each thread count, their repetitions interleaved over the
counts and each cell its fastest reading; the orderings checked (a one-token step slower on more
threads is interference, measured again); the target's slowdown beside the busy draft.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from ..engine import Engine
    from ..llama.timing import DecodeTimer

log = logging.getLogger(__name__)

PREFIX_TOKENS = 64  # cost is measured after this much context, like a short prompt
Progress = Callable[[str, float], None]  # (what is being measured, fraction done 0..1)

# Filler ids (any in-vocabulary tokens do: the cost of a decode does not depend on which).
PREFIX = [(31 * i + 7) % 1000 + 100 for i in range(PREFIX_TOKENS)]


def filler(n: int) -> list[int]:
    """n filler token ids for a timed decode (any in-vocabulary tokens do)."""
    return [(17 * i + 11) % 1000 + 100 for i in range(n)]


RECHECKS = 2  # one-token steps slower on more threads: measured again this many times before it is believed


def step_costs(engine: Engine, timer: DecodeTimer, name: str, opts: list[int], k_max: int, reps: int,
               tick: Progress) -> dict[int, list[float]]:
    """`name`'s decode of 1 .. k_max + 1 tokens at each thread count in `opts`: the repetitions
    interleaved over the thread counts (other work that comes and goes touches each count alike),
    each cell the fastest of its repetitions (interference only ever slows a decode)."""
    times: dict[int, list[list[float]]] = {t: [[] for _ in range(k_max + 1)] for t in opts}
    for rep in range(reps):
        for i, t in enumerate(opts):
            tick(f"{name} step costs, {t} thread{'s' if t > 1 else ''}", (rep * len(opts) + i) / (reps * len(opts)))
            engine.use_threads(**{name: t})
            timer.decode_ms(name, PREFIX, filler(1))  # warm-up: first decodes at a new thread count are slower
            for n, cell in enumerate(times[t], 1):
                cell.append(timer.decode_ms(name, PREFIX, filler(n)))
    return {t: [min(cell) for cell in times[t]] for t in opts}


def inverted_at(table: dict[int, list[float]], slack: float = 1.05) -> list[int]:
    """Thread counts whose one-token step ran slower than at some fewer threads (by more than
    `slack`): on idle cores more threads are never slower, so it is a sign of interference."""
    counts = sorted(table)
    return [hi for i, hi in enumerate(counts) if any(table[hi][0] > slack * table[lo][0] for lo in counts[:i])]


def recheck(engine: Engine, timer: DecodeTimer, name: str, table: dict[int, list[float]]) -> bool:
    """Measure again the one-token steps of `name`'s inverted thread counts and those below them,
    interleaved, each kept at its fastest reading (RECHECKS times at most); whether one stays inverted."""
    for _ in range(RECHECKS):
        bad = inverted_at(table)
        if not bad:
            return False
        log.info("%s one-token step slower on %s threads than on fewer: measuring again", name, bad)
        for t in sorted(t for t in table if t <= max(bad)):
            engine.use_threads(**{name: t})
            timer.decode_ms(name, PREFIX, filler(1))
            table[t][0] = min(table[t][0], timer.decode_ms(name, PREFIX, filler(1), 3))
    return bool(inverted_at(table))


VERIFY_TOKENS = 4  # the target decode whose slowdown beside the draft is timed (a verify of 3)


def contention(timer: DecodeTimer, pairs: int, tries: int = 3) -> tuple[float, float]:
    """(target, draft) slowdown beside each other (DecodeTimer.contention). The target cannot run
    faster with the draft taking memory bandwidth or cores from it: a figure below 1 is noise (a
    machine that grew quieter while the pairs ran) and is measured again, then read as 1."""
    target_x = draft_x = 1.0
    for _ in range(tries):
        target_x, draft_x = timer.contention(PREFIX, filler(VERIFY_TOKENS), pairs)
        if target_x >= 1.0:
            return target_x, draft_x
        log.info("contention measured at %.3f (< 1): measuring again", target_x)
    log.warning("the target measured faster beside the draft %d times (last %.3f): taken as 1", tries, target_x)
    return 1.0, draft_x
