"""native.steps, the C loop of plain decoding steps (mode ar after the prompt), against llama.cpp's three
functions played by ctypes callbacks: a decode that records the batch it was handed and makes a scripted
row the output, the output's address, and an end-of-generation test. Then KVSeq.steps's bookkeeping
over a context that has such a loop. The same tokens as the engine's rounds on a real model:
tests/real/test_engine_real.py."""

from __future__ import annotations

import ctypes
import time

import numpy as np
import pytest

from native_build import skip_or_fail
from ssd_edge.coupling import Drawer
from ssd_edge.config import SamplingConfig
from ssd_edge.llama.context import StepsCall
from ssd_edge.llama.kvseq import KVSeq

try:
    from ssd_edge import native
    from ssd_edge.native import argmax, draw, steps
except ImportError:  # each test then skips, or fails where a C compiler could have built the extension
    native = argmax = draw = steps = None

N_VOCAB = 1000
SAMPLED = (40, 0.95, 0.05, 1.0, 77)  # top_k, top_p, min_p, temperature, seed
GREEDY = (0, 0.0, 0.0, 0.0, 0)


@pytest.fixture(autouse=True)
def native_built() -> None:
    """Every test here needs the extension: a skip without a C compiler, else a failure (native_build.py)."""
    if steps is None:
        skip_or_fail("native.steps")


class Batch(ctypes.Structure):  # llama_batch, as llama.h declares it
    _fields_ = [("n_tokens", ctypes.c_int32), ("token", ctypes.POINTER(ctypes.c_int32)),
                ("embd", ctypes.POINTER(ctypes.c_float)), ("pos", ctypes.POINTER(ctypes.c_int32)),
                ("n_seq_id", ctypes.POINTER(ctypes.c_int32)),
                ("seq_id", ctypes.POINTER(ctypes.POINTER(ctypes.c_int32))), ("logits", ctypes.POINTER(ctypes.c_int8))]


DECODE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, Batch)
LOGITS = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
IS_EOG = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_int32)


class Library:
    """The three functions over scripted rows: decode i makes rows[i] the output (or returns codes[i])."""

    def __init__(self, rows: list[np.ndarray], codes: dict[int, int] | None = None, eog: set[int] = frozenset(),
                 decode_s: float = 0.0) -> None:
        self.rows, self.codes, self.eog, self.decode_s = rows, codes or {}, eog, decode_s
        self.batches: list[tuple[int, int, int, int, int, int]] = []  # n_tokens, token, pos, n_seq_id, seq, logits
        self.out: np.ndarray | None = None
        self._fns = (DECODE(self._decode), LOGITS(lambda _ctx: self.out.ctypes.data), IS_EOG(lambda _v, t: t in self.eog))
        self.tok, self.pos, self.n_seq = (ctypes.c_int32 * 4)(), (ctypes.c_int32 * 4)(), (ctypes.c_int32 * 4)()
        self.seq0 = (ctypes.c_int32 * 2)()
        self.seq_ids = (ctypes.POINTER(ctypes.c_int32) * 4)(ctypes.cast(self.seq0, ctypes.POINTER(ctypes.c_int32)))
        self.flags = (ctypes.c_int8 * 4)()
        self.batch = Batch(0, self.tok, None, self.pos, self.n_seq, self.seq_ids, self.flags)

    def _decode(self, _ctx: int, b: Batch) -> int:
        i = len(self.batches)
        self.batches.append((b.n_tokens, b.token[0], b.pos[0], b.n_seq_id[0], b.seq_id[0][0], b.logits[0]))
        if self.decode_s:
            time.sleep(self.decode_s)
        if i in self.codes:
            return self.codes[i]
        self.out = self.rows[i]
        return 0

    def steps(self, token: int, pos: int, seq: int, most: int, seconds: float = 10.0, draws=GREEDY):
        decode, logits, is_eog = (ctypes.cast(f, ctypes.c_void_p).value for f in self._fns)
        call = StepsCall(decode, logits, is_eog, 1, 1, ctypes.addressof(self.batch), ctypes.sizeof(Batch), N_VOCAB)
        return steps(call.set(token, pos, seq, most, seconds, draws))


def rows(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(N_VOCAB) * 3).astype(np.float32) for _ in range(n)]


def test_greedy_steps_decode_each_drawn_token_at_the_next_position():
    lib = Library(rows(6))
    drawn, rc, in_decode, decoded, undecided = lib.steps(token=5, pos=7, seq=3, most=4)
    assert drawn == [argmax(r) for r in lib.rows[:4]] and (rc, decoded, undecided) == (0, 4, 0)
    # one token a batch, its row wanted, in the sequence asked; each drawn token decoded next, one position on
    assert lib.batches == [(1, t, 7 + i, 1, 3, 1) for i, t in enumerate([5, *drawn[:3]])]
    assert in_decode >= 0.0


def test_sampled_steps_are_the_coupled_draws_at_each_tokens_position():
    lib = Library(rows(5, seed=1))
    drawn, rc, _, decoded, undecided = lib.steps(token=9, pos=20, seq=0, most=5, draws=SAMPLED)
    # the row of the decode at position p gives the token of position p + 1 (as the engine's rounds draw it)
    assert drawn == [draw(r, *SAMPLED[:4], SAMPLED[4], 21 + i) for i, r in enumerate(lib.rows)]
    assert (rc, decoded, undecided) == (0, 5, 0)
    assert len(set(drawn)) > 1


def test_steps_end_on_an_end_of_generation_token_without_decoding_it():
    r = rows(6)
    eog = argmax(r[2])
    drawn, rc, _, decoded, _ = Library(r, eog={eog}).steps(token=1, pos=0, seq=0, most=6)
    assert drawn[-1] == eog and len(drawn) == decoded == 3 and rc == 0


def test_steps_end_once_their_time_has_passed():
    lib = Library(rows(8), decode_s=0.01)
    drawn, _, in_decode, decoded, _ = lib.steps(token=1, pos=0, seq=0, most=8, seconds=0.025)
    assert len(drawn) == decoded == 3  # looked at after each step: 10, 20, then 30 ms
    assert in_decode >= 0.03
    assert len(Library(rows(3)).steps(token=1, pos=0, seq=0, most=3, seconds=0.0)[0]) == 1  # at least one step


def test_a_failed_decode_ends_the_steps_with_what_was_drawn():
    drawn, rc, _, decoded, undecided = Library(rows(5), codes={2: 1}).steps(token=1, pos=0, seq=0, most=5)
    assert len(drawn) == decoded == 2 and rc == 1 and not undecided
    drawn, rc, _, decoded, _ = Library(rows(5), codes={0: 2}).steps(token=1, pos=0, seq=0, most=5)
    assert drawn == [] and rc == 2 and decoded == 0


def test_a_row_the_c_pass_cannot_draw_from_is_left_to_the_caller():
    r = rows(4)
    r[1][10] = np.nan
    lib = Library(r)
    drawn, rc, _, decoded, undecided = lib.steps(token=1, pos=0, seq=0, most=4, draws=SAMPLED)
    assert len(drawn) == 1 and decoded == 2 and undecided == 1 and rc == 0
    assert lib.out is r[1]  # the context's output is that row still
    # greedy has no such row: np.argmax's answer on NaN is the NaN's index
    assert Library(r).steps(token=1, pos=0, seq=0, most=2)[0] == [argmax(r[0]), 10]


@pytest.mark.parametrize("most, draws", [(0, GREEDY), (2, (N_VOCAB, 1.0, 0.0, 1.0, 1)), (2, (5, 1.0, 0.0, 0.0, 1))])
def test_steps_refuse_what_they_cannot_do(most, draws):
    with pytest.raises(ValueError):
        Library(rows(2)).steps(token=1, pos=0, seq=0, most=most, draws=draws)


def test_steps_refuse_a_call_of_another_layout():
    """The call is native.h's steps_call byte for byte, and its batch llama_cpp's llama_batch: a call of
    another size, or a batch declared another size, is refused before anything is decoded."""
    lib = Library(rows(2))
    with pytest.raises(ValueError, match="bytes"):
        steps(bytes(ctypes.sizeof(StepsCall) - 8))
    decode, logits, is_eog = (ctypes.cast(f, ctypes.c_void_p).value for f in lib._fns)
    call = StepsCall(decode, logits, is_eog, 1, 1, ctypes.addressof(lib.batch), ctypes.sizeof(Batch) + 8, N_VOCAB)
    with pytest.raises(ValueError, match="llama_batch"):
        steps(call.set(1, 0, 0, 2, 10.0, GREEDY))
    assert lib.batches == []


class SteppingContext:
    """A context with a steps() loop over scripted rows, as a llama Context has (what KVSeq.steps calls)."""

    n_ctx, n_batch = 64, 8

    def __init__(self, lib: Library) -> None:
        self.lib = lib

    def steps(self, token, pos, seq, most, seconds, draws):
        drawn, rc, took, decoded, undecided = self.lib.steps(token, pos, seq, most, seconds, draws)
        return drawn, self.lib.out if undecided else None, took

    def decode(self, tokens, positions, seqs, logits_for, copy=True):
        raise AssertionError("KVSeq.steps decodes through steps() alone")

    def seq_rm(self, seq, p0=0, p1=-1):
        pass


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_kvseq_steps_draws_a_row_the_loop_left_and_holds_what_was_decoded(temperature):
    r = rows(5, seed=2)
    r[2][3] = np.nan  # the loop leaves the third row to the drawer (sampled; greedy draws it in C)
    kv = KVSeq(SteppingContext(Library(r)))
    kv._tokens = [4, 4, 4]  # the cache holds the history but its last token
    drawer = Drawer(SamplingConfig(temperature=temperature, seed=5), 5)
    drawn, _ = kv.steps([4, 4, 4, 9], 4, 10.0, drawer)
    n = 4 if drawer.greedy else 3  # sampled, the steps end with the row they left, drawn in Python
    assert drawn == [drawer(row, 4 + i) for i, row in enumerate(r[:n])]  # positions 4, 5, ...
    assert kv.tokens == [4, 4, 4, 9, *drawn[:-1]]
    assert kv.steps([4, 4, 9], 2, 10.0, drawer) is None  # not all but the last token cached: the caller's rounds


class BanTop:
    """A row hook (coupling.RowHook) that bans each row's likeliest token, as a grammar's mask would a token
    it forbids, and notes the positions it saw; in Python, and in C through native.row_hook_address (the C
    hook that calls a Python callable, as structured/rows.py's AnswerRows does)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.positions: list[int] = []
        self.previous: list[int] = []  # the token decoded before each row, as the C loop tells it
        self.notices: list[tuple[int, int]] = []  # (position, token) of each token drawn and decoded next
        self.fail_at = fail_at  # raise KeyboardInterrupt at this row's position (a Ctrl-C)
        self._call = self._row  # kept alive with the hook: native.steps calls it by address
        self.native = (native.row_hook_address(), id(self._call))

    def __call__(self, row: np.ndarray, position: int) -> None:
        self.positions.append(position)
        row[int(np.argmax(row))] = -np.inf

    def _row(self, row, n_vocab, position, previous) -> int:
        if not row:  # a token drawn, decoded next: the notice before its decode
            self.notices.append((position, previous))
            return 0
        if position == self.fail_at:
            raise KeyboardInterrupt
        self.previous.append(previous)
        self(np.ctypeslib.as_array(ctypes.cast(row, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,)), position)
        return 0  # the row is as the hook left it: the loop draws from it


@pytest.mark.parametrize("draws", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_row_hook_changes_each_row_before_its_draw_in_c_as_in_python(draws):
    """The hook runs on each row before top-k and the draw, with the drawn token's position, in native.steps's
    loop (steps_call.row_hook) as in the Python draw (Drawer): the same tokens either way, none of them a
    banned one, and not the tokens drawn without it."""
    s = SamplingConfig(temperature=draws[3], top_k=draws[0] or 40, top_p=draws[1] or 1.0, min_p=draws[2], seed=draws[4])
    in_c = BanTop()
    drawer = Drawer(s, draws[4], hook=in_c)
    assert drawer.native == (*draws, *in_c.native, None, 0)
    lib = Library(rows(5, seed=3))
    drawn, rc, _, decoded, undecided = lib.steps(token=2, pos=10, seq=0, most=5, draws=drawer.native)
    assert (rc, decoded, undecided) == (0, 5, 0) and in_c.positions == [11, 12, 13, 14, 15]
    assert in_c.previous == [2, *drawn[:-1]]  # each row's last input: the first token, then each one drawn
    assert in_c.notices == [(11 + i, t) for i, t in enumerate(drawn[:-1])]  # told before each is decoded
    in_python = Drawer(s, draws[4], hook=BanTop())
    fresh = rows(5, seed=3)
    assert drawn == [in_python(row, 11 + i) for i, row in enumerate(fresh)]
    assert all(t != int(np.argmax(row)) for t, row in zip(drawn, rows(5, seed=3)))
    plain = Library(rows(5, seed=3)).steps(token=2, pos=10, seq=0, most=5, draws=draws)[0]
    assert drawn != plain


def test_what_the_hook_raises_stops_the_loop_and_is_raised():
    """A Ctrl-C that lands in the row hook (or anything it raises) ends native.steps with that exception,
    after no further decode: not printed and lost as a ctypes callback's would be."""
    hook = BanTop(fail_at=13)
    lib = Library(rows(5, seed=3))
    with pytest.raises(KeyboardInterrupt):
        lib.steps(token=2, pos=10, seq=0, most=5, draws=Drawer(SamplingConfig(temperature=0.0), 1, hook=hook).native)
    assert hook.positions == [11, 12] and len(lib.batches) == 3


def test_a_hook_with_no_c_form_leaves_plain_steps_to_python():
    hook = BanTop()
    hook.native = None
    assert Drawer(SamplingConfig(temperature=0.0), 1, hook=hook).native is None
    assert Drawer(SamplingConfig(temperature=0.0), 1).native == GREEDY  # no hook: the C loop's draws as before
