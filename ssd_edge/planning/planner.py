"""The round planner, for every mode: each round, which offer the target verifies.

    Planner   ranks the round's offers against a plain step (plan), and learns what verifies cost
    Rounds    runs the Proposer protocol each round: asks every proposer of the mode for its offer,
              has the Planner decide, asks the chosen proposer for its draft (Proposal), and hands
              every verified round to the planner and each proposer (rounds.build wires them)

Each round every proposer of the mode (speculation/proposer.py; ssd-edge's own: planning/proposers.py)
may make an offer; a plain target step is always there. A mode is a menu (MENUS). `auto` plans
over all of them; a fixed mode is the planner held to its proposers in turn, the first with tokens
at its full length: `ar` plain steps, `lookup` n-gram copies, `sd` drafts, `ssd` prepared branches
with the worker always on (a miss drafts now, or after a streak of misses takes the n-gram backup,
as the SSD policy says). The planned menu prices each length of each offer by expected tokens per
millisecond and takes the best:

    rate(m) = g(m) / (verify(m + 1) + making ms(m)),   g(m) = 1 + sum_{i=1..m} prod_{j<i} alpha_j

alpha_j is that proposer's live acceptance at draft position j (acceptance.py); verify(n) is the
target's decode of n tokens (costs.py: the calibration profile's curve, following what this
generation times); the making ms is the proposer's own (nothing for an n-gram copy or a ready
branch, the steps and the catch-up read for a draft). m runs up to the cap: --draft-max when
given, else DRAFT_CAP for the draft model and NGRAM_CAP for an n-gram copy, so drafts grow as long
as the verify curve pays for them (long on a GPU, short or none on a compute-bound CPU).

Evidence arrives even for proposers that did not run: the n-gram lookup is asked every round and
scored against what the target committed; the draft's acceptance is estimated from the target's
own confidence while only plain steps run (calibrated by the rounds where the draft did run).
One bad round early can still write the draft off where it would pay, so where the device could
reward a good draft handsomely (upside: a draft accepted at EXPLORE_ALPHA would beat plain steps
by EXPLORE_UPSIDE, on a memory-bound target) a plain-step stretch is broken by a short probe now
and then (Offer.probe), the wait doubling after each probe the plan does not follow. On a
compute-bound CPU the upside is below 1.1 and no probe ever runs.

The pre-speculation worker (speculation/prespec/) drafts the next round beside the verify: in
`ssd` always (unless the SSD policy rolled it back or cut it), in `auto` only while it earns its
keep (prepared.PreparedProposer.runs): the rounds it prepares must be used, and the time a used
branch saves must beat what the worker costs the verify (costs.Costs.contention).

Lossless without help from here: tokens are drawn with coupled noise (coupling.py), so what the
target commits never depends on what was proposed; the planner only decides how fast.

Pure state and arithmetic on the engine thread: no models, no threads; tested with plain numbers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Sequence

import numpy as np

from ..config import DRAFT_CAP  # noqa: F401 (most draft-model tokens a round verifies without --draft-max)
from ..speculation.drafters import EMPTY, Candidates, Draft
from ..speculation.proposer import PLAIN, Ask, Decision, Offer, Proposer, Verified
from .costs import Costs, describe_regime
from .prepared import PreparedProposer
from .proposers import lengths

if TYPE_CHECKING:  # the modes that pre-speculate import these alone
    from ..speculation.policy import PrespecPolicy
    from ..speculation.prespec import PrespecWorker
    from ..structured.rows import ForcedRuns

log = logging.getLogger(__name__)

NGRAM_CAP = 16   # most n-gram tokens likewise (an exact copy costs nothing to draft)
FIXED_K = 3      # the fixed modes' draft length without --draft-max (llama.cpp's default)
PLAIN_MARGIN = 0.03  # a speculative plan must beat a plain step by this much (estimates carry noise)
SERVED = {"plain": "ar", "ngram": "lookup", "draft": "sd", "prepared": "ssd"}  # the mode each kind's rounds are


@dataclass(frozen=True)
class Menu:
    """What a mode may propose (plain, and the kinds of its proposers, in the order a fixed mode
    tries them). planned: choose kind and length by expected rate each round (else the mode's
    first proposer with tokens, at its full length). worker: whether the pre-speculation worker
    drafts beside the verify: never, always, or while it pays."""

    kinds: frozenset[str]
    planned: bool
    worker: Literal["off", "always", "earned"]


MENUS = {
    "ar": Menu(frozenset({"plain"}), False, "off"),
    "lookup": Menu(frozenset({"plain", "ngram"}), False, "off"),
    "sd": Menu(frozenset({"plain", "draft"}), False, "off"),
    "ssd": Menu(frozenset({"plain", "draft", "prepared", "ngram"}), False, "always"),
    "auto": Menu(frozenset({"plain", "draft", "prepared", "ngram"}), True, "earned"),
}


def k_text(mode: str, k: int | None) -> str | None:
    """The draft length as `mode` runs it, for the faces: -k when given; else "auto" where the planner
    chooses each round's (mode auto), the fixed modes' FIXED_K (sd, lookup, ssd), and nothing for ar,
    which drafts nothing."""
    if k is not None:
        return str(k)
    if mode == "ar":
        return None
    return "auto" if MENUS[mode].planned else str(FIXED_K)


class Planner:
    """Ranks the round's offers against a plain step (see the module docstring)."""

    def __init__(self, menu: Menu, costs: Costs | None = None, *, k_min: int = 0, span: int = NGRAM_CAP) -> None:
        self.menu = menu
        self.costs = costs or Costs()
        self.k_min = k_min  # --draft-min: no round verifies fewer drafted tokens (but none)
        self.span = span  # the longest verify reported (the longest offer's cap)
        self.prefilled = False  # the prompt's round has run
        self.decisions: dict[str, int] = {}
        self.log: list[tuple] = []  # every planned decision: (kind, m, tok/s, runner-up kind, m, tok/s)

    def plan(self, offers: Sequence[tuple[str, Offer]], room: int) -> Decision:
        """The round's decision among (kind, offer) pairs, in the order a fixed mode tries them;
        `room`: the most tokens the round may draft."""
        d = self._plan(offers, room)
        self.decisions[d.kind] = self.decisions.get(d.kind, 0) + 1
        return d

    def _plan(self, offers: Sequence[tuple[str, Offer]], room: int) -> Decision:
        if not self.menu.planned:  # a fixed mode: its first proposer with tokens, as long as it goes
            # (a draft shorter than --draft-min is not verified: rounds.verifiable, for every mode)
            for kind, offer in offers:
                return Decision(kind, min(offer.most, room), 0.0)
            return PLAIN
        if not self.prefilled:  # the first token as fast as ar; a worker reads the prompt meanwhile
            return PLAIN
        plain_rate = 1.0 / self.costs.step_ms()
        if not offers:  # nothing on offer but a plain step (no probe either)
            self.log.append(("plain", 0, round(plain_rate * 1e3, 2)))
            return Decision("plain", 0, plain_rate)
        verify = self.costs.target.ms
        scored: list[tuple[float, str, int, int]] = [(plain_rate * (1.0 + PLAIN_MARGIN), "plain", 0, 0)]
        for kind, offer in offers:
            scored += [(b.gain / (verify(b.m + 1) + b.ms), kind, b.m, b.guess)
                       for b in offer.price(lengths(min(offer.most, room), self.k_min))]
        scored.sort(key=lambda x: -x[0])
        (rate, kind, m, guess), rest = scored[0], scored[1:]
        unmargin = lambda r, k: r / (1.0 + PLAIN_MARGIN) if k == "plain" else r  # noqa: E731
        ru = next(((k2, m2, unmargin(r2, k2)) for r2, k2, m2, _ in rest if k2 != kind), None)
        probe = next(((k2, m2) for k2, o in offers if o.probe is not None and (m2 := o.probe())), None) \
            if kind == "plain" else None
        if probe is not None:  # the proposer is measured again rather than inferred
            ru = (kind, m, unmargin(rate, kind))
            kind, m = probe
            guess = next((g for _, k2, m2, g in scored if (k2, m2) == probe), 0)
            d = Decision(kind, m, 0.0, ru, guess, probe=True)
        else:
            d = Decision(kind, m, unmargin(rate, kind), ru, guess)
        self.log.append((d.kind, d.m, round(d.rate * 1e3, 2), *((ru[0], ru[1], round(ru[2] * 1e3, 2)) if ru else ())))
        log.debug("plan: %s", d.describe())
        return d

    def observe(self, verified: Verified) -> None:
        """A verified round: the target's decode time prices its verifies (busy: with the worker
        drafting beside it). The prompt's round says nothing of a step; a fixed mode prices nothing."""
        if not self.menu.planned:
            return
        if self.prefilled:
            self.costs.observe_target(len(verified.draft) + 1, verified.verify_ms, verified.busy)
        self.prefilled = True

    def report(self) -> dict:
        verify = [round(self.costs.target.ms(n), 2) for n in range(1, self.span + 2)]
        return {"decisions": dict(self.decisions),
                "step_ms": round(self.costs.step_ms(), 2),
                "verify_ms": {n: v for n, v in enumerate(verify, 1)},
                "regime": describe_regime(verify),
                "draft_step_ms": round(self.costs.draft.ms(1), 2),
                "contention": round(self.costs.contention, 3),
                "rounds": [list(x) for x in self.log]}


# Mode ar's steps after the prompt run in one C call each (KVSeq.steps) for at most about this long, so
# that a round carries a tenth of a second of tokens (3 on a CPU at 30 ms a step, 60 on a GPU at 1.7):
# the stream stays live, a cancel is seen within it, and the engine's Python runs once per call instead
# of once per token, with caches that a CPU decode left cold.
PLAIN_RUN_S = 0.1


class Proposal(NamedTuple):
    draft: Draft
    speculator: str          # who drafted it: none, draft, prespec, ngram, grammar, or a new proposer's own kind
    prespec: str | None      # SSD lookups: hit, partial, miss
    run_s: float = 0.0       # a plain run: nothing drafted, plain steps for about this long in one call
    forced: int = 0          # the draft's first tokens that a grammar forced (structured output)


NOTHING = Proposal(EMPTY, "none", None)
PLAIN_RUN = Proposal(EMPTY, "none", None, PLAIN_RUN_S)


def verifiable(draft: Draft, k_min: int) -> Draft:
    """--draft-min: a draft shorter than k_min is not verified (a plain step instead). Cutting what
    was drawn because of its length is safe: committed tokens never depend on the proposal
    (coupling.py), and the length itself was decided before each token was drawn."""
    return draft if len(draft) >= max(k_min, 1) else EMPTY


class Rounds:
    """Each round's proposal and its bookkeeping, for one generation: the one place that runs the
    Proposer protocol (asks the offers, has the planner decide, asks the chosen proposer for its
    draft, and hands every verified round to the planner and each proposer)."""

    def __init__(self, mode: str, planner: Planner, proposers: Sequence[Proposer], k_min: int,
                 prepared: PreparedProposer | None = None, worker: PrespecWorker | None = None,
                 policy: PrespecPolicy | None = None) -> None:
        self.mode = mode
        self.planner = planner
        self.proposers = list(proposers)  # in the order a fixed mode tries them
        self.k_min = k_min
        self.prepared = prepared
        self.worker = worker
        self.policy = policy
        self.decision: Decision | None = None
        self.plain = planner.menu.kinds == {"plain"}  # mode ar: every round a plain step, nothing to plan
        # a grammar's forced run after a history (structured/rows.ForcedRuns), proposed first in every mode
        # but ar, its acceptance learned (rounds.build sets it where the generation has a grammar)
        self.forced: ForcedRuns | None = None
        self.runs = self.plain  # mode ar after the prompt: plain runs, while the target's context can make them
        self.prefilled = False  # the prompt's round has been observed

    @property
    def busy(self) -> bool:
        """Whether the worker drafts beside the verify now running."""
        return self.prepared is not None and self.prepared.busy

    @property
    def prompt_alone(self) -> bool:
        """Whether the prompt's round, not yet run, is the target's alone, the two models taking turns
        (PreparedProposer.prompt_alone)."""
        return not self.prefilled and self.prepared is not None and self.prepared.prompt_alone

    @property
    def beside(self) -> int:
        """Branches the worker grows beside the verify now running (0: it rests)."""
        return self.prepared.width if self.busy else 0

    @property
    def served(self) -> str:
        """The mode that served the last round: ar (plain), lookup (n-gram), sd (draft), ssd (branch)."""
        return SERVED.get(self.decision.kind, self.decision.kind) if self.decision is not None else "ar"

    @property
    def state(self) -> str:
        """What runs now, for the gauges: the mode served, ssd's `backup` (an n-gram round in ssd), or
        the SSD policy's rolled-back or sla-cut."""
        if self.policy is not None and self.policy.state != "ssd":
            return self.policy.state
        if self.mode == "ssd" and self.served == "lookup":
            return "backup"
        return self.served

    def propose(self, history: list[int], room: int, remaining: int) -> Proposal:
        """The draft to verify after `history`, at most `room` tokens (mode ar: a plain step, and after
        the prompt a plain run)."""
        if room < 1 or self.plain or self.prompt_alone:  # (prompt_alone: the first token as soon as ar's)
            self.decision = None
            return PLAIN_RUN if self.runs and self.prefilled else NOTHING
        ask = Ask(history, room, remaining)
        offers = [(p, o) for p in self.proposers if (o := p.offer(ask)) is not None]
        d = self.decision = self.planner.plan([(p.kind, o) for p, o in offers], room)
        chosen = next((p for p, _ in offers if p.kind == d.kind), None)
        forced = self.forced(history)[:room] if self.forced is not None and d.kind != "prepared" else []
        if forced:  # the grammar's only continuation goes first, free; the chosen proposer drafts after it
            return self._after_forced(history, forced, chosen, d, room)
        draft = verifiable(chosen.propose(history, d) if chosen is not None else EMPTY, self.k_min)
        status = self.prepared.status if self.prepared is not None else None
        return Proposal(draft, draft.speculator if len(draft) else "none", status)

    def _after_forced(self, history: list[int], forced: list[int], chosen: Proposer | None, d: Decision,
                      room: int) -> Proposal:
        """The grammar's forced run, then what the chosen proposer drafts after it (a prepared branch,
        drawn under the grammar's masks, holds its own forced run already and is taken as it is)."""
        inner = EMPTY
        if chosen is not None and room > len(forced):
            inner = verifiable(chosen.propose(history + forced, replace(d, m=min(d.m, room - len(forced)))),
                               self.k_min)
        cands = None
        if inner.cands is not None or not len(inner):  # a forced token is the only candidate there
            cands = tuple(Candidates(np.array([t]), np.ones(1)) for t in forced) + (inner.cands or ())
        draft = Draft((*forced, *inner.tokens), inner.speculator if len(inner) else "grammar", cands, inner.match)
        status = self.prepared.status if self.prepared is not None else None
        return Proposal(draft, draft.speculator, status, forced=len(forced))

    def verifying(self, history: list[int], draft: Draft) -> None:
        """The target starts verifying `draft`: the worker prepares the next round beside it where the
        SSD policy lets it and that is expected to pay."""
        if self.prepared is not None:
            self.prepared.verifying(history, draft, self.decision or PLAIN)

    def observe(self, prop: Proposal, history: list[int], accepted: int, verify_s: float, ms_per_token: float,
                rows: np.ndarray) -> None:
        """The round is verified: `rows` are the target's logit rows at the committed positions."""
        self.prefilled = True
        if self.plain:  # no proposer to price: nothing reads a plain-only planner's observations
            return
        v = Verified(self.decision or PLAIN, prop.draft, accepted, history, rows, verify_s * 1e3, self.busy)
        self.planner.observe(v)
        f = prop.forced
        if f and self.forced is not None:  # its acceptance learned; the proposers see the part after it, if reached
            self.forced.observe(f, accepted)
            if accepted < f:
                v = None
            else:
                inner = Draft(prop.draft.tokens[f:], prop.draft.speculator,
                              prop.draft.cands[f:] if prop.draft.cands is not None else None, prop.draft.match)
                v = v._replace(draft=inner, accepted=accepted - f, rows=rows[f:])
        for p in self.proposers if v is not None else ():
            p.observe(v)
        if self.policy is not None:
            self.policy.observe_round(ms_per_token, accepted + 1)

    def report(self) -> dict[str, Any] | None:
        """Mode auto's planner report (Stats.auto): the planner's and each proposer's; None in the other modes."""
        if self.mode != "auto":
            return None
        out = self.planner.report()
        for p in self.proposers:
            out.update(p.report() if hasattr(p, "report") else {})
        return {**out, "concurrent": self.worker is not None}

    def close(self) -> bool:
        """End the generation's worker; False where a hung worker still holds the draft context."""
        # (the worker's draft sequence is the engine's draft KV, moved back to 0)
        return self.worker.close() if self.worker is not None else True
