"""Sampled runs across thread changes mid-generation, on the small real pair: the target's plain steps
follow the machine (planning/threads.py), here made to change the thread count every plain round
(2, 1, 2, ...), and every mode's draws stay seed for seed those of `ar` at a fixed 2 threads. On this
pair the rows do not depend on the count (each dot product is one thread's), so no near-tie can excuse
a difference; the default pair's greedy twin, where they can, is tests/default_pair/test_threads_qwen.py."""

from __future__ import annotations

import pytest

from conftest import make_engine
from lossless_check import first_difference, generate
from prompts import PROMPTS
from ssd_edge.config import SamplingConfig
from ssd_edge.planning.threads import ThreadChoice

PROMPT_NAMES = ("fibonacci", "chat_explain")


@pytest.fixture(scope="module")
def pair_engine(small_pair):
    eng = make_engine(small_pair, target=dict(threads=2), draft=dict(threads=2))
    eng.load_draft()
    yield eng
    eng.close()


@pytest.mark.real
@pytest.mark.parametrize("mode", ["ar", "sd", "auto"])
def test_sampled_draws_hold_across_thread_changes_small_pair(pair_engine, monkeypatch, mode):
    eng = pair_engine
    ran: list[int] = []

    def pick(self) -> int:  # every plain round at the other count
        self.current = self.options[len(ran) % len(self.options)]
        ran.append(self.current)
        return self.current

    for seed, p in enumerate(p for p in PROMPTS if p.name in PROMPT_NAMES):  # a seed a prompt
        ids = eng.prompt_tokens(**p.kwargs())
        s = SamplingConfig(temperature=0.8, top_k=40, top_p=0.95, seed=seed)
        eng.config = eng.config.model_copy(update={"threads_follow_mode": False})
        ar = generate(eng, ids, "ar", 24, s)
        with monkeypatch.context() as m:
            m.setattr("ssd_edge.planning.rounds.usable_cores", lambda: 2)
            m.setattr(ThreadChoice, "pick", pick)
            eng.config = eng.config.model_copy(update={"threads_follow_mode": True})
            run = generate(eng, ids, mode, 24, s)
        assert run.out == ar.out, f"{mode} on {p.name}, seed {seed}: from position {first_difference(ar, run)}"
        if mode == "ar":  # every round plain: it ran at both counts (sd's rounds all draft)
            assert {t.target for t in run.stats.threads} == {1, 2}, run.stats.threads
    if mode != "sd":  # (sd's rounds all draft: its count changes only where a plain round comes)
        assert {1, 2} <= set(ran)
