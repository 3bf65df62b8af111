"""What each round commits and leaves behind, on the fake backend (tests/fakes.py, whose logits come
from the tokens a sequence's cells really hold, so a wrong KV state gives wrong tokens):

- every mode gives ar's tokens, greedy and seed for seed when sampling, and exactly max_tokens;
- after a generation each KV sequence holds exactly the tokens its KVSeq says (rollback is exact);
- a pre-speculation hit hands its branch over whole: with a draft that always agrees, every
  drafted token is accepted, hits included;
- --draft-min (spec.k_min) verifies no draft shorter than k_min: a plain step instead.

These are the checks tests/engine/test_mutations.py plants bugs under."""

from __future__ import annotations

import pytest

from fakes import FakeContext, FakeModel
from ssd_edge.config import EngineConfig, SamplingConfig
from ssd_edge.engine import Engine
from ssd_edge.events import TokenEvent
from ssd_edge.speculation.drafters import NgramDrafter

PROMPT = [3, 9, 4, 17, 2]
MODES = ("sd", "lookup", "ssd", "auto")


def fake_engine(mode: str = "sd", *, disagree_every: int = 3, k: int = 4, target_delay: float = 0.0,
                draft_delay: float = 0.0, spec: dict | None = None, **prespec) -> Engine:
    cfg = EngineConfig.build(target=dict(path="fake-target"), draft=dict(path="fake-draft"), n_ctx=512, mode=mode,
                             spec=dict(k=k, ngram_min=2, **(spec or {})), prespec=dict(prespec))
    target, draft = FakeModel("target"), FakeModel("draft", disagree_every=disagree_every)
    return Engine.from_parts(cfg, target, FakeContext(target, n_ctx=512, decode_delay=target_delay), draft,
                             FakeContext(draft, n_ctx=1024, n_seq_max=cfg.prespec.fanout_max + 1,
                                         decode_delay=draft_delay))


def kv_holds_what_it_says(eng: Engine) -> None:
    for kv in (eng.target_kv, eng.draft_kv):
        assert kv.ctx.seq_tokens(kv.seq) == list(kv.tokens), f"sequence {kv.seq}'s cells differ from its KVSeq"


def check_modes_equal_ar(sampling: SamplingConfig | None = None, n: int = 40) -> None:
    """Each mode's tokens are ar's (n of them unless ar drew the end of generation), and every cache
    holds what its KVSeq says."""
    eng = fake_engine()
    ref = eng.complete(tokens=PROMPT, max_tokens=n, mode="ar", sampling=sampling)
    assert len(ref.tokens) == n or ref.stop_reason == "eos", ref
    for mode in MODES:
        out = eng.complete(tokens=PROMPT, max_tokens=n, mode=mode, sampling=sampling)
        assert out.tokens == ref.tokens, f"{mode}: not ar's tokens"
        assert out.stop_reason == ref.stop_reason
        kv_holds_what_it_says(eng)
        if mode == "sd" and ref.stop_reason == "length":
            assert 0 < out.stats.accepted < out.stats.drafted, out.stats  # accepts and rejects both ran


def test_every_mode_gives_ars_tokens_greedy():
    check_modes_equal_ar()


@pytest.mark.parametrize("temperature", [0.8, 1.5])
def test_every_mode_gives_ars_tokens_seed_for_seed(temperature):
    for seed in range(3):
        check_modes_equal_ar(SamplingConfig(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, seed=seed))


def check_hand_over() -> None:
    """ssd with a draft that always agrees and a slow target, so branches are ready at lookup: every
    hit's branch becomes the draft's main sequence with its tokens, and every drafted token is right."""
    eng = fake_engine("ssd", disagree_every=0, target_delay=0.01)
    ref = eng.complete(tokens=PROMPT, max_tokens=40, mode="ar")
    out = eng.complete(tokens=PROMPT, max_tokens=40, mode="ssd")
    assert out.tokens == ref.tokens
    pre = out.stats.prespec
    assert pre.hits + pre.partial_hits > 0, pre  # else nothing was handed over and this checks nothing
    assert out.stats.accepted == out.stats.drafted, out.stats
    kv_holds_what_it_says(eng)


def test_a_prespec_hit_hands_its_branch_over_whole():
    check_hand_over()


def check_draft_min(k_min: int = 3) -> None:
    """lookup with --draft-min k_min: the n-gram drafter proposes short drafts on this prompt, none
    of which is verified; the drafts that are verified are at least k_min long."""
    prompt = [8, 4, 11, 12, 5, 6, 5, 6]  # the tail 5 6 matches at 4: a 2-token continuation
    assert 0 < len(NgramDrafter(2, 4).propose(prompt, 4)) < k_min  # a short proposal exists
    eng = fake_engine("lookup", spec=dict(k_min=k_min))
    drafted = [ev.round.drafted for ev in eng.generate(tokens=prompt, max_tokens=40, mode="lookup")
               if isinstance(ev, TokenEvent)]
    assert drafted[0] == 0 and all(d == 0 or d >= k_min for d in drafted), drafted
    free = fake_engine("lookup")
    first = next(ev for ev in free.generate(tokens=prompt, max_tokens=40, mode="lookup") if isinstance(ev, TokenEvent))
    assert 0 < first.round.drafted < k_min  # without --draft-min the same short draft is verified


def test_draft_min_verifies_no_shorter_draft():
    check_draft_min()
