"""The draft-model drafter on real weights (the small pair's draft)."""

from __future__ import annotations

import numpy as np
import pytest

from ssd_edge.config import SamplingConfig

# ---------------------------------------------------------------- the draft model (real)


@pytest.fixture(scope="module")
def draft_model(small_pair):
    from ssd_edge.llama.backend import Model

    model = Model(small_pair[1])
    yield model
    model.close()


def greedy_reference(model, history: list[int], k: int) -> list[int]:
    """k greedy tokens from a fresh context, one decode per token."""
    from ssd_edge.llama.backend import Context

    ctx = Context(model, 512, 512, 1)
    try:
        row = ctx.decode(history, range(len(history)), [0] * len(history), [len(history) - 1])[0]
        out = []
        for i in range(k):
            t = int(np.argmax(row))
            out.append(t)
            row = ctx.decode([t], [len(history) + i], [0], [0])[0]
        return out
    finally:
        ctx.close()


@pytest.mark.real
def test_model_drafter_greedy_matches_plain_decoding_and_rolls_back(draft_model):
    from ssd_edge.llama.backend import Context
    from ssd_edge.llama.kvseq import KVSeq
    from ssd_edge.speculation.drafters import ModelDrafter

    history = draft_model.tokenize("The capital of France is Paris. The capital of Italy is")
    ctx = Context(draft_model, 512, 512, 1)
    try:
        drafter = ModelDrafter(KVSeq(ctx), SamplingConfig(temperature=0.0), 0)
        d = drafter.propose(history, 5)
        assert list(d.tokens) == greedy_reference(draft_model, history, 5)
        assert d.speculator == "draft" and len(d.cands) == 5
        assert all(int(c.ids[0]) == t for c, t in zip(d.cands, d.tokens))  # greedy: the top candidate
        # the target accepted two tokens and emitted another: the drafter rolls back and continues
        other = next(t for t in range(100, 200) if t != d.tokens[2])
        h2 = history + list(d.tokens[:2]) + [other]
        d2 = drafter.propose(h2, 4)
        assert list(d2.tokens) == greedy_reference(draft_model, h2, 4)
        assert drafter.kv.tokens[: len(h2)] == h2
    finally:
        ctx.close()


@pytest.mark.real
def test_model_drafter_sampled_draws_and_p_min(draft_model):
    from ssd_edge.coupling import gumbel_draw
    from ssd_edge.llama.backend import Context
    from ssd_edge.llama.kvseq import KVSeq
    from ssd_edge.speculation.drafters import ModelDrafter, draft_probs

    history = draft_model.tokenize("Once upon a time, in a small village, there lived a")
    s = SamplingConfig(temperature=1.0, top_k=40, top_p=0.95, min_p=0.05)
    ctx = Context(draft_model, 512, 512, 1)
    try:
        drafter = ModelDrafter(KVSeq(ctx), s, 7)
        d = drafter.propose(history, 4)
        assert len(d) == 4
        # each token is the coupled draw of (seed 7, its position) from the draft's row there
        fresh = Context(draft_model, 512, 512, 1)
        try:
            full = history + list(d.tokens)
            n = len(history)
            logits = fresh.decode(full[:-1], range(len(full) - 1), [0] * (len(full) - 1), list(range(n - 1, len(full) - 1)))
        finally:
            fresh.close()
        for i, t in enumerate(d.tokens):
            assert t == gumbel_draw(*draft_probs(logits[i], s), 7, n + i)
        # the same seed drafts the same tokens again (after a rollback), another seed mostly not
        assert drafter.propose(history, 4).tokens == d.tokens
        # an impossible confidence floor drafts nothing; the engine then verifies no draft
        strict = ModelDrafter(KVSeq(Context(draft_model, 512, 512, 1)), s, 0, p_min=0.999)
        assert len(strict.propose(history, 4)) == 0
        strict.ctx.close()
    finally:
        ctx.close()


@pytest.mark.real
def test_model_drafter_asks_go_on_before_each_token_with_the_top_probability(draft_model):
    """The planned length rule (Planner.go_on) is asked before token j is drawn, with the draft's
    probability of its likeliest token at j: a draft it stops is the head of the one it lets run."""
    from ssd_edge.llama.backend import Context
    from ssd_edge.llama.kvseq import KVSeq
    from ssd_edge.speculation.drafters import ModelDrafter

    history = draft_model.tokenize("def add(a, b):\n    return")
    ctx = Context(draft_model, 512, 512, 1)
    try:
        drafter = ModelDrafter(KVSeq(ctx), SamplingConfig(temperature=0.0), 0)
        asked: list[tuple[int, float]] = []
        full = drafter.propose(history, 6, go_on=lambda j, p: asked.append((j, p)) or (True, True))
        assert [j for j, _ in asked] == list(range(6))
        assert [p for _, p in asked] == pytest.approx([float(c.probs[0]) for c in full.cands])
        cut = drafter.propose(history, 6, go_on=lambda j, p: (j < 2, True))
        assert cut.tokens == full.tokens[:2] and len(cut.cands) == 2
        stopped = drafter.propose(history, 6, go_on=lambda j, p: (True, j < 2))  # no step after token 2
        assert stopped.tokens == full.tokens[:3]
    finally:
        ctx.close()


@pytest.mark.real
def test_a_guessed_draft_is_the_plain_draft_with_fewer_steps(draft_model):
    """A guess (an n-gram copy) read in the first batch: the rows it brings are the rows single steps
    would compute (up to a batch's rounding: the same tokens here), and each guessed token the draft
    draws saves a step; from a wrong guess on, it steps as without one."""
    from ssd_edge.llama.backend import Context
    from ssd_edge.llama.kvseq import KVSeq
    from ssd_edge.speculation.drafters import ModelDrafter

    history = draft_model.tokenize("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return")
    want = greedy_reference(draft_model, history, 6)
    ctx = Context(draft_model, 512, 512, 1)
    try:
        drafter = ModelDrafter(KVSeq(ctx), SamplingConfig(temperature=0.0), 0, candidates=False)
        guess = want[:3] + [next(t for t in range(100, 200) if t != want[3])] + want[4:]
        d = drafter.propose(history, 6, guess=guess)
        assert list(d.tokens) == want
        assert drafter.timing[2] == 2  # rows for tokens 1-3 came with the guess; tokens 4 and 5 took steps
        assert list(drafter.kv.tokens) == history + want[:5]
    finally:
        ctx.close()
