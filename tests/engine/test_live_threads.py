"""The engine's threads follow the machine (planning/threads.py), on the fake backend: a fake context
whose step time depends on its thread count and on whether another program holds a core. The output
never depends on the threads (the fake's logits do not), and the rounds say what ran where."""

from __future__ import annotations

import pytest

from fakes import FakeContext, FakeModel
from ssd_edge.config import EngineConfig
from ssd_edge.engine import Engine
from ssd_edge.events import FinishEvent
from ssd_edge.planning.threads import PROBE_SHARE

PROMPT = [3, 9, 4, 17, 2]


class Machine:
    """Two cores; `busy` when another program holds one: every-core steps then run 2x slower, one
    thread runs about as fast as before (ms per plain step, fast enough for a test)."""

    def __init__(self) -> None:
        self.busy = False

    def step_s(self, ctx: FakeContext, n: int) -> float:
        if ctx.threads >= 2:
            ms = 16.0 if self.busy else 8.0
        else:
            ms = 9.0 if self.busy else 13.0
        return ms * (1 + 0.3 * (n - 1)) / 1e3


def engine(machine: Machine, **cfg_kw) -> Engine:
    cfg = EngineConfig.build(target=dict(path="fake-target", threads=2), n_ctx=2048, mode="ar",
                             threads_follow_mode=True, **cfg_kw)
    ctx = FakeContext(FakeModel("target"), n_ctx=2048)
    ctx.decode_delay = lambda n: machine.step_s(ctx, n)
    return Engine.from_parts(cfg, FakeModel("target"), ctx)


@pytest.fixture(autouse=True)
def two_cores(monkeypatch):
    monkeypatch.setattr("ssd_edge.planning.rounds.usable_cores", lambda: 2)


def rounds_of(eng: Engine, n: int, on_round=None):
    rounds, fin = [], None
    for ev in eng.generate(tokens=PROMPT, max_tokens=n, mode="ar"):
        if isinstance(ev, FinishEvent):
            fin = ev
        else:
            rounds.append(ev.round)
            if on_round:
                on_round(ev.round)
    return rounds, fin


def test_a_busy_core_mid_generation_moves_the_target_to_one_thread_fewer_within_a_bound():
    machine = Machine()
    eng = engine(machine)
    quiet, _ = rounds_of(eng, 200)  # learns the quiet machine: every core, probes growing apart
    assert quiet[-1].threads == (2, None)
    at = {}

    def get_busy(r):
        if r.index == 60:
            machine.busy = True
            at["busy"] = r.index
    rounds, fin = rounds_of(eng, 120, get_busy)
    moved = next(r.index for r in rounds if r.index > at["busy"] and r.threads == (1, None))
    assert moved - at["busy"] <= 8  # steps, one per round here (SLOW_ROUNDS of them seen slow, then a probe)
    assert all(r.threads == (1, None) for r in rounds[moved + 1:moved + 20])
    assert {(s.target, s.draft) for s in fin.stats.threads} == {(2, None), (1, None)}
    one = next(s for s in fin.stats.threads if s.target == 1)
    assert one.ms_per_step is not None and one.ms_per_step < 12.0


def test_a_steady_machine_probes_under_the_stated_share():
    eng = engine(Machine())
    rounds, fin = rounds_of(eng, 200)
    probes = sum(r.threads == (1, None) for r in rounds)
    assert 0 < probes <= PROBE_SHARE * len(rounds)
    assert fin.stats.to_dict()["threads"][0]["target"] == 2


def test_given_threads_stand_and_nothing_probes():
    machine = Machine()
    eng = engine(machine)
    eng.config = eng.config.model_copy(update={"threads_follow_mode": False})
    machine.busy = True
    rounds, fin = rounds_of(eng, 60)
    assert {r.threads for r in rounds} == {(2, None)}


def test_the_tokens_do_not_depend_on_the_threads():
    machine = Machine()
    plain = [t for r in rounds_of(engine(Machine()), 60)[0] for t in r.tokens]
    eng = engine(machine)
    machine.busy = True
    rounds = rounds_of(eng, 60)[0]
    assert {r.threads for r in rounds} == {(2, None), (1, None)}  # it moved mid-generation
    assert [t for r in rounds for t in r.tokens] == plain


@pytest.mark.parametrize("mode", ["ssd", "auto"])
def test_the_prompt_is_read_by_the_target_alone_with_every_core_then_the_draft_with_every_core(mode):
    """Where the draft would run beside the target on cores of their own (ssd's 1 + 1 on 2 cores), the prompt's
    round is the target's alone, at every core: nothing drafted, no worker beside it (the two reading side
    by side at one thread each took twice ar's time to the first token, on a 1,149-token prompt of the
    default pair). The draft then reads the prompt as the next round drafts, at those threads too; the verifies
    after it run at the split. The tokens are ar's."""
    machine = Machine()
    cfg = EngineConfig.build(target=dict(path="fake-target", threads=1), draft=dict(path="fake-draft", threads=1),
                             n_ctx=2048, mode=mode, threads_follow_mode=True, spec=dict(k=4))
    ctx = FakeContext(FakeModel("target"), n_ctx=2048)
    ctx.decode_delay = lambda n: machine.step_s(ctx, n)
    draft_ctx = FakeContext(FakeModel("draft", disagree_every=5), n_ctx=4096, n_seq_max=cfg.prespec.fanout_max + 1)
    eng = Engine.from_parts(cfg, FakeModel("target"), ctx, FakeModel("draft", disagree_every=5), draft_ctx)
    seen = []
    plain_read = draft_ctx.decode

    def decode(tokens, *args, **kwargs):
        seen.append((len(tokens), draft_ctx.threads))
        return plain_read(tokens, *args, **kwargs)
    draft_ctx.decode = decode
    rounds, fin = [], None
    for ev in eng.generate(tokens=PROMPT * 20, max_tokens=40, mode=mode):
        if isinstance(ev, FinishEvent):
            fin = ev
        else:
            rounds.append(ev.round)
    first = rounds[0]
    assert first.drafted == 0 and first.beside == 0 and first.threads == (2, 2)
    if mode == "ssd":  # the draft's first reads: the prompt and the first token, a batch (64) at a time
        assert sum(n for n, _ in seen[:2]) == len(PROMPT) * 20 + 1 and {t for _, t in seen[:2]} == {2}
        assert rounds[1].drafted > 0 and rounds[1].threads == (1, 1) and rounds[1].beside > 0
    ar = eng.complete(tokens=PROMPT * 20, max_tokens=40, mode="ar")
    assert [t for r in rounds for t in r.tokens] == list(ar.tokens)
