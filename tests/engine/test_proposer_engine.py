"""A proposer of the test's own (Echo, kind "echo") in a real generation, on the fake backend
(tests/fakes.py), without an edit to the engine: rounds.build is wrapped to add it to mode auto's
proposers. The planner chooses it where it pays, the engine verifies its drafts as any other's, and
the answer is exactly mode ar's, greedy and seed for seed when sampling, with some of its tokens
rejected. Its drafts go by its own name ("echo"): their accepted tokens' provenance and Stats.speculators
say so."""

from __future__ import annotations

from typing import Sequence

import pytest

from fakes import FakeContext, FakeModel
from ssd_edge.config import EngineConfig, SamplingConfig
from ssd_edge.engine import Engine
from ssd_edge.events import FinishEvent
from ssd_edge.planning import rounds as planned
from ssd_edge.planning.acceptance import gains
from ssd_edge.speculation.drafters import Draft
from ssd_edge.speculation.proposer import Ask, Bid, Decision, Offer, Verified

PROMPT = [3, 9, 4, 17, 2]
N = 60


def wrong(i: int) -> bool:
    """Whether the echo's copy is wrong at the answer's token i (1, 2, ...): about one in four, at
    uneven gaps (3 and 5 tokens), so that rounds of any length meet them."""
    return (i * 37) % 100 < 25


class Echo:
    """Offers the answer-to-be as a fixed text copied from where the history stands (`text`: the
    tokens after the prompt), at most `most` tokens, each accepted with `alpha` once the ones before
    it were, made in no time."""

    kind = "echo"

    def __init__(self, text: Sequence[int], start: int, alpha: float, most: int = 4) -> None:
        self.text, self.start, self.alpha, self.most = tuple(text), start, alpha, most
        self.rounds: list[tuple[int, int]] = []  # its verified rounds: (drafted, accepted)

    def _copy(self, history: list[int]) -> tuple[int, ...]:
        at = len(history) - self.start
        return self.text[at:at + self.most]

    def offer(self, ask: Ask) -> Offer | None:
        copy = self._copy(ask.history)
        return Offer(len(copy), self._price) if copy else None

    def _price(self, lengths: range) -> list[Bid]:
        g = gains(lambda i: self.alpha, lengths[-1]) if lengths else []
        return [Bid(m, g[m], 0.0) for m in lengths]

    def propose(self, history: list[int], decision: Decision) -> Draft:
        return Draft(self._copy(history)[:decision.m], self.kind)

    def observe(self, verified: Verified) -> None:
        if verified.decision.kind == self.kind:
            self.rounds.append((len(verified.draft), verified.accepted))


def engine() -> Engine:
    """The target alone (auto's proposers: the n-gram lookup, and the echo), its verify of n tokens
    costing little more than a step, so that a copy accepted 3 times in 4 pays."""
    cfg = EngineConfig.build(target=dict(path="fake-target"), n_ctx=1024, mode="auto")
    target = FakeModel("target")
    return Engine.from_parts(cfg, target, FakeContext(target, n_ctx=1024, decode_delay=lambda n: 1e-3 * (1 + 0.05 * n)))


def with_echo(monkeypatch, text: Sequence[int]) -> list[Echo]:
    """rounds.build, wrapped: each generation's proposers start with an Echo of `text` (returned, one
    per generation built)."""
    build, made = planned.build, []

    def build_with_echo(mode, *args, **kwargs):
        rounds = build(mode, *args, **kwargs)
        made.append(Echo(text, len(PROMPT), 0.75))
        rounds.proposers.insert(0, made[-1])
        return rounds

    monkeypatch.setattr(planned, "build", build_with_echo)
    return made


def run(eng: Engine, mode: str, sampling: SamplingConfig | None):
    rounds, fin = [], None
    for ev in eng.generate(tokens=PROMPT, max_tokens=N, mode=mode, sampling=sampling):
        if isinstance(ev, FinishEvent):
            fin = ev
        else:
            rounds.append(ev.round)
    return rounds, fin


@pytest.mark.parametrize("sampling", [
    None,
    SamplingConfig(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed=5),
    SamplingConfig(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=12),  # (seeds whose answer runs to N)
], ids=["greedy", "t0.8", "t1.5"])
def test_a_proposer_of_its_own_is_verified_and_the_answer_stays_ars(monkeypatch, sampling):
    eng = engine()
    _, ref = run(eng, "ar", sampling)
    assert len(ref.tokens) == N, ref.stop_reason
    text = [t % 31 + 1 if wrong(i) else t for i, t in enumerate(ref.tokens, 1)]
    assert text != list(ref.tokens)
    made = with_echo(monkeypatch, text)
    rounds, fin = run(eng, "auto", sampling)
    assert fin.tokens == ref.tokens
    (echo,) = made
    decisions = fin.stats.auto.decisions
    assert decisions.get("echo", 0) >= N // 8, dict(decisions)  # the planner chose it, often
    served = [(r.drafted, r.accepted) for r in rounds if r.mode == "echo"]
    assert served == echo.rounds and len(served) == decisions["echo"]  # each one verified, and observed
    assert any(a < d for d, a in served) and any(a == d > 0 for d, a in served)  # rejected and accepted tokens
    assert fin.stats.drafted >= sum(d for d, _ in served)
    assert fin.stats.speculators["echo"] == len(served)
    assert sum(r.provenance.count("echo") for r in rounds) == sum(a for _, a in served)
