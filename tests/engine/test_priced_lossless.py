"""The near-tie proof of tests/lossless_check.py where rows tie on purpose: a priced pair with planted
ties (ssd_edge/bench/priced: on a fraction of contexts the target's two candidates are 0.3 apart and a batch
ranks them the other way, as a GPU's batched kernels can). Greedy and sampled (coupled Gumbel draws),
every difference between ar and a speculative mode must be proven such a tie by replaying both runs'
own rows, and a planted difference that is not a tie must fail the proof."""

from __future__ import annotations

import pytest

from lossless_check import Tally, check_replay_reproduces, compare_prompt, first_difference, generate, tolerance
from prompts import Prompt
from ssd_edge.bench import priced
from ssd_edge.config import EngineConfig, SamplingConfig
from ssd_edge.engine import Engine
from ssd_edge.bench.priced.backend import PEAK, PricedContext, mix

PROMPT = Prompt("merge", "chat", messages=({"role": "user", "content": "Write a function that merges two sorted lists."},))
CONFIG = dict(target=dict(path="priced"), draft=dict(path="priced"), n_ctx=1024)


def sampling(temperature: float, seed: int = 5) -> SamplingConfig:
    return SamplingConfig(temperature=temperature, top_k=40, top_p=0.95, min_p=0.05, seed=seed)


def build(ties: float, target_ctx: type[PricedContext] = PricedContext) -> Engine:
    """A priced engine whose target decodes through `target_ctx`, near-ties planted on `ties` of the contexts."""
    cfg = EngineConfig.build(**CONFIG)
    target, draft = priced.Priced(ties=ties).models()
    return Engine.from_parts(cfg, target, target_ctx(target, cfg.n_ctx, cfg.n_batch),
                             draft, PricedContext(draft, 2 * cfg.n_ctx + cfg.prespec.budget_cells, cfg.n_batch,
                                                  n_seq_max=cfg.prespec.fanout_max + 1))


# greedy: every tie a verify meets flips its token; sampled: a tie flips a draw only where the two
# tokens' Gumbel noise nearly cancels their gap (~7% of ties), so more ties and longer answers
CASES = {"greedy": (0.0, 0.1, 64, (5,)), "T=1": (1.0, 0.25, 192, (5,))}


@pytest.mark.parametrize("case", list(CASES))
def test_every_difference_from_ar_is_a_proven_planted_tie(case):
    temperature, ties, tokens, seeds = CASES[case]
    engine = build(ties)
    assert tolerance(engine).tie == pytest.approx(0.45)  # 1.5 x the planted shift of 0.3
    ids = engine.prompt_tokens(**PROMPT.kwargs())
    found = {}
    for seed in seeds:
        s = sampling(temperature, seed)
        ar = generate(engine, ids, "ar", tokens, s)
        assert len(ar.out) == tokens
        for mode in ("sd", "ssd", "auto"):
            tally = Tally()
            # raises unless every difference is a proven tie
            compare_prompt(engine, PROMPT, mode, mode, ar, tally, tokens, max_ties=tokens)
            assert tally.compared >= 0.9 * tokens and tally.drafted > tally.accepted > 0, (mode, tally)
            found[mode, seed] = len(tally.ties)
    assert sum(found[mode, s] for mode, s in found if mode == "sd") >= 2, found  # the proof was exercised


def test_the_replay_reproduces_whole_runs_with_planted_ties():
    """Every token of ar and sd, sampled, is the draw from its own replayed row (so the proof cannot
    call a real difference a tie), and the two runs do part on a tie."""
    temperature, ties, tokens, (seed, *_) = CASES["T=1"]
    engine = build(ties)
    s = sampling(temperature, seed)
    ids = engine.prompt_tokens(**PROMPT.kwargs())
    ar, sd = (generate(engine, ids, mode, tokens, s) for mode in ("ar", "sd"))
    check_replay_reproduces(engine, ar)
    check_replay_reproduces(engine, sd)
    assert first_difference(ar, sd) is not None


class WrongBatches(PricedContext):
    """A planted bug: on a tenth of the positions a batch's row favours the third candidate by 2 logits
    over the favourite, far more than any tie; one-token rows are right."""

    def decode(self, tokens, positions, seqs, logits_for, copy=True):
        rows = super().decode(tokens, positions, seqs, logits_for, copy)
        if len(tokens) > 1:
            for j, i in enumerate(logits_for):
                if mix(positions[i]) % 10 == 0:
                    row = rows[j]
                    third = int(row.argsort()[-3])
                    row[third] = PEAK + 2.0
        return rows


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "T=1"])
def test_a_planted_difference_that_is_no_tie_fails_the_proof(temperature):
    engine = build(0.04, WrongBatches)
    s = sampling(temperature)
    ids = engine.prompt_tokens(**PROMPT.kwargs())
    ar = generate(engine, ids, "ar", 64, s)
    with pytest.raises(AssertionError, match="not lossless, not a near-tie"):
        compare_prompt(engine, PROMPT, "sd", "sd", ar, Tally(), 64)
