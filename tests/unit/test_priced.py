"""The priced backend (ssd_edge/bench/priced): its price tables, a decode that waits its price and says so on
DECODES, rows of the real vocabulary's width, a draft that agrees with the target at the chosen rate with
rows identical where it agrees, and the KV semantics of llama.cpp's unified cache (a wrong rollback gives
wrong rows, an abort leaves the cache as it was)."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from native_build import skip_or_fail
from ssd_edge.errors import ConfigError, ContextFullError
from ssd_edge.interface import DECODES, Aborted, AbortSignal, BackendContext, BackendModel
from ssd_edge.bench.priced import Priced, PricedContext, PricedModel, TABLES
from ssd_edge.bench.priced.backend import EOG, N_VOCAB, PEAK, TIE_GAP, WORD0, choices

T15 = TABLES["h200-1.5b"]
SLACK_S = 0.030  # a loaded 2-core machine may wake a waiter late; never early


def pair(agreement: float = 0.95, table: str = "h200-1.5b", n_seq_max: int = 1):
    target, draft = Priced(table, agreement).models()
    return PricedContext(target, n_seq_max=n_seq_max), PricedContext(draft, n_seq_max=n_seq_max)


def feed(ctx: PricedContext, tokens: list[int], start: int = 0, seq: int = 0) -> np.ndarray:
    """Decode tokens at start.. of `seq`, every row wanted."""
    n = len(tokens)
    return ctx.decode(tokens, range(start, start + n), [seq] * n, list(range(n)))


def words(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(WORD0, WORD0 + 150_000) for _ in range(n)]


# ---------------------------------------------------------------- prices

def test_prices_are_the_table_interpolated_between_its_sizes_and_extrapolated_past_them():
    t = T15.target
    assert t.ms(1) == 1.70 and t.ms(2) == 3.42 and t.ms(8) == 3.96 and t.ms(12) == 5.67 and t.ms(32) == 7.76
    assert t.ms(9) == pytest.approx(3.96 + (5.67 - 3.96) / 4)           # a verify of 8
    assert t.ms(5) == pytest.approx((3.39 + 3.74) / 2)
    assert all(t.ms(n) <= t.ms(n + 1) for n in range(8, 16))            # monotone between neighbours
    assert t.ms(40) == pytest.approx(7.76 + 8 * (7.76 - 6.00) / 16)     # a prompt: the 16..32 slope
    d = T15.draft
    assert d.ms(1) == 0.25 and d.ms(4) == 0.39 and d.ms(2) == pytest.approx(0.38 + 0.01 / 3)
    assert TABLES["h200-7b"].target.ms(1) == 3.38 and TABLES["h200-7b"].draft is d


def test_a_decode_waits_its_price_and_puts_it_on_the_decode_clock():
    target, _ = pair()
    seconds0, rows0 = DECODES.read()
    walls = []
    for n, start in ((9, 0), (1, 9), (1, 10)):  # a verify of 8, then two plain steps
        price = T15.target.ms(n) / 1e3
        t0 = time.perf_counter()
        rows = feed(target, words(n, start), start)
        walls.append(time.perf_counter() - t0)
        assert rows.shape == (n, N_VOCAB)
        assert price / 2 <= walls[-1] < price + SLACK_S, (n, walls[-1], price)
    seconds, rows = DECODES.read()  # what each decode took, as measured inside it
    assert sum(walls) - 2e-3 < seconds - seconds0 <= sum(walls)
    assert rows - rows0 == 11


@pytest.mark.parametrize("spin", [True, False])
def test_decodes_take_their_price_on_average(spin, monkeypatch):
    """Spinning (the compiled wait, the GIL released) or sleeping (without it: aimed early by the waits'
    lateness), a decode takes its price, not price + a wake-up."""
    import ssd_edge.bench.priced.backend as backend

    if spin and backend.spin is None:
        skip_or_fail("the compiled wait")
    if not spin:
        monkeypatch.setattr(backend, "spin", None)
    target, _ = pair()
    price = T15.target.ms(1) / 1e3
    feed(target, words(8, 0), 0)
    walls = []
    for i in range(40):
        t0 = time.perf_counter()
        feed(target, words(1, 8 + i), 8 + i)
        walls.append(time.perf_counter() - t0)
    late = sorted(walls[20:])[10] - price  # the median of the last 20, once the aim has settled
    assert -1e-4 < late < SLACK_S, late


def test_rows_are_float32_the_vocabulary_wide_and_peaked_at_a_word():
    target, _ = pair()
    rows = feed(target, words(20))
    assert rows.dtype == np.float32 and rows.shape == (20, N_VOCAB)
    fav = rows.argmax(axis=1)
    assert (rows[np.arange(20), fav] == PEAK).all()
    assert not any(int(t) in EOG for t in fav)
    # at T=1 the favourite has ~0.9, over the top 40 or the whole vocabulary: sampled, not one-hot
    for top in (np.sort(rows, axis=1)[:, -40:].astype(np.float64), rows.astype(np.float64)):
        p = np.exp(top - top.max(axis=1, keepdims=True))
        p_fav = p.max(axis=1) / p.sum(axis=1)
        assert (0.88 < p_fav).all() and (p_fav < 0.93).all(), p_fav


@pytest.mark.parametrize("agreement", [0.95, 0.6])
def test_the_draft_agrees_with_the_target_at_its_rate(agreement):
    rng = random.Random(1)
    n = 20_000
    agree = sum(choices(tail, pos, agreement)[1] == choices(tail, pos, None)[1]
                for tail, pos in (((rng.randrange(N_VOCAB), rng.randrange(N_VOCAB), rng.randrange(N_VOCAB)),
                                   rng.randrange(4096)) for _ in range(n)))
    sd = (agreement * (1 - agreement) / n) ** 0.5
    assert abs(agree / n - agreement) < 5 * sd, agree / n


def test_planted_ties_rank_two_candidates_one_way_alone_and_the_other_way_in_a_batch():
    """PricedModel(ties=f): on about f of the contexts the target's runner-up sits TIE_GAP below its
    favourite in a one-token decode's row and TIE_GAP above it in a batch's; every other row, and every
    row without ties, is the same however it was decoded."""
    tokens = words(400, seed=4)
    for ties in (0.0, 0.25):
        target = PricedModel(T15, "target", ties=ties)
        assert target.batch_shift == 2 * TIE_GAP * (ties > 0)
        alone, batched = PricedContext(target), PricedContext(target)
        one = np.stack([feed(alone, [t], i)[0] for i, t in enumerate(tokens)])
        many = np.concatenate([feed(batched, tokens[i:i + 8], i) for i in range(0, len(tokens), 8)])
        differ = np.flatnonzero((one != many).any(axis=1))
        assert len(differ) == pytest.approx(ties * len(tokens), abs=4 * (ties * len(tokens)) ** 0.5 + 1e-9)
        for i in differ:
            a, b = np.argsort(one[i])[-2:][::-1]  # the favourite, then the tied runner-up
            assert one[i][a] == PEAK and one[i][b] == PEAK - TIE_GAP
            assert many[i][b] == PEAK + TIE_GAP and many[i][a] == PEAK and many[i].argmax() == b
            assert np.flatnonzero(one[i] != many[i]).tolist() == [b]
    with pytest.raises(ValueError, match="ties"):
        PricedModel(T15, "target", ties=1.5)


def test_target_and_draft_rows_are_identical_where_they_agree_and_differ_where_not():
    target, draft = pair(0.7)
    tokens = words(240, seed=2)
    same = differ = 0
    for start in range(0, len(tokens), 24):
        t = feed(target, tokens[start:start + 24], start)
        d = feed(draft, tokens[start:start + 24], start)
        for tr, dr in zip(t, d):
            if tr.argmax() == dr.argmax():
                assert np.array_equal(tr, dr)
                same += 1
            else:
                assert not np.array_equal(tr, dr)
                differ += 1
    assert 0.55 < same / (same + differ) < 0.85  # 0.7, loosely: 240 contexts


def test_the_rows_depend_on_the_sequence_stored_so_a_wrong_rollback_gives_wrong_rows():
    ctx, _ = pair()
    t, u = words(10, seed=3), words(10, seed=4)
    fresh = feed(PricedContext(ctx.model), t[:5] + u[5:])
    feed(ctx, t)
    ctx.seq_rm(0, 5)                                          # the right rollback
    assert ctx.seq_pos_max(0) == 4 and len(ctx.cells) == 5
    assert np.array_equal(feed(ctx, u[5:], 5), fresh[5:])
    wrong = PricedContext(ctx.model)
    feed(wrong, t)
    wrong.seq_rm(0, 6)                                        # a rollback one short: t5 stays where u5 belongs
    rows = feed(wrong, u[6:], 6)
    assert not np.array_equal(rows[0], fresh[6]) and not np.array_equal(rows[1], fresh[7])  # t5 in their 3
    assert np.array_equal(rows[2:], fresh[8:])                # past the 3 tokens the next one depends on
    with pytest.raises(AssertionError, match="batch starts at 5"):
        feed(wrong, u[5:], 5)                                 # llama.cpp's rule: the last position + 1


def test_branches_share_cells_in_the_unified_cache():
    ctx, _ = pair(n_seq_max=3)
    t = words(8, seed=5)
    feed(ctx, t[:6])
    ctx.seq_cp(0, 1)
    ctx.seq_cp(0, 2)
    assert ctx.seq_pos_max(1) == ctx.seq_pos_max(2) == 5 and len(ctx.cells) == 6  # metadata only
    rows = ctx.decode([t[6], t[7]], [6, 6], [1, 2], [0, 1])  # one batch grows both branches
    solo = PricedContext(ctx.model)
    assert np.array_equal(rows[0], feed(solo, t[:7])[6])
    solo.seq_rm(0, 6)
    assert np.array_equal(rows[1], feed(solo, [t[7]], 6)[0])
    ctx.seq_rm(1)
    ctx.seq_rm(2)
    assert len(ctx.cells) == 6 and ctx.cells_outside(0) == 0  # the branches' own cells freed
    with pytest.raises(AssertionError, match="out of range"):
        ctx.decode([1], [6], [3], [0])


def test_the_cell_table_keeps_what_a_cell_by_cell_model_of_the_cache_keeps():
    """cells.CellCache's arrays against the plainest model of llama.cpp's unified cache (a set of cells,
    each a position, a token and the sequences holding it), over random stores, copies and removals,
    aborted batches and clears: the same tokens per sequence, last positions, cells in use."""
    from ssd_edge.bench.priced.cells import CellCache

    rng = random.Random(11)
    n_ctx, n_seq = 48, 4
    cache, model = CellCache(n_ctx, n_seq), []  # model: [pos, token, {seqs}] per cell in use

    def held(seq):
        return {c[0]: c[1] for c in model if seq in c[2]}

    for step in range(3000):
        seq = rng.randrange(n_seq)
        top = max(held(seq), default=-1)
        op = rng.random()
        if op < 0.45:  # a batch on one or two sequences, each from its last position + 1
            seqs = rng.sample(range(n_seq), rng.choice((1, 2)))
            batch = [(top2 + 1 + i, rng.randrange(1000), s) for s in seqs
                     for top2 in [max(held(s), default=-1)] for i in range(rng.randrange(1, 4))]
            if len(model) + len(batch) > n_ctx or max(p for p, _, _ in batch) >= n_ctx:
                with pytest.raises(ContextFullError):
                    cache.store([t for _, t, _ in batch], [p for p, _, _ in batch], [s for _, _, s in batch])
                continue
            cells = cache.store([t for _, t, _ in batch], [p for p, _, _ in batch], [s for _, _, s in batch])
            if rng.random() < 0.2:
                cache.unstore(cells)  # an aborted decode
            else:
                model += [[p, t, {s}] for p, t, s in batch]
        elif op < 0.7:
            dst = rng.randrange(n_seq)
            p0, p1 = rng.randrange(0, 8), rng.choice((-1, rng.randrange(0, n_ctx)))
            span = [c for c in model if seq in c[2] and c[0] >= p0 and (p1 < 0 or c[0] < p1)]
            theirs = held(dst)
            if dst == seq or all(c[0] not in theirs for c in span):
                cache.seq_cp(seq, dst, p0, p1)
                for c in span:
                    c[2].add(dst)
        elif op < 0.98:
            p0, p1 = rng.randrange(0, max(top, 0) + 2), rng.choice((-1, rng.randrange(0, n_ctx)))
            cache.seq_rm(seq, p0, p1)
            for c in model:
                if seq in c[2] and c[0] >= p0 and (p1 < 0 or c[0] < p1):
                    c[2].discard(seq)
            model = [c for c in model if c[2]]
        else:
            cache.clear()
            model = []
        for s in range(n_seq):
            mine = held(s)
            assert cache.seq_pos_max(s) == max(mine, default=-1), step
            if mine and sorted(mine) == list(range(len(mine))):
                assert cache.seq_tokens(s) == [mine[p] for p in range(len(mine))], step
            assert cache.cells_outside(s) == sum(1 for c in model if s not in c[2]), step
        assert sorted((c.pos, c.token, tuple(sorted(c.seqs))) for c in cache.cells) == \
            sorted((c[0], c[1], tuple(sorted(c[2]))) for c in model), step


def test_an_abort_cuts_the_wait_short_and_leaves_the_cache_as_it_was():
    ctx, _ = pair()
    feed(ctx, words(4))
    prompt = words(400, seed=6)  # priced by the 16..32 slope: ~49 ms
    assert ctx.model.price_s(400) > 0.045
    timer = threading.Timer(0.005, ctx.abort.set)
    timer.start()
    t0 = time.perf_counter()
    with pytest.raises(Aborted):
        ctx.decode(prompt, range(4, 404), [0] * 400, [399])
    assert time.perf_counter() - t0 < 0.040
    assert ctx.seq_pos_max(0) == 3 and len(ctx.cells) == 4
    with pytest.raises(Aborted):  # set: the next decode stops too, until cleared
        feed(ctx, [5], 4)
    ctx.abort.clear()
    assert feed(ctx, [5], 4).shape == (1, N_VOCAB)


def test_the_vocabulary_reads_and_the_chat_markers_are_special():
    model = PricedModel(T15, "target")
    chat = model.render_chat([{"role": "user", "content": "Hi there!"}])
    assert chat == "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n"
    ids = model.tokenize(chat, parse_special=True)
    assert ids[0] == ids[-3] == 151_644 and ids.count(151_645) == 1 and model.is_eog(151_645)
    assert model.tokenize(chat, parse_special=True) == ids and 151_644 not in model.tokenize(chat)
    assert len(model.tokenize("def fib(n): return n")) == 7  # words and punctuation, not bytes
    assert model.piece(ord("x")) == b"x" and model.piece(151_645) == b""
    word = model.piece(WORD0 + 12_345)
    assert word.startswith(b" ") and word[1:].isalpha() and word != model.piece(WORD0 + 12_346)
    assert model.n_vocab == N_VOCAB == 151_936 and model.info().description.startswith("priced: H200 table")


def test_the_priced_backend_implements_the_protocol():
    ctx, _ = pair()
    assert isinstance(ctx.model, BackendModel) and isinstance(ctx, BackendContext)
    assert isinstance(ctx.abort, AbortSignal)


def test_from_ssd_edge_import_priced_is_the_benchs_priced_pair():
    """The documented `from ssd_edge import priced` reaches ssd_edge/bench/priced itself (a re-export, no copy)."""
    import ssd_edge
    import ssd_edge.bench.priced as bench_priced
    from ssd_edge import priced

    assert priced is bench_priced and priced.Priced is Priced and priced.engine is bench_priced.engine
    with pytest.raises(AttributeError, match="no attribute 'pricing'"):
        ssd_edge.pricing  # noqa: B018 (only the names it re-exports)


def test_a_priced_pair_is_named_by_its_table_and_the_drafts_agreement():
    assert Priced.parse("h200-7b@0.8") == Priced("h200-7b", 0.8)
    assert Priced.parse("h200-1.5b", 0.9).agreement == 0.9 and Priced.parse("h200-1.5b").agreement == 0.95
    assert Priced.parse("h200-1.5b").label.startswith("priced: H200 table h200-1.5b, draft agreement 0.95, draft on "
                                                      "a device of its own, branch heads ")
    for bad, match in (("a100", "no price table"), ("h200-1.5b@x", "must be a number"),
                       ("h200-1.5b@1.5", "between 0 and 1")):
        with pytest.raises(ConfigError, match=match):
            Priced.parse(bad)
    with pytest.raises(ConfigError, match="already gives"):
        Priced.parse("h200-1.5b@0.9", 0.8)


def test_the_compiled_spin_waits_its_time_and_lets_other_threads_run():
    import threading

    from ssd_edge.bench.priced.backend import spin

    if spin is None:
        skip_or_fail("the compiled wait")
    counted, stop = [0], threading.Event()

    def count():
        while not stop.is_set():
            counted[0] += 1

    t = threading.Thread(target=count)
    t.start()
    t0 = time.perf_counter()
    spin(0.05)
    took = time.perf_counter() - t0
    before = counted[0]
    stop.set()
    t.join()
    assert 0.05 <= took < 0.05 + SLACK_S and before > 1000  # Python ran beside the spin


def test_spin_stops_when_its_flag_is_set():
    from ssd_edge.bench.priced.backend import SpinFlag, spin

    if spin is None:
        skip_or_fail("the compiled wait")
    flag = SpinFlag()
    assert spin(0.002, flag.address) is True
    timer = threading.Timer(0.005, flag.set)
    timer.start()
    t0 = time.perf_counter()
    assert spin(1.0, flag.address) is False  # cut short by the flag, the interpreter's lock never taken
    assert time.perf_counter() - t0 < 0.5
    assert flag.is_set()
    flag.clear()
    assert not flag.is_set() and spin(0.001, flag.address) is True


@pytest.mark.parametrize("batched", [False, True])
def test_heads_are_the_heads_of_the_rows_a_decode_would_build(batched):
    """decode_heads hands over what the whole rows' heads would be (sampling.heads_of), ties and a
    planted token that is also in its noise row's head included; the C picks are the Python ones."""
    from ssd_edge.bench.priced.backend import heads_for, noise_heads, rows_for
    from ssd_edge.sampling import heads_of

    rng = random.Random(4)
    picks = [choices(words(3, seed=i), rng.randrange(1000), 0.8 if i % 2 else None, ties=0.3) for i in range(60)]
    ids, _, _ = noise_heads(44)
    r = picks[0]
    picks.append((r[0], int(ids[r[0], 5]), r[2], r[3], r[4]))  # the favourite sits in the noise's head too
    got, want = heads_for(picks, 41, batched), heads_of(rows_for(picks, batched=batched), 41)
    assert (got.ids == want.ids).all() and (got.logits == want.logits).all()


@pytest.mark.parametrize("agreement,ties", [(None, 0.0), (None, 0.3), (0.95, 0.0), (0.5, 0.3), (0.0, 0.0)])
def test_a_decodes_picks_are_the_reference_choices(agreement, ties):
    """PricedContext._choices (in C where built) gives choices() after each sequence's stored tail."""
    target, draft = Priced("h200-1.5b", 0.5 if agreement is None else agreement, ties).models()
    ctx = PricedContext(target if agreement is None else draft, n_seq_max=2)
    tokens = words(300, seed=9)
    feed(ctx, tokens)
    ctx.seq_cp(0, 1, 0, 120)
    positions = [0, 1, 2, 3, 57, 119, 200, 299]
    seqs = [0, 0, 1, 1, 1, 1, 0, 0]
    want = [list(choices(ctx.tail(s, p, 3), p, ctx.model.agreement, ties)) for s, p in zip(seqs, positions)]
    assert ctx._choices(seqs, positions) == want


def test_decode_heads_waits_its_price_and_the_rows_heads():
    """A branch step handing over heads: the same cells stored as decode()'s, the heads of its rows, priced
    at the decode plus the stated head cost."""
    from ssd_edge.bench.priced.prices import HEAD_DECODE_MS, HEAD_ROW_MS
    from ssd_edge.sampling import heads_of

    _, ctx = pair(n_seq_max=4)
    _, twin = pair(n_seq_max=4)
    for c in (ctx, twin):
        feed(c, words(20))
        for s in (1, 2, 3):
            c.seq_cp(0, s, 0, 20)
    toks, pos, seqs = words(3, seed=2), [20, 20, 20], [1, 2, 3]
    t0 = time.perf_counter()
    heads = ctx.decode_heads(toks, pos, seqs, range(3), 41)
    took = time.perf_counter() - t0
    rows = twin.decode(toks, pos, seqs, range(3))
    want = heads_of(rows, 41)
    assert (heads.ids == want.ids).all() and (heads.logits == want.logits).all()
    assert took >= ctx.model.price_s(3) + (HEAD_DECODE_MS + 3 * HEAD_ROW_MS) / 1e3
    assert [ctx.seq_pos_max(s) for s in (1, 2, 3)] == [20, 20, 20]
