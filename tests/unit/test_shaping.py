"""A row's shaping (structured/shaping.py) on a one-character-a-token vocabulary (tests/fakes.ALPHABET):
a cursor follows any answer prefix and rolls back where a new one parts from it; the mask, the bias and
the penalties are functions of the prefix alone; a trigger starts the grammar; the C mask equals numpy's."""

from __future__ import annotations

import numpy as np
import pytest

from ssd_edge.config import SamplingConfig
from ssd_edge.structured import Grammar, JsonSchema, compile
from ssd_edge.structured import shaping as shaping_mod
from ssd_edge.structured.shaping import Shaping, apply_mask
from ssd_edge.structured.tokenizer import for_model
from tests.fakes import ALPHABET, V, FakeModel

MODEL = FakeModel(alphabet=ALPHABET)
TOK = for_model(MODEL)


def ids(text: str) -> list[int]:
    return MODEL.tokenize(text)


def allowed(shaping: Shaping, prefix: str, cursor=None) -> str:
    """The characters the shaped row still allows after `prefix`."""
    c = cursor or shaping.cursor()
    row = np.zeros(V, dtype=np.float32)
    c(row, ids(prefix))
    return "".join(MODEL.piece(t).decode() or "<eos>" for t in np.flatnonzero(np.isfinite(row)))


def test_the_mask_follows_the_prefix_and_rolls_back():
    s = Shaping(SamplingConfig(), compile(JsonSchema({"type": "object", "properties": {"a": {"type": "integer"}},
                                                      "required": ["a"]}), TOK), TOK, MODEL.is_eog)
    c = s.cursor()
    assert allowed(s, "", c) == "{"
    assert c.forced() == ids('{"a": ')[:len(c.forced())] and len(c.forced()) >= 5
    assert set(allowed(s, '{"a": ', c)) == set("-0123456789")
    assert set(allowed(s, '{"a": 1', c)) == set("},0123456789")  # (rigid: no space before the brace or comma)
    assert allowed(s, '{"a": 12}', c) == "<eos>" and c.finished()
    assert allowed(s, '{"a', c) == '"'  # rolled back three tokens
    assert c.allowed(ids('": 3}')) == 5 and c.allowed(ids('" 3')) == 1


def test_a_refused_token_leaves_the_rows_after_it_free():
    s = Shaping(SamplingConfig(), compile(Grammar('start: "ab"'), TOK), TOK, MODEL.is_eog)
    c = s.cursor()
    assert allowed(s, "c", c) == "".join(MODEL.piece(t).decode() or "<eos>" for t in range(V))
    assert not c.constrained
    assert allowed(s, "a", c) == "b" and c.constrained  # rolled back past the refused token


def test_a_trigger_starts_the_grammar():
    s = Shaping(SamplingConfig(), compile(Grammar('start: "[" "1" "]"', trigger="["), TOK), TOK, MODEL.is_eog)
    assert s.trigger == ids("[")[0]
    c = s.cursor()
    every = "".join(MODEL.piece(t).decode() or "<eos>" for t in range(V))
    assert allowed(s, "abc", c) == every, "free text before the trigger"
    assert allowed(s, "abc[", c) == "1" and allowed(s, "abc[1]", c) == "<eos>"
    assert allowed(s, "ab", c) == every, "rolled back before the trigger: free again"


def test_bias_and_penalties_count_the_answer_prefix():
    s = Shaping(SamplingConfig(logit_bias={1: -100.0, 2: 3.0}, presence_penalty=0.5, frequency_penalty=0.25))
    c = s.cursor()
    row = np.zeros(V, dtype=np.float32)
    c(row, [5, 5, 7])
    want = np.zeros(V, dtype=np.float32)
    want[1], want[2], want[5], want[7] = -100.0, 3.0, -1.0, -0.75
    np.testing.assert_allclose(row, want)
    row = np.zeros(V, dtype=np.float32)
    c(row, [7])  # rolled back: 5 no longer in the answer
    want[5] = 0.0
    np.testing.assert_allclose(row, want)
    assert not Shaping(SamplingConfig()).active and s.active


def test_the_c_mask_equals_numpys():
    rng = np.random.default_rng(4)
    for n in (151936, 1000, 33):
        row = rng.standard_normal(n).astype(np.float32)
        words = (n + 31) // 32 - (1 if n == 1000 else 0)  # a mask shorter than the row refuses the rest
        mask = rng.integers(-2**31, 2**31, words, dtype=np.int64).astype(np.int32)
        mask[::3], mask[1::5] = 0, -1
        a, b = row.copy(), row.copy()
        apply_mask(a, mask)
        saved, shaping_mod.compiled_mask = shaping_mod.compiled_mask, None
        try:
            apply_mask(b, mask)
        finally:
            shaping_mod.compiled_mask = saved
        np.testing.assert_array_equal(a, b)
        bits = np.unpackbits(mask.view(np.uint8), bitorder="little").astype(bool)
        assert np.isinf(a).sum() == n - bits[:n].sum()


@pytest.mark.skipif(shaping_mod.compiled_mask is None, reason="no compiled extension")
def test_masked_rows_draw_in_c_as_in_numpy():
    """support()'s C pass skips -inf (a refused token) and takes every finite one where fewer than top-k
    are: the same support and the same coupled draw as numpy's chain."""
    from ssd_edge import sampling
    from ssd_edge.coupling import Drawer, gumbel_draw

    rng = np.random.default_rng(1)
    for trial in range(120):
        n = int(rng.choice([5000, 151936]))
        row = np.full(n, -np.inf, dtype=np.float32)
        keep = rng.choice(n, int(rng.choice([1, 3, 39, 40, 41, 300])), replace=False)
        row[keep] = rng.standard_normal(len(keep)) * 3
        s = SamplingConfig(temperature=float(rng.choice([0.5, 1.0])), top_p=float(rng.choice([0.9, 1.0])),
                           min_p=float(rng.choice([0.0, 0.05])))
        got, want = sampling.support(row, s), sampling._support_numpy(row.copy(), s)
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_allclose(got.p, want.p, rtol=1e-12)
        assert Drawer(s, 7)(row.copy(), trial) == gumbel_draw(*want, 7, trial)


def test_the_c_loops_masked_draw_is_the_python_draw():
    """native.masked_draw (what the C loop draws with under a mask: the allowed tokens gathered where
    few are, in place where many are) gives the Python draw's token on the row masked with -inf."""
    from ssd_edge import native
    from ssd_edge.coupling import Drawer

    rng = np.random.default_rng(2)
    for trial in range(80):
        n = int(rng.choice([4096, 151936]))
        allowed = np.zeros(n, dtype=bool)
        allowed[rng.choice(n, int(rng.choice([1, 5, 41, n // 16, n // 2])), replace=False)] = True
        mask = np.packbits(allowed, bitorder="little").view(np.int32)
        row = (rng.standard_normal(n) * 3).astype(np.float32)
        greedy = trial % 3 == 0
        s = SamplingConfig(temperature=0.0 if greedy else float(rng.choice([0.7, 1.0])), top_k=40,
                           top_p=float(rng.choice([0.9, 1.0])), min_p=float(rng.choice([0.0, 0.05])))
        masked = row.copy()
        masked[~allowed] = -np.inf
        want = Drawer(s, 11)(masked, trial)
        got = native.masked_draw(row.copy(), mask, 0 if greedy else s.top_k, s.top_p, s.min_p,
                                 s.temperature if not greedy else 1.0, 11, trial)
        assert got == want, (trial, n, int(allowed.sum()), greedy)


def test_a_fork_goes_its_own_way():
    """A branch's cursor (Cursor.fork) starts at the state it was forked at; what either pushes after
    leaves the other as it was."""
    s = Shaping(SamplingConfig(presence_penalty=1.0), compile(JsonSchema({"type": "object", "properties": {
        "a": {"type": "integer"}}, "required": ["a"]}), TOK), TOK, MODEL.is_eog)
    c = s.cursor()
    c.follow(ids('{"a": '))
    f = c.fork()
    for t in ids("12"):
        f.push(t)
    assert set(allowed(s, '{"a": ', c)) == set("-0123456789")
    row = np.zeros(V, dtype=np.float32)
    f.shape(row)
    assert set("".join(MODEL.piece(t).decode() for t in np.flatnonzero(np.isfinite(row)))) == set("},0123456789")
    assert row[ids("1")[0]] == -1.0 and f.tokens == ids('{"a": 12') and c.tokens == ids('{"a": ')


def test_forced_runs_learn_their_acceptance_from_a_prior_of_one():
    """Forced tokens go whole while they are accepted; refused ones lower the rate, and a run is then cut
    where the chance of reaching its next token is under the floor (one token at least)."""
    from ssd_edge.structured.rows import ForcedRuns

    class Run:
        def follow(self, answer):
            pass

        def forced(self):
            return list(range(12))

    runs = ForcedRuns(Run(), 0)
    assert runs([]) == list(range(12)) and runs.acceptance == 1.0
    runs.observe(12, 20)  # all accepted: still 1
    assert runs.acceptance == 1.0 and len(runs([])) == 12
    for _ in range(6):
        runs.observe(12, 0)  # the first forced token refused, round after round
    p = runs.acceptance
    assert 0 < p < 0.8
    assert len(runs([])) == max(1, int(np.floor(np.log(ForcedRuns.FLOOR) / np.log(p) + 1e-9)))
    for _ in range(40):
        runs.observe(12, 0)
    assert runs([]) == [0]
