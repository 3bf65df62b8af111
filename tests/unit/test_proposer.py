"""The Proposer protocol (speculation/proposer.py) is open: a proposer of the test's own (Echo, kind
"echo") plugged in beside ssd-edge's is ranked by the planner with the same formula as theirs,

    rate(m) = gain(m) / (verify(m + 1) + ms(m)),

chosen where its rate is the best and passed over where it is not, taken at full length by a fixed
menu when it is the first with tokens, and run by Rounds like any other. Every proposer class of
ssd_edge satisfies the (runtime-checkable) protocol."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Sequence

import numpy as np
import pytest

from ssd_edge.config import PrespecConfig, SamplingConfig
from ssd_edge.planning import prepared, proposers
from ssd_edge.planning.acceptance import DraftAcceptance, NgramAcceptance, gains
from ssd_edge.planning.costs import Costs
from ssd_edge.planning.planner import MENUS, PLAIN_MARGIN, Planner
from ssd_edge.planning.prepared import PreparedProposer
from ssd_edge.planning.proposers import DraftProposer, NgramProposer
from ssd_edge.planning.rounds import Rounds
from ssd_edge.speculation.drafters import Draft, NgramDrafter
from ssd_edge.speculation.policy import PrespecPolicy
from ssd_edge.speculation.proposer import Ask, Bid, Decision, Offer, Proposer, Verified

CPU_CURVE = [105.0, 150.0, 160.0, 170.0, 220.0]  # a verify of 4 tokens ~1.6 steps (test_planner's)
HISTORY = [1, 2, 3]  # nothing in it for the n-gram lookup to copy


class Echo:
    """A proposer of the test's own: it offers a fixed copy, each of its tokens accepted with `alpha`
    once the ones before it were, any length of it made in `ms`. (Its drafts go by an n-gram copy's
    speculator: events.Speculator names four.)"""

    kind = "echo"

    def __init__(self, copy: Sequence[int], alpha: float, ms: float) -> None:
        self.copy, self.alpha, self.ms = tuple(copy), alpha, ms
        self.verified: list[Verified] = []

    def offer(self, ask: Ask) -> Offer | None:
        return Offer(len(self.copy), self.price) if self.copy else None

    def price(self, lengths: range) -> list[Bid]:
        g = gains(lambda i: self.alpha, lengths[-1]) if lengths else []
        return [Bid(m, g[m], self.ms) for m in lengths]

    def propose(self, history: list[int], decision: Decision) -> Draft:
        return Draft(self.copy[:decision.m], "ngram")

    def observe(self, verified: Verified) -> None:
        self.verified.append(verified)


def planner(menu: str = "auto", curve=CPU_CURVE) -> Planner:
    """A planner past the prompt's round."""
    p = Planner(MENUS[menu], Costs(curve, draft_step_ms=44.0))
    p.prefilled = True
    return p


def draft_proposer(costs: Costs, cap: int = 3, planned: bool = True, prior: float = 0.9) -> DraftProposer:
    """The draft model's proposer over a drafter that has read HISTORY (no model runs: only its offer
    is asked), at its prior acceptance."""
    drafter = SimpleNamespace(kv=SimpleNamespace(tokens=list(HISTORY)), sampling=SamplingConfig(), timing=None)
    return DraftProposer(drafter, DraftAcceptance(cap, prior), costs, cap, 0, planned)


def offers(ask: Ask, *props) -> list[tuple[str, Offer]]:
    return [(p.kind, o) for p in props if (o := p.offer(ask)) is not None]


def best_rate(p: Planner, echo: Echo, room: int) -> tuple[int, float]:
    """(m, rate) of the echo's best length, by the formula worked out here."""
    verify = p.costs.target.ms
    g = gains(lambda i: echo.alpha, len(echo.copy))
    return max(((m, g[m] / (verify(m + 1) + echo.ms)) for m in range(1, min(len(echo.copy), room) + 1)),
               key=lambda x: x[1])


@pytest.mark.parametrize("alpha, ms", [(0.9, 0.0), (0.8, 20.0), (0.99, 5.0)])
def test_a_proposer_of_its_own_is_ranked_by_the_same_rate(alpha, ms):
    p = planner()
    echo = Echo(range(10, 15), alpha, ms)
    d = p.plan(offers(Ask(HISTORY, 5, 64), echo), 5)
    m, rate = best_rate(p, echo, 5)
    assert (d.kind, d.m) == ("echo", m) and d.rate == pytest.approx(rate)
    assert d.runner_up == ("plain", 0, pytest.approx(1.0 / CPU_CURVE[0]))  # (without its margin)
    assert p.report()["decisions"] == {"echo": 1}


def test_it_wins_where_its_rate_is_the_best_and_not_where_it_is_not():
    """Beside the draft model's offer: an echo a percent faster than the draft's best bid is chosen,
    one a percent slower is not, and the round is then what it would be without the echo."""
    p = planner()
    ask = Ask(HISTORY, 3, 64)
    draft = draft_proposer(p.costs)
    without = p.plan(offers(ask, draft), 3)
    assert without.kind == "draft" and without.rate > 1.0 / CPU_CURVE[0] * (1 + PLAIN_MARGIN)
    verify_2 = p.costs.target.ms(2)
    for factor, wins in [(1.01, True), (0.99, False)]:
        # one token accepted at 0.9: rate = 1.9 / (verify(2) + ms), set to factor x the draft's best
        echo = Echo([42], 0.9, 1.9 / (factor * without.rate) - verify_2)
        d = p.plan(offers(ask, echo, draft), 3)
        assert (d.kind == "echo") is wins
        if wins:
            assert d.m == 1 and d.rate == pytest.approx(factor * without.rate)
            assert d.runner_up == ("draft", without.m, pytest.approx(without.rate))
        else:
            assert (d.kind, d.m, d.rate) == (without.kind, without.m, pytest.approx(without.rate))
            assert d.runner_up[0] == "echo" and d.runner_up[2] == pytest.approx(factor * without.rate)


def test_it_loses_to_plain_steps_and_to_an_ngram_copy_that_pay_more():
    p = planner()
    slow = Echo(range(10, 13), 0.9, 400.0)  # its tokens cost more than plain steps make
    assert p.plan(offers(Ask(HISTORY, 3, 64), slow), 3).kind == "plain"
    quoted = [1] + [100 + i % 3 for i in range(43)]  # a long exact copy: the lookup copies 3 tokens
    acc = NgramAcceptance(NgramDrafter(2, 4), 3)
    for rates in acc.rates:
        for r in rates:
            for _ in range(10):
                r.add(1.0)
    ngram = NgramProposer(acc, 3)
    weak = Echo(range(10, 13), 0.6, 0.0)  # faster than plain steps, slower than the copy
    d = p.plan(offers(Ask(quoted, 3, 64), weak, ngram), 3)
    assert (d.kind, d.m) == ("ngram", 3) and d.runner_up[0] == "echo"


@pytest.mark.parametrize("mode", ["sd", "lookup", "ssd"])
def test_a_fixed_menu_takes_it_at_full_length_when_it_is_first(mode):
    """A fixed mode is the planner held to its proposers in turn: the first with tokens, at its full
    length (the room permitting), whatever its price; behind another, it waits its turn."""
    p = planner(mode)
    ask = Ask(HISTORY, 16, 64)
    draft = draft_proposer(p.costs, planned=False)
    never = Echo(range(10, 15), 0.01, 10_000.0)
    assert p.plan(offers(ask, never, draft), 16) == Decision("echo", 5, 0.0)
    assert p.plan(offers(Ask(HISTORY, 2, 64), never, draft), 2) == Decision("echo", 2, 0.0)
    assert p.plan(offers(ask, draft, never), 16) == Decision("draft", 3, 0.0)
    assert p.plan(offers(ask, Echo((), 1.0, 0.0), draft), 16) == Decision("draft", 3, 0.0)  # nothing to offer


def test_rounds_runs_it_like_any_proposer():
    """Rounds (the one place that runs the protocol) asks its offer, has it draft what the planner
    chose, and hands it every verified round, its own and the others'."""
    p = planner()
    echo = Echo(range(10, 15), 0.95, 0.0)
    rounds = Rounds("auto", p, [echo, NgramProposer(NgramAcceptance(NgramDrafter(2, 4), 16), 16)], 0)
    prop = rounds.propose(list(HISTORY), 16, 64)
    assert rounds.decision.kind == "echo" and prop.draft.tokens == tuple(range(10, 10 + rounds.decision.m))
    history = HISTORY + [10, 11, 99]
    rows = np.zeros((3, 8))
    rounds.verifying(list(HISTORY), prop.draft)
    rounds.observe(prop, history, 2, 0.2, 70.0, rows)
    (v,) = echo.verified
    assert (v.decision, v.draft, v.accepted, v.history, v.verify_ms) == (rounds.decision, prop.draft, 2, history, 200.0)
    assert rounds.served == "echo" and rounds.report()["decisions"] == {"echo": 1}


def ssd_edge_proposers() -> list[type]:
    """The proposer classes of planning/proposers.py and prepared.py: those with a kind of their own."""
    return [c for module in (proposers, prepared) for _, c in inspect.getmembers(module, inspect.isclass)
            if c.__module__ == module.__name__ and isinstance(getattr(c, "kind", None), str)]


def test_every_proposer_satisfies_the_protocol():
    classes = ssd_edge_proposers()
    assert set(classes) == {NgramProposer, DraftProposer, PreparedProposer}
    costs = Costs(CPU_CURVE)
    acceptance = DraftAcceptance(3)
    ngram = NgramProposer(NgramAcceptance(NgramDrafter(2, 4), 3), 3)
    prepared = PreparedProposer(SimpleNamespace(), PrespecPolicy(PrespecConfig()), acceptance, costs, 3, 0, True, False)
    for x in (ngram, draft_proposer(costs), prepared, Echo((), 1.0, 0.0)):
        assert isinstance(x, Proposer), type(x)
    assert {type(x) for x in (ngram, prepared, draft_proposer(costs))} == set(classes)
    assert not isinstance(SimpleNamespace(kind="half", offer=lambda ask: None), Proposer)  # no propose, no observe
