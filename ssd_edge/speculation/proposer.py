"""The Proposer protocol: whatever offers the target tokens to verify.

Each round the round planner (planning/planner.py) asks every proposer of the mode for an offer,
ranks the offers against a plain target step, and asks the chosen one for its draft:

    offer(ask)             what it can give after the history: how many tokens at most, and, priced
                           only when a planned mode ranks it, each length's expected committed
                           tokens and the ms of making them (beyond the target's verify)
    propose(history, d)    the draft the decision d asks for (d.m tokens, or fewer where the
                           proposer's own stopping rule says so)
    observe(verified)      every verified round, whoever proposed it: what was drafted, how much of
                           it the target accepted, the target's rows and time

The planner never names a proposer: it knows kinds by the name each proposer goes by (Stats,
Decision.kind). The draft model, the n-gram lookup and SSD's prepared branches implement it
(planning/proposers.py: they wrap speculation/drafters.py and the worker, speculation/prespec/);
composites are proposers of their own (a draft that reads an n-gram copy as its guess, a prepared
branch the draft extends). Whatever is proposed, the engine verifies it the same way, so no
proposer can change what the target commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol, Sequence, runtime_checkable

import numpy as np

from .drafters import Draft


class Ask(NamedTuple):
    """What a round may hold: room, tokens it may draft (the context's, max_tokens'); remaining,
    tokens the answer may still make (the horizon of an investment, such as a catch-up read)."""

    history: list[int]
    room: int
    remaining: int


class Bid(NamedTuple):
    """One length of an offer, priced: m tokens verified commit `gain` tokens on average, and
    making them costs `ms` beyond the verify."""

    m: int
    gain: float
    ms: float
    guess: int = 0      # a composite's: how many of its leading tokens another proposer guessed


@dataclass(frozen=True)
class Offer:
    """What a proposer can give this round: at most `most` tokens. price(lengths) gives a Bid for
    each length, asked only where a planned mode ranks the offer (a fixed mode takes its proposer at
    full length). probe(), asked only where a plain step wins: the length worth verifying anyway to
    measure this proposer again (0: none)."""

    most: int
    price: Callable[[range], Sequence[Bid]]
    probe: Callable[[], int] | None = None
    finished: bool = False  # a prepared draft that holds all it will hold (nothing to make)


@dataclass(frozen=True)
class Decision:
    """The round's plan: kind (plain, or a proposer's name), how many tokens, the rate expected."""

    kind: str
    m: int
    rate: float                    # expected tokens per ms (0: not planned)
    runner_up: tuple[str, int, float] | None = None
    guess: int = 0                 # a composite draft: how many of its leading tokens are a guess
    probe: bool = False            # verified to measure the proposer again, not because it won

    def describe(self) -> str:
        ru = f"; runner-up {self.runner_up[0]} {self.runner_up[1]} at {self.runner_up[2] * 1e3:.1f} tok/s" \
            if self.runner_up else ""
        return f"{self.kind} {self.m} at {self.rate * 1e3:.1f} tok/s expected{ru}"


PLAIN = Decision("plain", 0, 0.0)


class Verified(NamedTuple):
    """A verified round, as every proposer observes it."""

    decision: Decision      # the plan (PLAIN where nothing was planned)
    draft: Draft            # what was verified
    accepted: int           # of its tokens, the target accepted this many
    history: list[int]      # the history after the round (the accepted tokens and the target's own)
    rows: np.ndarray        # the target's logit rows at the committed positions
    verify_ms: float        # the target's decode
    busy: bool              # the pre-speculation worker drafted beside that decode


@runtime_checkable
class Proposer(Protocol):
    kind: str               # the name its rounds go by: Decision.kind, Stats.auto's decisions

    def offer(self, ask: Ask) -> Offer | None: ...

    def propose(self, history: list[int], decision: Decision) -> Draft: ...

    def observe(self, verified: Verified) -> None: ...
