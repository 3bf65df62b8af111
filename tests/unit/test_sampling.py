"""sampling.probs / sample / reshape_saguaro on hand-built logit rows.

The reference below re-derives each transform the slow, obvious way (a full
sort, token ids breaking ties) and the fast code must agree with it exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from native_build import skip_or_fail
from ssd_edge.config import SamplingConfig
from ssd_edge.sampling import _TOP_P_CANDIDATES, probs, reshape_saguaro, sample


def cfg(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> SamplingConfig:
    return SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)


def reference(logits: np.ndarray, s: SamplingConfig) -> np.ndarray:
    """llama.cpp's chain: top-k, top-p, min-p (both at temperature 1), then temperature; ties go to
    the lower token id."""
    z = np.asarray(logits, dtype=np.float64)
    out = np.zeros_like(z)
    if s.greedy:
        out[int(np.argmax(z))] = 1.0
        return out
    order = np.lexsort((np.arange(len(z)), -z))  # descending logit, then ascending id
    if 0 < s.top_k < len(z):
        order = order[: s.top_k]
    if s.top_p < 1.0:
        cum = np.cumsum(softmax(z[order]))  # `order` is descending in p
        n = int(np.argmax(cum >= s.top_p)) + 1 if cum[-1] >= s.top_p else len(order)
        order = order[:n]
    if s.min_p > 0:
        order = order[z[order] >= z[order].max() + np.log(s.min_p)]
    out[order] = softmax(z[order] / s.temperature)
    return out


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


RNG = np.random.default_rng(1234)
ROWS = RNG.normal(0, 3, size=(6, 200))


# ---------------------------------------------------------------- greedy

def test_greedy_is_one_hot_at_argmax():
    for row in ROWS:
        p = probs(row, cfg(temperature=0.0, top_k=40, top_p=0.9, min_p=0.1))
        assert p.sum() == 1.0 and np.count_nonzero(p) == 1
        assert int(np.argmax(p)) == int(np.argmax(row))


def test_greedy_tie_goes_to_lower_id():
    row = np.array([0.0, 5.0, 1.0, 5.0])
    p = probs(row, cfg(temperature=0.0))
    assert p.tolist() == [0.0, 1.0, 0.0, 0.0]


# ---------------------------------------------------------------- every transform

@pytest.mark.parametrize("s", [
    cfg(1.0), cfg(0.3), cfg(2.5),
    cfg(1.0, top_k=1), cfg(1.0, top_k=7), cfg(0.7, top_k=40, top_p=0.95, min_p=0.05),
    cfg(1.0, top_p=0.5), cfg(1.0, top_p=0.999), cfg(1.0, min_p=0.2), cfg(1.3, top_k=3, min_p=0.5),
])
def test_rows_sum_to_one_and_match_reference(s):
    for row in ROWS:
        p = probs(row, s)
        assert p.dtype == np.float64 and p.shape == row.shape
        assert abs(p.sum() - 1.0) < 1e-12 and (p >= 0).all()
        np.testing.assert_allclose(p, reference(row, s), rtol=1e-12, atol=1e-15)


def test_batch_of_rows_equals_row_by_row():
    s = cfg(0.8, top_k=20, top_p=0.9, min_p=0.02)
    batch = probs(ROWS, s)
    assert batch.shape == ROWS.shape
    for row, p in zip(ROWS, batch):
        np.testing.assert_array_equal(p, probs(row, s))
    assert probs(np.empty((0, 200)), s).shape == (0, 200)


def test_temperature_alone_is_softmax():
    for t in (0.25, 1.0, 4.0):
        for row in ROWS:
            np.testing.assert_allclose(probs(row, cfg(t)), softmax(row / t), rtol=1e-12)


def test_temperature_sharpens_and_flattens():
    row = ROWS[0]
    cold, warm, hot = (probs(row, cfg(t)) for t in (0.2, 1.0, 5.0))
    assert cold.max() > warm.max() > hot.max()
    assert int(np.argmax(cold)) == int(np.argmax(hot)) == int(np.argmax(row))


def test_top_k_keeps_the_k_largest():
    for k in (1, 5, 40):
        for row in ROWS:
            p = probs(row, cfg(1.0, top_k=k))
            assert np.count_nonzero(p) == k
            assert set(np.flatnonzero(p)) == set(np.argsort(-row)[:k])
    # top_k >= V and top_k = 0 both mean "off"
    np.testing.assert_allclose(probs(ROWS[0], cfg(1.0, top_k=10_000)), softmax(ROWS[0]), rtol=1e-12)


def test_top_p_keeps_the_smallest_head_reaching_p():
    for top_p in (0.1, 0.5, 0.9, 0.99):
        for row in ROWS:
            full = softmax(row)
            p = probs(row, cfg(1.0, top_p=top_p))
            kept = np.flatnonzero(p)
            mass = full[kept].sum()
            assert mass >= top_p - 1e-12                           # reaches p
            assert mass - full[kept].min() < top_p                 # and no token could be dropped
            assert full[kept].min() >= full[np.flatnonzero(p == 0)].max(initial=0.0)  # a head, not a subset
            np.testing.assert_allclose(p[kept], full[kept] / mass, rtol=1e-12)


def test_min_p_keeps_tokens_above_a_fraction_of_the_max():
    for min_p in (0.01, 0.1, 0.5):
        for row in ROWS:
            full = softmax(row)
            p = probs(row, cfg(1.0, min_p=min_p))
            assert (full[p > 0] >= min_p * full.max()).all()
            assert (full[p == 0] < min_p * full.max()).all()


def test_filters_see_temperature_one_and_temperature_comes_last():
    """llama.cpp's order: which tokens top-p and min-p keep does not depend on the temperature,
    which only reshapes the survivors (the old order, temperature first, kept more tokens when hot)."""
    for row in ROWS:
        for s in (cfg(1.0, top_p=0.8), cfg(1.0, min_p=0.1), cfg(1.0, top_k=30, top_p=0.9, min_p=0.05)):
            kept = np.flatnonzero(probs(row, s))
            for t in (0.3, 2.5):
                hot = probs(row, s.model_copy(update={"temperature": t}))
                assert np.array_equal(np.flatnonzero(hot), kept)
                np.testing.assert_allclose(hot[kept], softmax(row[kept] / t), rtol=1e-12)


def test_top_k_ties_at_the_boundary_keep_the_lower_ids():
    row = np.array([1.0, 3.0, 2.0, 2.0, 0.0, 2.0])
    assert np.flatnonzero(probs(row, cfg(1.0, top_k=3))).tolist() == [1, 2, 3]


def test_top_p_head_shortcut_equals_a_full_sort():
    """Above 2 * 1024 candidates top-p sorts only the 1024-token head when it holds all the mass;
    it must then pick exactly the tokens a full sort picks, ties included."""
    V = 50_000
    rng = np.random.default_rng(7)
    assert V > 2 * _TOP_P_CANDIDATES
    # peaked: a few hundred plausible tokens, the rest ~e^-60 below -> the head holds the mass
    peaked = np.full(V, -60.0)
    hot = rng.choice(V, 300, replace=False)
    peaked[hot] = rng.normal(0, 2, 300)
    # ties: logits on a coarse grid, so many tokens share a value at the top-p cut
    tied = np.full(V, -60.0)
    tied[hot] = np.round(rng.normal(0, 2, 300))
    # flat: the head does not hold the mass -> the full sort is used
    flat = rng.normal(0, 0.5, V)
    for row in (peaked, tied, flat):
        for top_p in (0.3, 0.8, 0.95, 0.999):
            s = cfg(1.0, top_p=top_p)
            np.testing.assert_allclose(probs(row, s), reference(row, s), rtol=1e-12, atol=1e-300)


# ---------------------------------------------------------------- sample

def test_sample_one_hot_and_support():
    rng = np.random.default_rng(0)
    one_hot = np.zeros(10)
    one_hot[6] = 1.0
    assert all(sample(one_hot, rng) == 6 for _ in range(20))
    p = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    assert {sample(p, rng) for _ in range(200)} == {1, 3}


def test_sample_frequencies():
    rng = np.random.default_rng(0)
    p = softmax(np.array([2.0, 1.0, 0.0, -1.0, 0.5]))
    n = 40_000
    counts = np.bincount([sample(p, rng) for _ in range(n)], minlength=5)
    # 5 standard deviations of a binomial count
    assert (np.abs(counts - n * p) <= 5 * np.sqrt(n * p * (1 - p))).all()


def test_sample_unnormalised_weights():
    rng = np.random.default_rng(0)
    w = np.array([0.0, 3.0, 1.0])  # sample() normalises by the sum
    n = 20_000
    frac = np.mean([sample(w, rng) == 1 for _ in range(n)])
    assert abs(frac - 0.75) < 5 * np.sqrt(0.75 * 0.25 / n)


# ---------------------------------------------------------------- SAGUARO reshaping

def test_saguaro_scales_the_top_candidates():
    q = softmax(np.array([3.0, 2.0, 1.0, 0.0, -1.0]))
    r = reshape_saguaro(q, top=2, factor=0.5)
    assert abs(r.sum() - 1.0) < 1e-12
    ratio = r / q
    # the two most likely tokens shrink by `factor` relative to the others, which keep their ratios
    np.testing.assert_allclose(ratio[:2] / ratio[2], 0.5, rtol=1e-12)
    np.testing.assert_allclose(ratio[2:], ratio[2], rtol=1e-12)


def test_saguaro_off_and_degenerate():
    q = softmax(np.array([1.0, 0.0, -1.0]))
    assert reshape_saguaro(q, 2, 1.0) is q
    one_hot = np.array([0.0, 1.0, 0.0])
    np.testing.assert_array_equal(reshape_saguaro(one_hot, 2, 0.5), one_hot)
    two = np.array([0.0, 0.25, 0.75])  # fewer non-zero entries than `top`: keeps one untouched
    r = reshape_saguaro(two, 2, 0.5)
    assert abs(r.sum() - 1) < 1e-12 and r[0] == 0.0 and r[2] < 0.75


# ---------------------------------------------------------------- the candidates (top_ids)

def _top_k_reference(x: np.ndarray, k: int) -> list[int]:
    """The k largest by a full sort: above the k-th largest value ascending, then equal to it ascending."""
    edge = np.sort(x)[::-1][k - 1]
    return (np.flatnonzero(x > edge).tolist() + np.flatnonzero(x == edge).tolist())[:k]


def _rows_with_ties_and_masks():
    rng = np.random.default_rng(7)
    for n in (41, 300, 49_152, 151_936):
        x = (rng.standard_normal(n) * 3).astype(np.float32)
        yield x
        tied = x.copy()
        tied[rng.integers(0, n, 30)] = tied.max()  # ties at the top, across the boundary of k
        yield tied
        yield np.round(x, 0)                        # many ties everywhere
        masked = x.copy()
        masked[rng.integers(0, n, n // 3)] = -np.inf
        yield masked
        yield np.ones(n, dtype=np.float32)          # every value tied: the lower ids
        yield np.sort(x)                            # ascending: the threshold rises to the very end
        packed = x.copy()
        packed[n // 2: n // 2 + 100] = x.max() + 1  # the k largest in one group of the first pass
        yield packed
        sparse = np.full(n, -np.inf, dtype=np.float32)
        sparse[rng.integers(0, n, 7)] = x[:7]       # fewer finite values than k: the bound starts at -inf
        yield sparse


def test_native_path_says_whether_the_compiled_paths_run(monkeypatch):
    """native_path(): "c" where ssd_edge.native imports (its passes then run), "numpy" where it does not."""
    import importlib

    import ssd_edge.sampling as sampling

    try:
        importlib.import_module("ssd_edge.native")
        built = True
    except ImportError:
        built = False
    assert sampling.native_path() == ("c" if built else "numpy")
    monkeypatch.setattr(sampling, "compiled_top_ids", None)  # as a build without the extension imports it
    assert sampling.native_path() == "numpy"


@pytest.mark.parametrize("compiled", [True, False])
def test_top_ids_is_the_k_largest_with_ties_to_the_lower_ids(compiled, monkeypatch):
    """Both paths (the compiled pass, ssd_edge/csrc/rows.c, and numpy's) give exactly the full sort's ids."""
    import ssd_edge.sampling as sampling

    if compiled and sampling.compiled_top_ids is None:
        skip_or_fail("the compiled pass")
    if not compiled:
        monkeypatch.setattr(sampling, "compiled_top_ids", None)
    for width in _scan_widths() if compiled else [None]:
        before = _set_scan_width(width)
        try:
            for x in _rows_with_ties_and_masks():
                for k in (1, 2, 40, min(100, len(x) - 1)):
                    assert sampling.top_ids(x, k).tolist() == _top_k_reference(x, k), (width, len(x), k)
        finally:
            _set_scan_width(before)


def _scan_widths() -> list[int]:
    """The widths the compiled pass runs at on this CPU: 4, and 8 where it has AVX (native.scan_width)."""
    from ssd_edge import native

    before = native.scan_width()
    try:
        native.scan_width(8)
    except ValueError as e:
        assert "AVX" in str(e) or "8-wide" in str(e)
        return [4]
    native.scan_width(before)
    return [4, 8]


def _set_scan_width(width: int | None) -> int | None:
    """Set the compiled pass's width and return the one before; None: the numpy path (no extension needed)."""
    if width is None:
        return None
    from ssd_edge import native

    return native.scan_width(width)


def test_top_ids_takes_the_numpy_path_for_nan_and_other_dtypes():
    import ssd_edge.sampling as sampling

    x = np.random.default_rng(3).standard_normal(5000).astype(np.float32)
    x[17] = np.nan  # the compiled pass declines NaN rows; numpy's answers as before
    assert sampling.top_ids(x, 40).tolist() == sampling._top_ids_numpy(x, 40).tolist()
    if sampling.compiled_top_ids is not None:  # wherever the NaN is: a span it stops at, one it would
        for width in _scan_widths():           # skip (a NaN is not below the threshold), the tail
            before = _set_scan_width(width)
            try:
                for n, at in [(5000, 0), (5000, 17), (5000, 3001), (5000, 4990), (5000, 4999),
                              (151_936, 0), (151_936, 70_001), (151_936, 151_935)]:  # long: in a group of
                    z = np.random.default_rng(at).standard_normal(n).astype(np.float32)  # the first pass,
                    z[at] = np.nan                                                  # or after the last
                    assert sampling.compiled_top_ids(z, 40) is None, (width, n, at)
            finally:
                _set_scan_width(before)
    y = x.astype(np.float64)
    y[17] = 0.0
    assert sampling.top_ids(y, 40).tolist() == _top_k_reference(y, 40)
    assert sampling.top_ids(y[::2], 40).tolist() == _top_k_reference(y[::2], 40)  # not contiguous


SETTINGS = [cfg(t, top_k=k, top_p=p, min_p=m) for t in (0.3, 1.0, 1.7) for k in (1, 2, 40, 100)
            for p in (1.0, 0.95, 0.3) for m in (0.0, 0.05, 0.5)]


def test_the_compiled_support_is_the_numpy_chain():
    """sampling.support in C (ssd_edge/csrc/draws.c) against its numpy path: the same ids, the same
    probabilities to the last bits (its exp may differ from numpy's in the last bit)."""
    import ssd_edge.sampling as sampling

    if sampling.compiled_support is None:
        skip_or_fail("the compiled chain")
    for x in _rows_with_ties_and_masks():
        if len(x) > 50_000 or not np.isfinite(x).any():
            continue
        for s in SETTINGS:
            if s.top_k >= len(x):
                continue
            a, b = sampling._support_numpy(x, s), sampling.support(x, s)
            assert a.ids.tolist() == b.ids.tolist(), (len(x), s)
            np.testing.assert_allclose(b.p, a.p, rtol=1e-13, atol=0)


def test_the_compiled_head_is_numpys(monkeypatch):
    """sampling.head_probs in C against its numpy path: the same ids in the same order, the same
    probabilities to the last bits."""
    import ssd_edge.sampling as sampling

    if sampling.compiled_head is None:
        skip_or_fail("the compiled head")
    for x in _rows_with_ties_and_masks():
        if not np.isfinite(x).any() or len(x) <= HEAD_K:
            continue
        for t in (1.0, 0.5, 1e-4):
            compiled = sampling.head_probs(x, t)
            with monkeypatch.context() as m:
                m.setattr(sampling, "compiled_head", None)
                reference = sampling.head_probs(x, t)
            assert compiled.ids.tolist() == reference.ids.tolist(), (len(x), t)
            np.testing.assert_allclose(compiled.p, reference.p, rtol=1e-12, atol=1e-300)


HEAD_K = 40


def test_a_masked_row_stays_on_the_compiled_paths(monkeypatch):
    """A row a grammar's mask left fewer than k finite values (-inf elsewhere) is answered in C, as
    numpy's path answers it (its finite values, then the lowest refused ids), not by a whole-row sort."""
    import ssd_edge.sampling as sampling

    if sampling.compiled_head is None or sampling.compiled_top_ids is None:
        skip_or_fail("the compiled head")
    rng = np.random.default_rng(4)
    for n, allowed in ((151936, 3), (151936, 39), (4096, 1), (4096, 60), (1000, 7)):
        x = np.full(n, -np.inf, dtype=np.float32)
        x[rng.choice(n, allowed, replace=False)] = rng.normal(size=allowed).astype(np.float32)
        assert sampling.compiled_top_ids(x, HEAD_K) is not None and sampling.compiled_head(x, HEAD_K, 1.0) is not None
        ids = sampling.top_ids(x, HEAD_K)
        assert ids.tolist() == _top_k_reference(x, HEAD_K), (n, allowed)
        for t in (1.0, 0.7):
            got = sampling.head_probs(x, t)
            with monkeypatch.context() as m:  # numpy's path alone
                m.setattr(sampling, "compiled_head", None)
                m.setattr(sampling, "compiled_top_ids", None)
                want = sampling.head_probs(x, t)
            assert got.ids.tolist() == want.ids.tolist()
            np.testing.assert_allclose(got.p, want.p, rtol=1e-12, atol=1e-300)
