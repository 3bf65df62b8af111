"""Coupled sampling (coupling.py): each draw is an exact sample of its row, keyed by (seed,
position) alone, and a draft drawn with the same noise lands on the target's draw as often as a
coupling without communication allows."""

from __future__ import annotations

import numpy as np
import pytest

from native_build import skip_or_fail
import ssd_edge.coupling as coupling
from ssd_edge.config import SamplingConfig
from ssd_edge.coupling import gumbel_pick, gumbel_picks, uniforms

N = 40_000
# Total variation between an empirical distribution of N draws over a few outcomes and the truth
# stays below ~sqrt(outcomes / N) / 2 with overwhelming probability; 0.012 is ~2.4x that for 4.
TV_FLOOR = 0.012


def tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


def test_uniforms_are_uniform_and_keyed():
    u = uniforms(7, 3, np.arange(200_000))
    assert 0.0 < u.min() and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.003 and abs(u.var() - 1 / 12) < 0.002
    assert np.array_equal(u[:10], uniforms(7, 3, np.arange(10)))          # a pure function
    assert not np.allclose(u[:10], uniforms(7, 4, np.arange(10)))         # another position
    assert not np.allclose(u[:10], uniforms(8, 3, np.arange(10)))         # another seed
    # neighbouring positions are uncorrelated
    v = uniforms(7, 4, np.arange(200_000))
    assert abs(np.corrcoef(u, v)[0, 1]) < 0.01


@pytest.mark.parametrize("p", [[0.5, 0.3, 0.2, 0.0], [0.97, 0.01, 0.01, 0.01], [0.25, 0.25, 0.25, 0.25]])
def test_draws_follow_the_row_over_seeds_and_over_positions(p):
    p = np.array(p)
    by_seed = np.bincount([gumbel_pick(p, s, 11) for s in range(N)], minlength=4) / N
    by_pos = np.bincount([gumbel_pick(p, 5, i) for i in range(N)], minlength=4) / N
    assert tv(by_seed, p) < TV_FLOOR and tv(by_pos, p) < TV_FLOOR
    assert by_seed[p == 0].sum() == 0  # never a token the row excludes


def test_a_draft_with_the_targets_row_always_lands_on_the_targets_draw():
    rng = np.random.default_rng(0)
    for pos in range(200):
        p = rng.dirichlet(np.ones(50) * 0.3)
        assert gumbel_pick(p.copy(), 3, pos) == gumbel_pick(p, 3, pos)


def test_coupled_acceptance_is_at_least_the_communication_free_bound():
    """P(draft draw == target draw) >= (1 - TV) / (1 + TV) for rows p, q (Gumbel coupling)."""
    rng = np.random.default_rng(1)
    for trial in range(5):
        p = rng.dirichlet(np.ones(6))
        q = rng.dirichlet(np.ones(6))
        d = tv(p, q)
        same = np.mean([gumbel_pick(p, s, 0) == gumbel_pick(q, s, 0) for s in range(N // 4)])
        assert same >= (1 - d) / (1 + d) - 0.02, (trial, same, d)
        assert same <= 1 - d + 0.02  # and no coupling beats the maximal one


def test_picks_take_one_position_per_row():
    p = np.tile(np.array([0.4, 0.3, 0.2, 0.1]), (5, 1))
    got = gumbel_picks(p, 9, 100)
    assert got.tolist() == [gumbel_pick(p[0], 9, 100 + j) for j in range(5)]


def test_draws_are_made_as_verify_reads_them_and_equal_the_eager_draws(monkeypatch):
    import ssd_edge.coupling as coupling
    from ssd_edge.config import SamplingConfig
    from ssd_edge.verify import verify

    rows = np.random.default_rng(5).normal(0, 2, size=(6, 300)).astype(np.float32)
    s = SamplingConfig(temperature=1.0, top_k=40, top_p=0.95, min_p=0.05)
    eager = [coupling.draw(row, s, 9, 50 + j) for j, row in enumerate(rows)]
    made = []
    drawer = coupling.Drawer(s, 9)
    draws = coupling.Draws(rows, lambda row, pos: made.append(pos) or drawer(row, pos), 50)
    draft = [eager[0], eager[1], (eager[2] + 1) % 300, eager[3], eager[4]]  # the third is rejected
    assert verify(draft, draws) == (2, eager[2])
    assert made == [50, 51, 52]  # nothing drawn past the recovery token
    assert [draws[j] for j in range(len(draws))] == eager and made == [50, 51, 52, 53, 54, 55]


def test_the_compiled_draw_is_numpys():
    """coupling.gumbel_draw in C (ssd_edge/csrc/draws.c) draws the token numpy's path draws, for every seed
    and position tried (the same noise; the two logs may differ only in the last bit)."""
    if coupling.compiled_gumbel is None:
        skip_or_fail("the compiled draw")
    rng = np.random.default_rng(11)
    for m in (2, 3, 40, 500):
        ids = np.sort(rng.choice(151_936, size=m, replace=False)).astype(np.int64)
        p = rng.dirichlet(np.full(m, 0.3))
        p = np.maximum(p, 1e-300)
        p /= p.sum()
        for seed, pos in ((0, 0), (7, 123), (2**63 + 5, 2**40), (123456789, 7)):
            for shift in range(25):
                compiled = coupling.gumbel_draw(ids, p, seed, pos + shift)
                g = -np.log(-np.log(coupling.uniforms(seed, pos + shift, ids)))
                assert compiled == int(ids[np.argmax(np.log(p) + g)])


def test_the_compiled_argmax_is_numpys():
    """coupling.argmax in C (native.argmax: the groups' maxima, then the first group holding the largest)
    answers as np.argmax on rows of every length around its 512-value groups, at both pass widths: ties
    to the first, the first NaN wherever one is, +inf, all -inf, the largest in the tail, ascending rows."""
    if coupling.compiled_argmax is None:
        skip_or_fail("the compiled argmax")
    from test_sampling import _scan_widths, _set_scan_width

    rng = np.random.default_rng(13)
    for width in _scan_widths():
        before = _set_scan_width(width)
        try:
            for n in (1, 2, 511, 512, 513, 1024, 5000, 151_936):
                for kind in range(9):
                    x = rng.standard_normal(n).astype(np.float32)
                    if kind == 1:
                        x = np.round(x)                     # ties everywhere
                    elif kind == 2:
                        x[rng.integers(0, n, 3)] = np.nan   # NaNs: the first one
                    elif kind == 3:
                        x[rng.integers(0, n)] = np.inf
                    elif kind == 4:
                        x[:] = -np.inf
                    elif kind == 5:
                        x[-1] = x.max()                     # a tie in the tail: the earlier one
                    elif kind == 6:
                        x[-1] = x.max() + 1                 # the tail holds the largest
                    elif kind == 7:
                        x = np.sort(x)
                    elif kind == 8:
                        x[-1] = np.nan
                    assert coupling.argmax(x) == int(np.argmax(x)), (width, n, kind)
        finally:
            _set_scan_width(before)
    assert coupling.argmax(np.arange(5.0)) == 4 and coupling.argmax([1.0, 3.0, 3.0]) == 1  # numpy's path


def test_a_draw_in_one_compiled_call_is_the_support_then_the_gumbel_draw(monkeypatch):
    """coupling.draw with top-k on makes its support and its draw in one C call (native.draw): the token
    the two steps give in Python, and the one the numpy paths give, for rows with ties and masks, every
    sampling setting tried, seeds and positions; a row it declines (NaN) goes the long way."""
    if coupling.compiled_draw is None:
        skip_or_fail("the compiled draw")
    import ssd_edge.sampling as sampling
    from ssd_edge.config import SamplingConfig

    rng = np.random.default_rng(5)
    rows = [(rng.standard_normal(n) * 3).astype(np.float32) for n in (300, 49_152, 151_936)]
    rows.append(np.round(rows[1], 0))  # ties everywhere
    settings = [SamplingConfig(temperature=t, top_k=k, top_p=p, min_p=m) for t in (0.3, 1.0, 1.7)
                for k in (1, 2, 40) for p in (1.0, 0.95) for m in (0.0, 0.05)]
    for x in rows:
        for s in settings:
            for seed, pos in ((0, 0), (7, 123), (2**63 + 5, 2**40)):
                one = coupling.draw(x, s, seed, pos)
                assert one == coupling.gumbel_draw(*sampling.support(x, s), seed, pos), (len(x), s)
                with monkeypatch.context() as m:
                    for name in ("compiled_draw", "compiled_gumbel"):
                        m.setattr(coupling, name, None)
                    m.setattr(sampling, "compiled_support", None)
                    m.setattr(sampling, "compiled_top_ids", None)
                    assert one == coupling.draw(x, s, seed, pos), (len(x), s)
    nan = rows[0].copy()
    nan[7] = np.nan
    s = SamplingConfig(temperature=1.0)
    assert coupling.compiled_draw(nan, s.top_k, s.top_p, s.min_p, s.temperature, 1, 2) is None
    assert coupling.draw(nan, s, 1, 2) == coupling.gumbel_draw(*sampling.support(nan, s), 1, 2)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("s", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=20),
                               SamplingConfig(temperature=1.5, top_p=0.9, min_p=0.1),
                               SamplingConfig(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0)],
                         ids=["default", "t0.7-k20", "t1.5-p0.9-m0.1", "k8"])
def test_a_draw_from_a_rows_head_is_the_draw_from_the_row(monkeypatch, s, compiled):
    """A branch step handed only its rows' heads (sampling.Heads, wider than top-k: head_width) draws
    each row's token as the whole row's coupled draw would, in C and in numpy."""
    from ssd_edge.sampling import head_width, heads_of

    if not compiled:
        monkeypatch.setattr(coupling, "compiled_head_draws", None)
    elif coupling.compiled_head_draws is None:
        skip_or_fail("the compiled head draws")
    rng = np.random.default_rng(5)
    rows = (rng.standard_normal((120, 3000)) * 2.5).astype(np.float32)
    heads = heads_of(rows, head_width(s))
    got = coupling.head_draws(heads, s, 11, list(range(40, 160)))
    want = [coupling.draw(row, s, 11, 40 + i) for i, row in enumerate(rows)]
    assert got.tolist() == want
