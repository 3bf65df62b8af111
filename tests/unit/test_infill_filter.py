"""llama.cpp's infill sampler as a row's shaping (structured/infill_filter.py), on handmade rows over a tiny
vocabulary whose texts share prefixes: each of its steps (the end tokens alone, the merge of a prefix into
the likelier candidate, the two thresholds, the end-of-text token alone), where it sits in the shaping, and
the sampling the draws then run with. tests/real/test_sampler_chain.py holds it to llama.cpp's own sampler on
real rows."""

from __future__ import annotations

import numpy as np

from ssd_edge.config import SamplingConfig
from ssd_edge.sampling import probs
from ssd_edge.structured.infill_filter import InfillFilter
from ssd_edge.structured.shaping import Shaping

PIECES = [b"", b"ret", b"return", b"re", b"x", b"y", b"z", b"", b"a", b"b", b"c"]  # 0: end of text, 7: an end token
EOT, EOG2 = 0, 7


class Vocab:
    def piece(self, t: int) -> bytes:
        return PIECES[t]

    def is_eog(self, t: int) -> bool:
        return t in (EOT, EOG2)

    def eot(self) -> int:
        return EOT


SAMPLING = SamplingConfig(temperature=1.0, top_k=40, top_p=1.0, min_p=0.0, infill=True)


def row_of(p: dict[int, float]) -> np.ndarray:
    """A row whose softmax is `p` on its tokens (the rest -inf)."""
    row = np.full(len(PIECES), -np.inf, dtype=np.float32)
    for t, q in p.items():
        row[t] = np.log(q)
    return row


def kept(p: dict[int, float], sampling: SamplingConfig = SAMPLING) -> dict[int, float]:
    """What the filter keeps of a row with probabilities p, as the draw then weighs it (temperature 1)."""
    row = row_of(p)
    InfillFilter(sampling, Vocab().piece, Vocab().is_eog, EOT)(row)
    q = probs(row, SamplingConfig(temperature=1.0, top_k=40, top_p=1.0, min_p=0.0))
    return {int(t): round(float(q[t]), 4) for t in np.flatnonzero(q)}


def test_where_the_end_weighs_enough_only_the_end_tokens_are_kept():
    # 3 p_eog n = 3 * 0.1 * 4 = 1.2 > p_text 0.9: the end tokens alone, drawn by their own logits
    assert kept({EOT: 0.06, EOG2: 0.04, 4: 0.5, 5: 0.4}) == {EOT: 0.6, EOG2: 0.4}


def test_a_prefix_is_merged_into_the_likelier_candidate_and_thresholds_follow():
    # no end token: "re" and "ret" merge into "return" (0.3 + 0.1 + 0.05 = 0.45), "x" 0.35 stays, "y" 0.2
    # stays at the first threshold (0.2), then goes at the second (0.2 / 1.0 < 1 / (3 + 1))
    got = kept({2: 0.3, 1: 0.1, 3: 0.05, 4: 0.35, 5: 0.2})
    assert set(got) == {2, 4}
    assert got[2] == round(0.3 / 0.65, 4)  # the draw weighs a kept token by its own logit, not the merged mass


def test_nothing_likely_enough_leaves_the_end_of_text_alone():
    assert kept({4: 0.19, 5: 0.19, 6: 0.18, 8: 0.17, 9: 0.14, 10: 0.13}) == {EOT: 1.0}
    # the same mass on prefixes of one another: "re" and "return" merge into "ret" (0.46), which stays alone
    assert kept({4: 0.19, 5: 0.18, 6: 0.17, 1: 0.16, 3: 0.15, 2: 0.15}) == {1: 1.0}


def test_top_p_and_min_p_cut_first_at_temperature_1():
    # top-p 0.5 keeps "x" (0.6) alone; without it "y" (0.4) would pass both thresholds
    assert kept({4: 0.6, 5: 0.4}) == {4: 0.6, 5: 0.4}
    assert kept({4: 0.6, 5: 0.4}, SAMPLING.model_copy(update=dict(top_p=0.5))) == {4: 1.0}
    assert kept({4: 0.6, 5: 0.4}, SAMPLING.model_copy(update=dict(min_p=0.7))) == {4: 1.0}


def test_the_filter_is_the_last_shaping_and_the_draws_skip_what_it_did():
    bias = SAMPLING.model_copy(update=dict(logit_bias={5: 100.0}, top_p=0.9, min_p=0.05))
    shaping = Shaping(bias, model=Vocab())
    assert shaping.active and shaping.infill is not None
    row = row_of({4: 0.6, 5: 0.4})
    shaping.cursor().shape(row)  # the bias first: "y" then holds nearly all the mass, and the filter keeps it alone
    assert list(np.flatnonzero(np.isfinite(row))) == [5]
    draws = shaping.draws(bias)
    assert (draws.top_p, draws.min_p, draws.top_k, draws.temperature) == (1.0, 0.0, 40, 1.0)
    plain = Shaping(SamplingConfig(), model=Vocab())
    assert plain.infill is None and not plain.active and plain.draws(SamplingConfig()) == SamplingConfig()


def naive_keep(ids, z, pieces, eog, eot):
    """llama.cpp's loop as written (src/llama-sampler.cpp): every pair (i0, i1), in order."""
    n = len(ids)
    p = np.exp(z - z[0])
    p = list(p / p.sum())
    logit = list(z)
    p_eog = sum(q for q, e in zip(p, eog) if e)
    if 3.0 * p_eog * n > sum(p) - p_eog:
        return [int(t) for t, e in zip(ids, eog) if e]
    for i0 in range(n):
        for i1 in range(n):
            if logit[i0] == -np.inf:
                break
            if i0 == i1 or logit[i1] == -np.inf:
                continue
            a, b = pieces[i0], pieces[i1]
            if a and len(a) <= len(b) and b[:len(a)] == a:
                dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)
                p[dst] += p[src]
                logit[src], p[src] = -np.inf, 0.0
    kept = [i for i in range(n) if p[i] >= 0.2 or eog[i]]
    texts = sum(not eog[i] for i in kept)
    if texts == 0:
        return [eot]
    total = sum(p[i] for i in kept)
    return [int(ids[i]) for i in kept if p[i] / total >= 1.0 / (texts + 1) or eog[i]]


def test_the_merge_visits_the_pairs_llama_cpps_loop_would_merge_in_its_order():
    """Only the pairs whose first text is a prefix of the second are visited (the texts sorted): the same
    kept tokens as llama.cpp's loop over every pair, on random candidates over a prefix-rich vocabulary."""
    rng = np.random.default_rng(0)
    words = [b"", b"a", b"ab", b"abc", b"abd", b"b", b"ba", b"a", b"abcd", b"c", b"ca", b"cab"]
    for _ in range(300):
        n = int(rng.integers(2, len(words) + 1))
        pieces = [words[int(i)] for i in rng.choice(len(words), size=n, replace=False)]
        eog = [piece == b"" and rng.random() < 0.5 for piece in pieces]
        z = np.sort(rng.normal(size=n) * float(rng.choice([0.3, 1.0, 3.0])))[::-1]
        ids = np.arange(100, 100 + n)
        f = InfillFilter(SAMPLING, lambda t: pieces[t - 100], lambda t: eog[t - 100], EOT)
        p = np.exp(z - z[0])
        assert f.keep(ids, z, p / p.sum())[0] == naive_keep(ids, z, pieces, eog, EOT), (pieces, eog, z)


def test_a_whole_vocabulary_is_read_as_its_likeliest_candidates_and_quickly():
    """samplers: ["infill"] alone (top-k and top-p off) on a flat 152k row: the filter reads the MOST likeliest
    candidates (llama.cpp's pairwise loop over the whole nucleus would take minutes a token)."""
    import time

    from ssd_edge.structured.infill_filter import MOST

    row = np.random.default_rng(1).normal(size=151_936).astype(np.float32)
    s = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, infill=True)
    f = InfillFilter(s, lambda t: b"w%d" % t, lambda t: t == 0, 0)
    t0 = time.perf_counter()
    ids, _, _ = f.candidates(row)
    f(row)
    assert len(ids) == MOST and time.perf_counter() - t0 < 2.0
    assert list(np.flatnonzero(np.isfinite(row))) == [0]  # nothing near 0.2 in a flat row: the end of text alone
