"""Calibration maths (profile.py), auto's choices on a fake cost model, the
autopilot's re-decisions (autopilot.py), and profile files. No timing here:
every cost is a number written in the test."""

from __future__ import annotations

import math

import pytest

from ssd_edge import profile as prof
from ssd_edge.autopilot import Autopilot, NgramShadow
from ssd_edge.config import EngineConfig
from ssd_edge.drafters import NgramDrafter
from ssd_edge.events import Round
from ssd_edge.profile import (Acceptance, ModelId, Profile, ThreadCosts, alpha_from_mean_accepted, ar_rate,
                              expected_tokens, interp_ms, lookup_rate, prespec_window, sd_rate, ssd_rate)

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


def test_prespec_window_fits_the_branches_under_the_verify():
    draft = [10.0, 20.0, 30.0, 40.0, 50.0]
    # k = 4: the verify of 5 tokens takes 140 ms; w branches cost 4 * (draft(1) + draft(w - 1)):
    # w=3: 4 * (10 + 20) = 120 fits, w=4: 4 * (10 + 30) = 160 does not
    assert prespec_window(4, draft, VERIFY, 1.0, most=5) == 3
    assert prespec_window(4, draft, VERIFY, 1.0, most=2) == 2
    assert prespec_window(4, draft, VERIFY, 2.0, most=5) == 1   # twice as slow while the target runs
    assert prespec_window(4, [40.0, 50.0], VERIFY, 1.0, most=5) == 1  # one branch already fills the shadow


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
    assert 1 <= ch.k <= 8 and 1 <= ch.window <= 4


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
    assert cfg.prespec.fanout_max == ch.window
    ar = fake_profile(alpha=0.0, hit=0.0, ngram_alpha=0.0, proposal=0.0).choose(config(2, 2))
    assert ar.mode == "ar" and ar.apply(config(2, 2, spec=dict(k=5))).spec.k == 5  # ar keeps the configured k


# ---------------------------------------------------------------- the autopilot

def rnd(i: int, speculator: str, drafted: int, accepted: int, prespec=None, mode="ssd") -> Round:
    return Round(i, mode, speculator, prespec, drafted, accepted, 100.0, 90.0, 5.0)


def running(p: Profile, cfg: EngineConfig) -> Autopilot:
    """A pilot running the profile's choice (as after a watch that confirmed the probe)."""
    return Autopilot(p, cfg, p.choose(cfg))


def test_autopilot_starts_with_the_choice_that_holds_at_any_acceptance_and_watches_otherwise():
    p = fake_profile(alpha=0.9, hit=0.85)                   # batches cost little: the draft pays even at 0.5
    pilot = Autopilot.start(p, config(1, 1))
    assert not pilot.watching and pilot.choice.mode in ("sd", "ssd")
    dear = ThreadCosts(target_threads=1, draft_threads=1, target_ms=[170.0 + 90 * i for i in range(9)],
                       draft_ms=[80.0 + 6 * i for i in range(9)], target_overlap=1.05, draft_overlap=1.05)
    p = p.model_copy(update=dict(costs=[dear]))              # every extra token verified costs half a step
    pilot = Autopilot.start(p, config(1, 1))                 # ssd at alpha 0.95, ar at 0.5: watch in ar first
    assert pilot.watching and pilot.choice.mode == "ar"


def test_autopilot_leaves_a_choice_alone_while_the_live_numbers_match_it():
    p = fake_profile(alpha=0.9, hit=0.85)
    pilot = running(p, config(1, 1))
    assert pilot.choice.mode == "ssd"
    history = list(range(100, 140))  # no repeats: the n-gram shadow never proposes
    for i in range(30):
        pilot.round_start(history)
        # about alpha 0.9 at k: accept all k most rounds, hit most lookups
        k = pilot.choice.k
        acc = k if i % 10 else k - 1
        history += list(range(1000 + 10 * i, 1000 + 10 * i + acc + 1))
        assert pilot.round_end(rnd(i, "prespec", k, acc, "hit" if i % 7 else "miss"), history) is None
    assert pilot.switches == []


def test_autopilot_leaves_ssd_when_the_draft_stops_agreeing():
    p = fake_profile(alpha=0.9, hit=0.85, ngram_alpha=0.0, proposal=0.0)
    pilot = running(p, config(2, 2))
    assert pilot.choice.mode in ("ssd", "sd")
    history = list(range(100, 140))
    new = None
    for i in range(60):
        pilot.round_start(history)
        history += [2000 + i]
        pilot.target_confidence([0.9])  # the target is as sure as the probe said; the draft misses anyway
        new = pilot.round_end(rnd(i, "draft", pilot.choice.k or 1, 0, "miss"), history) or new
        if pilot.choice.mode == "ar":
            break
    assert new is not None and pilot.choice.mode == "ar"
    assert pilot.switches and pilot.switches[-1][1] == "ar"
    assert pilot.live().alpha < 0.9  # below the prior after a few rounds of rejections


def test_autopilot_corrects_the_model_by_the_speed_a_plan_measures():
    # The acceptance is what the profile said, but ssd runs at half the speed the model expects
    # (overheads the model does not know), while ar earlier ran as expected: the pilot leaves ssd.
    p = fake_profile(alpha=0.9, hit=0.85, ngram_alpha=0.0, proposal=0.0)
    pilot = running(p, config(1, 1))
    assert pilot.choice.mode == "ssd"
    pilot.speed["ar"] = 1.0
    expected_ms_per_token = 1000.0 / pilot.choice.expected_tokens_per_s
    history = list(range(100, 140))
    for i in range(40):
        pilot.round_start(history)
        k = pilot.choice.k
        history += list(range(5000 + 10 * i, 5000 + 10 * i + k))    # k - 1 of k accepted
        slow = Round(i, "ssd", "prespec", "hit", k, k - 1, 3.0 * expected_ms_per_token * k, 90.0, 5.0)
        pilot.target_confidence([0.9] * k)
        if pilot.round_end(slow, history, 500) is not None:
            break
    assert pilot.choice.mode == "ar"
    assert pilot.speed["ssd"] < 0.6


def test_a_modes_measured_speed_alone_does_not_flatter_the_modes_not_yet_run():
    # Every plan here runs well below the model (per-round overheads): measuring the current one
    # must not make the unmeasured ones look better by comparison.
    p = fake_profile(alpha=0.9, hit=0.85, ngram_alpha=0.0, proposal=0.0)
    pilot = running(p, config(1, 1))
    ms_per_token = 1000.0 / pilot.choice.expected_tokens_per_s / 0.5
    history = list(range(100, 140))
    for i in range(40):
        pilot.round_start(history)
        k = pilot.choice.k
        history += list(range(5000 + 10 * i, 5000 + 10 * i + k))  # k - 1 of k accepted: alpha about 0.9
        pilot.target_confidence([0.9] * k)
        pilot.round_end(Round(i, "ssd", "prespec", "hit", k, k - 1, ms_per_token * k, 90.0, 5.0), history, 500)
    assert pilot.switches == [] and pilot.speed["ssd"] < 0.8


def test_autopilot_switches_to_lookup_when_the_answer_repeats_the_prompt():
    p = fake_profile(alpha=0.6, hit=0.5, ngram_alpha=0.2, proposal=0.2)
    pilot = Autopilot.start(p, config(2, 2))
    assert pilot.choice.mode != "lookup"
    source = list(range(500, 800))           # the prompt holds the text the answer copies
    history = list(source[:50]) + [7, 7] + list(source[:20])
    pos = 20
    for i in range(60):
        pilot.round_start(history)
        take = source[pos:pos + 2]           # the target commits the copied text, 2 tokens a round
        pos += 2
        history += take
        pilot.round_end(rnd(i, "draft", 4, 1, None, mode="sd"), history)
        if pilot.choice.mode == "lookup":
            break
    assert pilot.choice.mode == "lookup"
    assert pilot.live().ngram_alpha > 0.7 and pilot.live().ngram_proposal_rate > 0.4  # up from 0.2


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


def watch_then(confidence: float, rounds: int = 4) -> Autopilot:
    # On average the draft does not pay (alpha 0.5), so ar would be chosen; on code it would.
    p = fake_profile(alpha=0.5, hit=0.5, ngram_alpha=0.0, proposal=0.0)
    pilot = Autopilot.start(p, config(2, 2))
    assert pilot.watching and pilot.prefill_draft and pilot.choice.mode == "ar"
    pilot.draft_read(40)
    history = list(range(100, 140))
    for i in range(rounds):
        pilot.round_start(history)
        history.append(3000 + i)
        pilot.target_confidence([confidence])
        pilot.round_end(rnd(i, "none", 0, 0, None, mode="ar"), history, 200)
    return pilot


def test_autopilot_watches_in_ar_and_speculates_when_the_target_is_confident():
    pilot = watch_then(confidence=1.0)
    assert not pilot.watching and pilot.watched
    assert pilot.choice.mode in ("sd", "ssd") and pilot.switches
    assert pilot.live().alpha > 0.5  # the target's confidence moved the estimate up from the prior


def test_autopilot_watches_and_stays_in_ar_when_the_target_is_unsure():
    pilot = watch_then(confidence=0.3)
    assert pilot.choice.mode == "ar" and not pilot.switches and not pilot.watching
    assert pilot.live().alpha < 0.5


def test_confidence_is_scaled_by_how_well_it_predicted_this_drafts_acceptance():
    # The target is sure of every token, but the draft gets none right: after draft rounds
    # that show it, the target's confidence alone no longer argues for speculating.
    p = fake_profile(alpha=0.9, hit=0.85, ngram_alpha=0.0, proposal=0.0)
    pilot = Autopilot.start(p, config(1, 1))
    history = list(range(100, 140))
    for i in range(12):
        pilot.round_start(history)
        history.append(4000 + i)
        pilot.target_confidence([0.99])
        pilot.round_end(rnd(i, "draft", 3, 0, None, mode="sd"), history, 200)
    assert pilot.choice.mode == "ar"
    assert pilot.calibration.value < 0.5
    assert pilot.live().alpha < 0.5  # confidence 0.99 times a calibration under 0.5


def _lookup_start_then_ngrams_dry_up(history_len: int, remaining: int) -> Autopilot:
    p = fake_profile(alpha=0.95, hit=0.9, ngram_alpha=0.97, proposal=0.97)
    pilot = Autopilot.start(p, config(1, 1))
    assert pilot.choice.mode == "lookup"
    history = [10_000 + i for i in range(history_len)]          # nothing repeats: the shadow finds nothing
    for i in range(60):
        pilot.round_start(history)
        history.append(20_000 + i)
        pilot.round_end(rnd(i, "none", 0, 0, None, mode="lookup"), history, remaining)
    return pilot


def test_autopilot_prices_the_drafts_catch_up_when_switching_into_a_draft_mode():
    # Many tokens to go after a short history: worth letting the draft read the history, then ssd.
    assert _lookup_start_then_ngrams_dry_up(history_len=40, remaining=500).choice.mode == "ssd"
    # A long history and a few tokens left: the draft would spend longer catching up than it saves.
    assert _lookup_start_then_ngrams_dry_up(history_len=3000, remaining=6).choice.mode in ("ar", "lookup")


def test_ngram_shadow_scores_each_proposed_token_as_it_is_decided():
    shadow = NgramShadow(NgramDrafter(1, 3), k=3)
    history = [1, 2, 3, 4, 9, 1, 2]          # "1 2" seen before, followed by 3 4 9
    assert shadow.ask(history) is True       # proposes (3, 4, 9)
    assert shadow.settle(history + [3]) == (1, 0)          # 3 matched; 4 and 9 undecided
    assert shadow.settle(history + [3, 4, 5]) == (1, 1)    # then 4 matched and 9 did not
    assert shadow.settle(history + [3, 4, 5, 6]) == (0, 0) # nothing pending
    assert shadow.ask([5, 6, 7]) is False    # nothing to look up


def test_geometric_estimate_counts_trials_and_blends_the_prior():
    from ssd_edge.autopilot import _Geometric

    g = _Geometric(prior=0.5, weight=4)
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
