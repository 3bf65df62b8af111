"""KVSeq keeps its invariant through each of its operations: `tokens` is exactly what its
sequence of the (fake) context stores, position by position, and nothing else edits it."""

from __future__ import annotations

import numpy as np
import pytest

from fakes import FakeContext, FakeModel, lm_logits
from ssd_edge.errors import ContextFullError
from ssd_edge.llama.kvseq import Cancelled, KVSeq


def holds(kv: KVSeq) -> bool:
    return kv.ctx.seq_tokens(kv.seq) == list(kv.tokens)


def test_feed_keeps_the_cached_prefix_and_rolls_back_the_rest():
    ctx = FakeContext(FakeModel(), n_seq_max=2)
    kv = KVSeq(ctx)
    rows = kv.feed([5, 6, 7, 8], rows=2)
    assert rows.shape == (2, 32) and holds(kv)
    np.testing.assert_array_equal(rows[-1], lm_logits([5, 6, 7, 8]))
    decodes = ctx.decodes
    kv.feed([5, 6, 9])  # a rejected tail (7, 8) rolled back, 9 decoded
    assert list(kv.tokens) == [5, 6, 9] and holds(kv) and ctx.decodes == decodes + 1
    kv.truncate(1)
    assert list(kv.tokens) == [5] and holds(kv)


def test_feed_cancelled_between_chunks_says_what_it_holds():
    kv = KVSeq(FakeContext(FakeModel(), n_batch=4))
    with pytest.raises(Cancelled):
        kv.feed(list(range(1, 11)), cancelled=lambda: True, chunk=4)
    assert list(kv.tokens) == [1, 2, 3, 4] and holds(kv)
    with pytest.raises(ContextFullError):
        kv.feed([1] * 1000)


def test_step_decodes_one_token_at_the_next_position():
    kv = KVSeq(FakeContext(FakeModel()))
    kv.feed([3, 4])
    row = kv.step(11)
    np.testing.assert_array_equal(row, lm_logits([3, 4, 11]))
    assert list(kv.tokens) == [3, 4, 11] and holds(kv)


def test_adopt_takes_over_a_branch_and_frees_the_old_sequence():
    ctx = FakeContext(FakeModel(), n_seq_max=3)
    kv = KVSeq(ctx, 0)
    kv.feed([1, 2, 3])
    ctx.seq_cp(0, 2, 0, 2)             # a branch shares [1, 2], then decodes its own token
    ctx.decode([9], [2], [2], [])
    freed = kv.adopt(2, [1, 2, 9])
    assert freed == 0 and ctx.seq_tokens(0) == [] and kv.seq == 2
    assert list(kv.tokens) == [1, 2, 9] and holds(kv)
    kv.step(4)
    assert holds(kv)


def test_move_to_carries_cells_and_tokens_and_drops_what_the_target_held():
    ctx = FakeContext(FakeModel(), n_seq_max=3)
    KVSeq(ctx, 0).feed([7, 7])          # stale cells in sequence 0
    kv = KVSeq(ctx, 1)
    kv.feed([1, 2, 3])
    kv.move_to(0)
    assert kv.seq == 0 and holds(kv) and ctx.seq_tokens(1) == [] and len(ctx.cells) == 3
    kv.move_to(0)  # already there: nothing moves
    assert holds(kv) and len(ctx.cells) == 3


def test_common_prefix_finds_the_first_difference_in_lists_and_other_sequences():
    import random

    from ssd_edge.llama.kvseq import common_prefix

    def walked(a, b):
        i = 0
        while i < min(len(a), len(b)) and a[i] == b[i]:
            i += 1
        return i

    rng = random.Random(0)
    for _ in range(2000):
        a = [rng.randint(0, 3) for _ in range(rng.randint(0, 60))]
        b = a[:rng.randint(0, len(a))] + [rng.randint(0, 3) for _ in range(rng.randint(0, 10))]
        assert common_prefix(a, b) == common_prefix(b, a) == common_prefix(tuple(a), b) == walked(a, b)
