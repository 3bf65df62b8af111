"""Sampled answers of Engine.generate follow the target's exact distribution.

The product runs: Engine.generate on the fake backend (tests/fakes.py) with the real sampler, the
real coupled draw and the real verifier; the draft disagrees with the target every other position,
so rounds accept all, some or none of their drafted tokens. The exact distribution of whole answers
of 3 tokens (V = 32) is enumerated from the definitions of top-k/top-p/min-p/temperature in
tests/distribution_check.py, not with ssd_edge.sampling, and the answers of 4,000 seeds are
compared with it by chi-square at a false-alarm rate of 1e-6.

Power (tests/engine/test_mutations.py plants each bug in the real code and asserts this check
fails; measured statistic / threshold at n = 4,000): temperature 10% high 1.66 (t = 2.0),
min-p dropped: an answer outside the support (t = 1.5, min-p 0.01), one noise for every position
2.97, accepting one drafted token too many 10.
"""

from __future__ import annotations

import pytest

from distribution_check import Setting, check_follows_target
from fakes import FakeContext, FakeModel
from ssd_edge.config import EngineConfig
from ssd_edge.engine import Engine

PROMPT = [3, 9, 4]
LENGTH = 3
N = 4000
FLAT = Setting(temperature=2.0)                 # no filter: the tail (and EOS) is drawn, temperature shows
FILTERED = Setting(temperature=1.5, min_p=0.01)  # min-p keeps 3 tokens of 32 at each position
NUCLEUS = Setting(temperature=1.2, top_k=3, top_p=0.9)


def fake_engine(mode: str = "sd", k: int = 2) -> Engine:
    cfg = EngineConfig.build(target=dict(path="fake-target"), draft=dict(path="fake-draft"), n_ctx=64, mode=mode,
                             spec=dict(k=k))
    target, draft = FakeModel("target"), FakeModel("draft", disagree_every=2)
    return Engine.from_parts(cfg, target, FakeContext(target, n_ctx=64), draft,
                             FakeContext(draft, n_ctx=256, n_seq_max=cfg.prespec.fanout_max + 1))


@pytest.mark.parametrize("setting, mode, n", [
    pytest.param(FLAT, "sd", N, id="t2.0-sd"),
    pytest.param(FILTERED, "sd", N, id="t1.5-minp-sd"),
    pytest.param(NUCLEUS, "sd", N // 2, id="t1.2-topk-topp-sd"),
    pytest.param(FILTERED, "ar", N // 2, id="t1.5-minp-ar"),
    pytest.param(FLAT, "ssd", N // 4, id="t2.0-ssd"),
])
def test_sampled_answers_follow_the_exact_distribution(setting, mode, n):
    eng = fake_engine(mode)
    check_follows_target(eng, PROMPT, LENGTH, setting, n, mode)
    if mode == "sd":  # the rounds really mixed outcomes: some drafts accepted, some rejected
        c = eng.complete(tokens=PROMPT, max_tokens=30, mode=mode, sampling=setting.sampling(0))
        assert 0 < c.stats.accepted < c.stats.drafted, c.stats
