"""--cache-reuse: llama-server's walk over the cache (kvseq.reuse_plan), the cell table's seq_add (the fake's
and the priced backend's KV cache), and KVSeq.feed moving chunks on the fake context, whose logits are read
from the tokens each position holds: after the moves the cache must hold exactly the new sequence, position
by position, and its rows must be a cold read's. On a real model a moved chunk is an approximation (its keys
were computed beside text that is gone); the fake cannot show that, only that the bookkeeping is right."""

from __future__ import annotations

import numpy as np
import pytest

from fakes import FakeContext, FakeModel
from ssd_edge.bench.priced.cells import CellCache
from ssd_edge.llama.kvseq import KVSeq, Move, reuse_plan


def test_the_plan_moves_the_runs_that_are_long_enough():
    cached = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    # lines dropped at the top: 3..10 is one run, moved two to the left
    assert reuse_plan(cached, [1, 3, 4, 5, 6, 7, 8, 9, 10, 11], 1, 9, 4) == ([Move(2, 1, 8)], 9)
    # the walk skips cache tokens, never prompt tokens: 4, 5 then 7 in the prompt match no run of 3 at its
    # head, so nothing moves
    assert reuse_plan(cached, [1, 4, 5, 7, 8, 9, 10, 0], 1, 7, 3) == ([], 1)
    moves, held = reuse_plan(cached, [1, 4, 5, 6, 7, 8, 9, 10, 0], 1, 8, 3)
    assert moves == [Move(3, 1, 7)] and held == 8
    assert reuse_plan(cached, [1, 2, 3], 3, 2, 1) == ([], 3)  # nothing past the common prefix


def test_seq_add_moves_cells_and_keeps_the_table_whole():
    cache = CellCache(16, 2)
    cache.store([10, 11, 12, 13, 14], range(5), [0] * 5)
    cache.seq_cp(0, 1, 0, 5)
    cache.seq_rm(0, 1, 3)            # positions 1, 2 gone from seq 0 (seq 1 still holds them)
    with pytest.raises(AssertionError):
        cache.seq_add(0, 3, 5, -2)   # seq 1 holds positions 1, 2: the moved cells would land on its own
    cache.seq_rm(1, 0, -1)
    cache.seq_add(0, 3, 5, -2)
    assert cache.seq_tokens(0) == [10, 13, 14] and cache.seq_pos_max(0) == 2
    cache.store([15], [3], [0])      # the next position is free again
    assert cache.seq_tokens(0) == [10, 13, 14, 15]


def test_feed_moves_chunks_and_reads_only_the_rest():
    model = FakeModel()
    ctx = FakeContext(model, n_ctx=256, n_batch=64)
    kv = KVSeq(ctx)
    kv.reuse = 8
    first = list(range(1, 31)) * 2               # 60 tokens
    kv.feed(first)
    decodes = ctx.decodes
    second = [first[0]] + first[5:] + [7, 7, 7]  # tokens 1..4 dropped after the first, three new at the end
    assert kv.held_for(second) == 1 + 55
    rows = kv.feed(second, 1)
    assert list(kv.tokens) == second and ctx.seq_tokens(0) == second  # the invariant, position by position
    assert ctx.decodes == decodes + 1 and ctx.batch_sizes[-1] == 3     # only the three new tokens read
    cold = FakeContext(model, n_ctx=256, n_batch=64)
    np.testing.assert_array_equal(rows, KVSeq(cold).feed(second, 1))


def test_feed_without_reuse_reads_everything_after_the_common_prefix():
    model = FakeModel()
    ctx = FakeContext(model, n_ctx=256, n_batch=64)
    kv = KVSeq(ctx)
    first = list(range(1, 31)) * 2
    kv.feed(first)
    second = [first[0]] + first[5:] + [7, 7, 7]
    assert kv.held_for(second) == 1
    kv.feed(second, 1)
    assert ctx.seq_tokens(0) == second and sum(ctx.batch_sizes[-1:]) == len(second) - 1
