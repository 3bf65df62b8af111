"""Drafters: the n-gram lookup and the draft-probability helpers (pure, offline). The draft
model on real weights is in tests/real/test_drafters_real.py."""

from __future__ import annotations

import numpy as np
import pytest

from ssd_edge.config import SamplingConfig
from ssd_edge.sampling import HEAD, probs
from ssd_edge.speculation.drafters import (EMPTY, ModelDrafter, NgramDrafter, draft_probs, top_candidates,
                                          top_probability)

# ---------------------------------------------------------------- n-gram lookup


def test_ngram_match_proposes_what_followed():
    d = NgramDrafter(1, 4).propose([1, 2, 3, 4, 5, 1, 2, 3], 3)
    assert d.tokens == (4, 5, 1) and d.speculator == "ngram"


def test_ngram_no_match_proposes_nothing():
    d = NgramDrafter(1, 4).propose([1, 2, 3, 4, 5, 6], 4)
    assert d.tokens == () and len(d) == 0


def test_ngram_longest_match_wins():
    # the 1-gram [9] last occurred before 12, but the 3-gram [7, 8, 9] occurred before 10: the longer wins
    h = [7, 8, 9, 10, 11, 9, 12, 7, 8, 9]
    assert NgramDrafter(1, 4).propose(h, 3).tokens == (10, 11, 9)
    assert NgramDrafter(1, 1).propose(h, 3).tokens == (12, 7, 8)  # 1-grams only: the most recent


def test_ngram_most_recent_occurrence_wins():
    assert NgramDrafter(1, 4).propose([1, 2, 5, 1, 2, 6, 1, 2], 3).tokens == (6, 1, 2)


def test_ngram_min_is_respected():
    h = [4, 9, 5, 6, 9]  # only a 1-gram ([9]) matches
    assert NgramDrafter(1, 3).propose(h, 2).tokens == (5, 6)
    assert NgramDrafter(2, 3).propose(h, 2).tokens == ()


def _reference_ngram(h: list[int], k: int, lo: int, hi: int) -> tuple[int, ...]:
    """Prompt lookup written the plain way: the longest n-gram first, its most recent occurrence."""
    for n in range(min(hi, len(h) - 1), lo - 1, -1):
        tail = h[len(h) - n:]
        for i in range(len(h) - n - 1, -1, -1):  # occurrences ending before the history's last token
            if h[i:i + n] == tail:
                return tuple(h[i + n:i + n + k])
    return ()


@pytest.mark.parametrize("lo, hi", [(1, 4), (2, 4), (2, 2), (3, 6)])
def test_ngram_lookup_equals_the_plain_definition(lo, hi):
    rng = np.random.default_rng(lo * 10 + hi)
    for _ in range(400):
        h = [int(t) for t in rng.integers(0, int(rng.integers(2, 6)), size=int(rng.integers(0, 40)))]
        k = int(rng.integers(1, 5))
        assert NgramDrafter(lo, hi).propose(h, k).tokens == _reference_ngram(h, k, lo, hi), (h, k)


def test_ngram_match_length_runs_back_past_the_ngram():
    # the 2-gram [7, 8] matches; the passages before it agree over 5 tokens (3 4 5 7 8), not 6 (1 vs 2)
    quoted = [3, 4, 5, 7, 8]
    h = [1] + quoted + [6, 6, 2] + quoted
    d = NgramDrafter(2, 2).propose(h, 3)
    assert d.tokens == (6, 6, 2) and d.match == 5
    assert d.head(2).match == 5
    # a coincidence: only the 2-gram itself agrees
    assert NgramDrafter(2, 2).propose([1, 7, 8, 6, 2, 7, 8], 2).match == 2


def test_ngram_match_length_is_capped():
    from ssd_edge.speculation.drafters import MATCH_CAP
    h = list(range(100)) + [500] + list(range(100))  # a 100-token copy, then the history ends mid-copy
    d = NgramDrafter(2, 4).propose(h, 3)
    assert d.tokens == (500, 0, 1) and d.match == MATCH_CAP


def test_ngram_k_and_short_continuations():
    h = [1, 2, 3, 1, 2]
    assert NgramDrafter(1, 4).propose(h, 1).tokens == (3,)
    assert NgramDrafter(1, 4).propose(h, 10).tokens == (3, 1, 2)  # runs up to the end of the history
    assert NgramDrafter(1, 4).propose([5], 4).tokens == ()
    assert NgramDrafter(1, 4).propose([], 4).tokens == ()


def test_ngram_never_matches_the_tail_against_itself():
    # a run of one token: [7, 7, 7] - the tail [7, 7] matches at 0, proposing the token after it
    assert NgramDrafter(2, 2).propose([7, 7, 7], 2).tokens == (7,)


def test_empty_draft():
    assert len(EMPTY) == 0 and EMPTY.head(3) is EMPTY


# ---------------------------------------------------------------- draft-side probabilities


def test_top_candidates_sorted_with_the_heads_softmax_probabilities():
    """Candidates are the m likeliest, with probabilities normalised over the row's HEAD largest
    logits (sampling.head_probs), not the whole row: a planning estimate read in one pass."""
    rng = np.random.default_rng(0)
    z = rng.normal(0, 2, 100).astype(np.float32)
    for t in (1.0, 0.5):
        c = top_candidates(z, t, m=8)
        assert len(c.ids) == 8 and list(c.ids) == list(np.argsort(-z)[:8])
        head = np.sort(z)[::-1][:HEAD].astype(np.float64) / t
        p = np.exp(head - head.max())
        np.testing.assert_allclose(c.probs, p[:8] / p.sum(), rtol=1e-9)
    small = np.array([3.0, 1.0, 2.0], dtype=np.float32)  # fewer tokens than the head: all of them
    np.testing.assert_allclose(top_candidates(small, 1.0, m=8).probs, np.exp([3.0, 2.0, 1.0]) / np.exp([3.0, 2.0, 1.0]).sum())


def test_a_greedy_pick_from_the_rows_candidates_is_the_argmax_ties_to_the_lower_id():
    """ModelDrafter.pick(row, pos, cand) takes a greedy token from candidates already read instead of
    reading the row again: the same token as numpy's argmax, ties included; sampled, it draws from the
    row as without them."""
    from ssd_edge.llama.kvseq import KVSeq
    from fakes import FakeContext, FakeModel
    kv = KVSeq(FakeContext(FakeModel("draft")))
    rng = np.random.default_rng(7)
    greedy = ModelDrafter(kv, SamplingConfig(temperature=0.0), seed=3)
    sampled = ModelDrafter(kv, SamplingConfig(temperature=0.9), seed=3)
    for n in (64, 151_936):
        for _ in range(20):
            row = rng.normal(0, 2, n).astype(np.float32)
            row[rng.integers(0, n, 3)] = row.max()  # a three-way tie for the argmax
            cand = top_candidates(row, 1.0)
            assert greedy.pick(row, 9, cand) == greedy.pick(row, 9) == int(np.argmax(row))
            assert sampled.pick(row, 9, top_candidates(row, 0.9)) == sampled.pick(row, 9)


@pytest.mark.parametrize("s", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=20, top_p=0.9),
                               SamplingConfig(temperature=1.3, top_k=64, top_p=1.0, min_p=0.0)])
def test_a_sampled_steps_candidates_and_draw_come_from_one_pass_and_are_the_two_passes_answers(s):
    """ModelDrafter._candidates: sampled, one C pass over the row (native.head_draw) gives the step's
    candidates and its coupled draw: the same candidates as top_candidates and the same token as pick()
    reading the whole row, ties at the head's edge included; greedy, top-k off or a shaped row: the
    candidates alone (pick() draws)."""
    import native_build
    from ssd_edge.llama.kvseq import KVSeq
    from ssd_edge.speculation import drafters
    from fakes import FakeContext, FakeModel

    if drafters.compiled_head_draw is None:
        native_build.skip_or_fail("the one-pass draft step")
    kv = KVSeq(FakeContext(FakeModel("draft")))
    d = ModelDrafter(kv, s.model_copy(update={"seed": 5}), seed=5)
    rng, fused = np.random.default_rng(3), 0
    for i in range(200):
        row = (rng.standard_normal(151_936) * rng.uniform(0.5, 6.0)).astype(np.float32)
        if i % 4 == 0:  # a tie across the head's edge (where the C pass cannot decide: the two passes)
            row[rng.integers(0, len(row), 60)] = np.sort(row)[-30]
        cand, drawn = d._candidates(row, 100 + i)
        ref = top_candidates(row, d.cand_temperature())
        fused += drawn is not None
        assert drawn is None or drawn == d.pick(row, 100 + i, ref)
        np.testing.assert_array_equal(cand.ids, ref.ids)
        np.testing.assert_allclose(cand.probs, ref.probs, rtol=1e-12)
    assert fused >= 150
    for other in (s.model_copy(update={"temperature": 0.0}), s.model_copy(update={"top_k": 0})):
        assert ModelDrafter(kv, other, seed=5)._candidates(row, 7)[1] is None
    shaped = ModelDrafter(kv, s, seed=5, shape=lambda row, history, toks: None)
    assert shaped._candidates(row, 7)[1] is None
    small = row[:40].copy()  # a vocabulary no wider than the head: the two passes
    cand, drawn = d._candidates(small, 7)
    assert drawn is None and np.array_equal(cand.ids, top_candidates(small, d.cand_temperature()).ids)


def test_draft_probs_greedy_is_none_and_sampled_matches_target_transform():
    z = np.random.default_rng(1).normal(0, 2, 64)
    assert draft_probs(z, SamplingConfig(temperature=0.0)) is None
    s = SamplingConfig(temperature=0.8, top_k=10, top_p=0.9, min_p=0.05)
    ids, q = draft_probs(z, s)
    dense = np.zeros_like(z)
    dense[ids] = q
    np.testing.assert_array_equal(dense, probs(z, s))  # same transform as the target's p, on its support
    r_ids, r = draft_probs(z, s, saguaro_top=2, saguaro_factor=0.5)
    assert abs(r.sum() - 1) < 1e-12 and r_ids.tolist() == ids.tolist() and (r > 0).all()


def test_top_probability_is_the_likeliest_tokens_probability():
    assert top_probability(np.array([0.0, 0.0])) == pytest.approx(0.5)
    assert top_probability(np.array([10.0, 0.0, 0.0])) > 0.99


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("right", [0, 2, 5, 9])
def test_a_guessed_draft_is_the_same_draft_with_fewer_steps(temperature, right):
    """A guess (an n-gram copy read in the first batch) changes how many single steps a draft takes,
    never what it draws: with the first `right` guessed tokens as the draft draws them and the rest
    wrong, the draft is the unguessed one, the guess saves min(right, k - 1) steps, and the cache then
    holds what it would hold without a guess, so the next draft is unchanged too."""
    from fakes import FakeContext, FakeModel, V
    from ssd_edge.llama.kvseq import KVSeq
    from ssd_edge.speculation.drafters import ModelDrafter

    s, k = SamplingConfig(temperature=temperature), 6
    history = [5, 9, 2, 7, 7, 1]

    def drafter() -> ModelDrafter:
        return ModelDrafter(KVSeq(FakeContext(FakeModel("draft", disagree_every=4), n_seq_max=1)), s, 3,
                            candidates=False)

    plain = drafter()
    want = plain.propose(history, k)
    assert plain.timing[2] == k - 1  # unguessed: one single step per token after the first
    guess = list(want.tokens[:right]) + [(t % (V - 1)) + 1 for t in want.tokens[right:]]
    guessed = drafter()
    got = guessed.propose(history, k, guess=guess)
    assert got.tokens == want.tokens
    unread, _, steps, _ = guessed.timing
    assert steps == k - 1 - min(right, k - 1)
    assert unread == len(history) - 1 + k - 1  # the history and the guess (as far as a row after it is used)
    assert guessed.kv.ctx.seq_tokens(0) == list(guessed.kv.tokens)
    held = min(right, k - 1)  # the last token drawn is not decoded (as without a guess)
    assert list(guessed.kv.tokens[:len(history) + held]) == history + list(want.tokens[:held])
    more = history + list(want.tokens[:3]) + [11]
    assert guessed.propose(more, 4).tokens == plain.propose(more, 4).tokens


def test_a_guess_stops_where_go_on_stops():
    """The draft's length rule still decides each token before it is drawn: a guess past it is unused."""
    from fakes import FakeContext, FakeModel
    from ssd_edge.llama.kvseq import KVSeq
    from ssd_edge.speculation.drafters import ModelDrafter

    kv = KVSeq(FakeContext(FakeModel("draft"), n_seq_max=1))
    d = ModelDrafter(kv, SamplingConfig(temperature=0.0), 0, candidates=False)
    history = [4, 4, 8]
    want = ModelDrafter(KVSeq(FakeContext(FakeModel("draft"), n_seq_max=1)), SamplingConfig(temperature=0.0), 0,
                        candidates=False).propose(history, 8)
    got = d.propose(history, 8, go_on=lambda j, p: (j < 3, False), guess=want.tokens)
    assert got.tokens == want.tokens[:3]
    assert d.timing[2] == 0  # every row it used came with the guess


def _lookup_by_definition(h: list[int], k: int, lo: int, hi: int) -> tuple[tuple[int, ...], int]:
    """The n-gram lookup spelled out: the longest n (hi down to lo) whose last-n tokens occurred
    earlier, its latest earlier occurrence, what followed it, and how far back the two agree (<= 64)."""
    for n in range(min(hi, len(h) - 1), max(lo, 1) - 1, -1):
        for end in range(len(h) - 2, n - 2, -1):
            if h[end - n + 1:end + 1] == h[-n:]:
                start = end + 1
                match = n
                while match < min(64, start) and h[start - 1 - match] == h[-1 - match]:
                    match += 1
                return tuple(h[start:start + k]), match
    return (), 0


def test_ngram_index_answers_as_the_definition_as_history_grows_and_changes():
    # The drafter indexes the history it last saw and extends it when a round only appends tokens;
    # every answer must be the definition's, whether the history grew, restarted or was rewritten.
    rng = np.random.default_rng(3)
    for lo, hi in ((1, 4), (2, 3), (1, 1), (3, 5)):
        d = NgramDrafter(lo, hi)
        for _ in range(12):
            h = [int(t) for t in rng.integers(0, 5, size=int(rng.integers(0, 6)))]
            for _ in range(40):
                h = h + [int(t) for t in rng.integers(0, 5, size=int(rng.integers(1, 4)))]
                if rng.random() < 0.1:  # a rewritten tail (another generation on a shared prompt)
                    h = h[:len(h) // 2] + [int(rng.integers(0, 5))]
                k = int(rng.integers(1, 8))
                got = d.propose(h, k)
                want, match = _lookup_by_definition(h, k, lo, hi)
                assert got.tokens == want, (lo, hi, h, k)
                if want:
                    assert got.match == match, (lo, hi, h)
    # a tuple or an array is read as its list
    assert NgramDrafter(1, 4).propose(np.array([1, 2, 3, 1, 2]), 2).tokens == (3, 1)
