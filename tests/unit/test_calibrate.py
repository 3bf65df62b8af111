"""Calibration maths (profile.py), the profile's choices on a fake cost model, the
probe's estimators, and profile files. No timing here: every cost is a number
written in the test."""

from __future__ import annotations

import math

import pytest

from ssd_edge.auto import profile as prof
from ssd_edge.auto.planner import NgramShadow
from ssd_edge.auto.profile import (Acceptance, ModelId, Profile, ThreadCosts, alpha_from_mean_accepted, ar_rate,
                                   expected_tokens, interp_ms, lookup_rate, prespec_fanout, sd_rate, ssd_rate)
from ssd_edge.config import EngineConfig
from ssd_edge.speculation.drafters import NgramDrafter

# ---------------------------------------------------------------- pure maths


@pytest.mark.parametrize("alpha,k,expected", [
    (0.0, 4, 1.0),           # nothing accepted: the round still yields the target's own token
    (1.0, 4, 5.0),           # everything accepted: k drafts + the bonus token
    (0.5, 2, 1.75),          # 1 + 0.5 + 0.25
    (0.8, 3, 1 + 0.8 + 0.64 + 0.512),
])
def test_expected_tokens_is_the_geometric_sum(alpha, k, expected):
    assert expected_tokens(alpha, k) == pytest.approx(expected)


@pytest.mark.parametrize("alpha", [0.05, 0.3, 0.6, 0.85, 0.97])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_alpha_from_mean_accepted_inverts_the_capped_geometric(alpha, k):
    mean_accepted = expected_tokens(alpha, k) - 1.0
    assert alpha_from_mean_accepted(mean_accepted, k) == pytest.approx(alpha, abs=1e-6)


def test_alpha_from_mean_accepted_edges():
    assert alpha_from_mean_accepted(0.0, 4) == 0.0
    assert alpha_from_mean_accepted(4.0, 4) == 1.0
    assert alpha_from_mean_accepted(1.0, 0) == 0.0


def test_interp_ms_between_points_and_beyond_the_table():
    costs = [10.0, 14.0, 20.0]          # 1, 2, 3 tokens
    assert interp_ms(costs, 1) == 10.0
    assert interp_ms(costs, 0.5) == 10.0
    assert interp_ms(costs, 2.5) == pytest.approx(17.0)
    assert interp_ms(costs, 5) == pytest.approx(32.0)  # the last slope (6 ms/token) continues
    with pytest.raises(ValueError):
        interp_ms([], 2)


VERIFY = [100.0, 110.0, 120.0, 130.0, 140.0, 150.0, 160.0, 170.0, 180.0]  # target ms for 1..9 tokens


def test_rates_follow_the_formulas_of_the_issue():
    assert ar_rate(VERIFY) == pytest.approx(10.0)
    # sd, alpha 0.8, k 4: E = (1 - 0.8^5) / 0.2 = 3.3616 tokens in 4 * 20 + verify(5 tokens) = 140 ms
    assert sd_rate(0.8, 4, 20.0, VERIFY) == pytest.approx(1000 * 3.3616 / 220)
    # ssd, all hits, draft hidden under the verify: E / verify
    assert ssd_rate(0.8, 4, 1.0, 20.0, VERIFY, 20.0) == pytest.approx(1000 * 3.3616 / 140)
    # ... every miss adds k just-in-time draft steps
    assert ssd_rate(0.8, 4, 0.0, 20.0, VERIFY, 20.0) == pytest.approx(1000 * 3.3616 / 220)
    # ... and a draft slower than the verify sets the pace: max(140, 4 * 50)
    assert ssd_rate(0.8, 4, 1.0, 50.0, VERIFY, 50.0) == pytest.approx(1000 * 3.3616 / 200)
    # lookup that never proposes is ar; one that always proposes k=2 pays verify(3 tokens)
    assert lookup_rate(0.9, 0.0, 4, VERIFY) == pytest.approx(ar_rate(VERIFY))
    assert lookup_rate(0.5, 1.0, 2, VERIFY) == pytest.approx(1000 * 1.75 / 120)


def test_prespec_fanout_fits_the_branches_under_the_verify():
    draft = [10.0, 20.0, 30.0, 40.0, 50.0]
    # k = 4: the verify of 5 tokens takes 140 ms; w branches cost 4 * (draft(1) + draft(w - 1)):
    # w=3: 4 * (10 + 20) = 120 fits, w=4: 4 * (10 + 30) = 160 does not
    assert prespec_fanout(4, draft, VERIFY, 1.0, most=5) == 3
    assert prespec_fanout(4, draft, VERIFY, 1.0, most=2) == 2
    assert prespec_fanout(4, draft, VERIFY, 2.0, most=5) == 1   # twice as slow while the target runs
    assert prespec_fanout(4, [40.0, 50.0], VERIFY, 1.0, most=5) == 1  # one branch already fills the verify


# ---------------------------------------------------------------- choices on a fake cost model

def costs(t: int, d: int, *, step: float, draft_step: float, overlap: float = 1.05, d_overlap: float = 1.05) -> ThreadCosts:
    """A linear fake device: the target costs `step` + 15 ms per extra token; the draft likewise."""
    return ThreadCosts(target_threads=t, draft_threads=d,
                       target_ms=[step + 15.0 * i for i in range(9)],
                       draft_ms=[draft_step + 6.0 * i for i in range(9)],
                       target_overlap=overlap, draft_overlap=d_overlap)


def fake_profile(alpha=0.9, hit=0.8, ngram_alpha=0.3, proposal=0.3) -> Profile:
    return Profile(
        created="2026-01-01T00:00:00+00:00",
        device=prof.DeviceInfo(machine="x86_64", cpu="fake", cores=2, llama_cpp_python="0.3.36"),
        target=ModelId(name="t.gguf", size=1), draft=ModelId(name="d.gguf", size=1), k_max=8,
        costs=[costs(1, 1, step=170.0, draft_step=80.0),
               costs(2, 2, step=105.0, draft_step=45.0, overlap=1.9, d_overlap=1.9),  # oversubscribed when concurrent
               costs(2, 1, step=105.0, draft_step=80.0, overlap=1.5, d_overlap=1.5),
               costs(1, 2, step=170.0, draft_step=45.0, overlap=1.5, d_overlap=1.5)],
        acceptance=Acceptance(alpha=alpha, ngram_alpha=ngram_alpha, ngram_proposal_rate=proposal, hit_rate=hit))


def config(t: int, d: int, **kw) -> EngineConfig:
    return EngineConfig.build(target=dict(path="t.gguf", threads=t), draft=dict(path="d.gguf", threads=d),
                              mode="auto", **kw)


def test_separate_cores_and_a_good_draft_choose_ssd():
    ch = fake_profile(alpha=0.9, hit=0.85).choose(config(1, 1))
    assert ch.mode == "ssd"
    assert (ch.target_threads, ch.draft_threads) == (1, 1)
    assert 1 <= ch.k <= 8 and 1 <= ch.fanout_max <= 4


def test_ssd_hit_rate_is_alpha_to_the_k_unless_measured():
    p = fake_profile(alpha=0.9, hit=0.1)  # the probe's hit rate is not used: it belongs to the probe's alpha
    cfg = config(1, 1)
    ssd = {c.k: c for c in p.rates(cfg) if c.mode == "ssd"}
    derived = {c.k: c for c in p.rates(cfg, p.acceptance.model_copy(update=dict(hit_rate=None))) if c.mode == "ssd"}
    assert all(ssd[k].expected_tokens_per_s == derived[k].expected_tokens_per_s for k in ssd)
    c = p.costs[0]
    v_over = [x * c.target_overlap for x in c.target_ms]
    assert ssd[3].expected_tokens_per_s == pytest.approx(
        ssd_rate(0.9, 3, 0.9 ** 3, c.draft_ms[0], v_over, c.draft_ms[0] * c.draft_overlap))
    measured = {c.k: c for c in p.rates(cfg, p.acceptance.model_copy(update=dict(hit_rate=0.1))) if c.mode == "ssd"}
    assert measured[3].expected_tokens_per_s < ssd[3].expected_tokens_per_s


def test_a_useless_draft_and_no_ngrams_choose_ar():
    ch = fake_profile(alpha=0.02, hit=0.05, ngram_alpha=0.0, proposal=0.0).choose(config(2, 2))
    assert ch.mode == "ar" and ch.target_threads == 2


def test_repetitive_text_chooses_lookup_with_a_long_draft():
    p = fake_profile(alpha=0.5, hit=0.3, ngram_alpha=0.97, proposal=0.95)
    ch = p.choose(config(2, 2))
    assert ch.mode == "lookup"
    assert ch.k >= 6


def test_shared_cores_never_price_ssd_without_its_oversubscription():
    # On shared cores ssd's best split is 1+1 (no fight for cores), not 2+2 with both slowed ~1.9x.
    p = fake_profile(alpha=0.9, hit=0.85)
    ssd = [c for c in p.rates(config(2, 2)) if c.mode == "ssd"]
    best = max(ssd, key=lambda c: c.expected_tokens_per_s)
    assert (best.target_threads, best.draft_threads) != (2, 2)


def test_thread_caps_of_the_config_are_respected():
    p = fake_profile()
    for c in p.rates(config(1, 1)):
        assert c.target_threads == 1 and c.draft_threads == 1
    assert {(c.target_threads, c.draft_threads) for c in p.rates(config(2, 2))} == {(1, 1), (2, 2), (2, 1), (1, 2)}


def test_without_a_draft_model_only_ar_and_lookup_are_candidates():
    cfg = EngineConfig.build(target=dict(path="t.gguf", threads=2), mode="auto")
    assert {c.mode for c in fake_profile().rates(cfg)} == {"ar", "lookup"}


def test_choice_applies_mode_k_threads_and_window_to_a_config():
    ch = fake_profile().choose(config(1, 1))
    cfg = ch.apply(config(2, 2))
    assert cfg.mode == ch.mode and cfg.spec.k == ch.k
    assert (cfg.target.threads, cfg.draft.threads) == (ch.target_threads, ch.draft_threads)
    assert cfg.prespec.fanout_max == ch.fanout_max
    ar = fake_profile(alpha=0.0, hit=0.0, ngram_alpha=0.0, proposal=0.0).choose(config(2, 2))
    assert ar.mode == "ar" and ar.apply(config(2, 2, spec=dict(k=5))).spec.k == 5  # ar keeps the configured k


def test_ar_is_kept_unless_speculation_is_expected_to_win_by_the_margin():
    p = fake_profile(alpha=0.9, hit=0.85)
    cfg = config(2, 2)
    rates = p.rates(cfg)
    ar = max(c.expected_tokens_per_s for c in rates if c.mode == "ar")
    best = max(rates, key=lambda c: c.expected_tokens_per_s)
    assert best.mode != "ar"
    gain = best.expected_tokens_per_s / ar - 1
    assert p.choose(cfg, margin=gain * 0.5).mode == best.mode
    assert p.choose(cfg, margin=gain * 1.5).mode == "ar"


# ---------------------------------------------------------------- the probe's estimators

def test_ngram_shadow_scores_each_proposed_token_as_it_is_decided():
    shadow = NgramShadow(NgramDrafter(1, 3), k=3)
    history = [1, 2, 3, 4, 9, 1, 2]          # "1 2" seen before, followed by 3 4 9
    prop = shadow.ask(history)
    assert prop.tokens == (3, 4, 9) and prop.match == 2  # the passages agree over "1 2" only
    # (position in the proposal, matched, the proposal's match length)
    assert shadow.settle(history + [3]) == [(0, True, 2)]                         # 4 and 9 undecided
    assert shadow.settle(history + [3, 4, 5]) == [(1, True, 2), (2, False, 2)]    # 4 matched, 9 did not
    assert shadow.settle(history + [3, 4, 5, 6]) == []                            # nothing pending
    assert shadow.ask([5, 6, 7]).tokens == ()        # nothing to look up


def test_geometric_estimate_counts_trials_and_blends_the_prior():
    from ssd_edge.auto.calibrate import _Trials

    g = _Trials(prior=0.5, weight=4)
    assert g.value == 0.5
    g.add_round(4, 4)   # 4 successes, no failure (the draft ran out, not rejected)
    g.add_round(4, 1)   # 1 success, 1 failure
    assert g.value == pytest.approx((5 + 4 * 0.5) / (6 + 4))


# ---------------------------------------------------------------- files

def test_profile_round_trips_through_the_cache_and_is_keyed_by_device_and_pair(tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_EDGE_HOME", str(tmp_path))
    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    t.write_bytes(b"x" * 10)
    d.write_bytes(b"y" * 5)
    p = fake_profile().model_copy(update=dict(device=prof.device_info(), target=ModelId.of(t), draft=ModelId.of(d)))
    path = prof.save(p)
    assert path.parent == tmp_path / "profiles" and path.suffix == ".json"
    loaded = prof.load(t, d)
    assert loaded == p
    assert prof.load(d, t) is None                   # another pair
    t.write_bytes(b"x" * 11)
    assert prof.load(t, d) is None                   # the target file changed
    path.write_text("{not json")
    t.write_bytes(b"x" * 10)
    assert prof.load(t, d) is None                   # unreadable: ignored, not a crash


def test_expected_rates_are_finite_for_every_candidate():
    for c in fake_profile(alpha=1.0, hit=1.0, ngram_alpha=1.0, proposal=1.0).rates(config(2, 2)):
        assert math.isfinite(c.expected_tokens_per_s) and c.expected_tokens_per_s > 0
