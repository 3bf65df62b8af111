"""The calibration profile (planning/profile.py): measurements only, the cost model the planner
starts from, the thread split it implies, the regime in words, the cache; and the small pieces of
calibrate (bench/calibrate.py) that need no model. Calibrating real models: tests/real."""

from __future__ import annotations

import json

import pytest

from ssd_edge.planning import profile as prof
from ssd_edge.planning.costs import CONTENTION_FLOOR
from ssd_edge.planning.acceptance import NgramShadow
from ssd_edge.planning.profile import Acceptance, ModelId, Profile, ThreadCosts
from ssd_edge.speculation.drafters import NgramDrafter


# ---------------------------------------------------------------- a fake device

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


def test_the_cost_model_starts_from_the_profile_at_the_thread_split():
    p = fake_profile()
    c = p.cost_model(2, 1)
    assert c.target.ms(1) == 105.0 and c.target.ms(4) == 105.0 + 45.0  # the target's curve at 2 threads
    assert c.draft.ms(1) == 80.0                                        # the draft's at 1 thread
    assert c.contention == pytest.approx(1.5)                           # measured at 2+1
    assert p.cost_model(2, 1, offloaded=True).contention == CONTENTION_FLOOR  # a GPU target: next to nothing
    assert p.cost_model(2, 1, step_ms=210.0).target.ms(4) == pytest.approx(300.0)  # scaled to what was timed


def test_the_draft_runs_beside_only_where_the_target_keeps_its_speed():
    """On 2 cores the target at 1 thread beside a busy draft is far slower than at 2 alone: take turns."""
    assert fake_profile().split(2) is None
    # a memory-bound target: 1 thread is as fast as 2, and the draft beside costs it 2%
    flat = fake_profile().model_copy(update=dict(costs=[
        costs(1, 1, step=100.0, draft_step=30.0, overlap=1.02), costs(2, 2, step=99.0, draft_step=20.0, overlap=1.9),
        costs(2, 1, step=99.0, draft_step=30.0, overlap=1.5), costs(1, 2, step=100.0, draft_step=20.0, overlap=1.5)]))
    assert flat.split(2) == (1, 1)
    assert fake_profile().split(8) is None  # nothing measured at 8 threads: no split assumed


def test_a_contention_below_one_is_not_a_valid_profile():
    with pytest.raises(ValueError):
        costs(1, 1, step=100.0, draft_step=30.0, overlap=0.73)


def test_the_regime_in_words():
    assert "verifying 4 tokens costs" in fake_profile().regime()


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
    from ssd_edge.bench.calibrate import _Trials

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
    old = json.loads(p.model_dump_json())
    old["version"] = 1
    path.write_text(json.dumps(old))
    assert prof.load(t, d) is None                   # an older version (contention measured otherwise): again


def test_a_profile_is_keyed_by_the_gpu_offload_and_the_gpus(tmp_path, monkeypatch):
    """A profile measured at one GPU offload is another file than one at another (a changed -ngl or
    -ngld is calibrated again, as first use); every layer on the CPU keys as before (''), as does a
    -ngl on a build without a local GPU. The GPUs llama.cpp sees are part of the device's key."""
    import ssd_edge.llama.library as library
    from ssd_edge.config import EngineConfig

    monkeypatch.setenv("SSD_EDGE_HOME", str(tmp_path))
    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    t.write_bytes(b"x" * 10)
    d.write_bytes(b"y" * 5)

    def config(ngl, ngld=0):
        return EngineConfig.build(target=dict(path=str(t), n_gpu_layers=ngl), draft=dict(path=str(d), n_gpu_layers=ngld))

    monkeypatch.setattr(library, "gpu_offload_supported", lambda: False)
    assert prof.offload_of(config(99)) == prof.offload_of(config(0)) == ""  # nothing offloads on this build
    monkeypatch.setattr(library, "gpu_offload_supported", lambda: True)
    assert prof.offload_of(config(0)) == ""
    assert prof.offload_of(config(-1)) == "-ngl -1 -ngld 0" and prof.offload_of(config(-1, 4)) == "-ngl -1 -ngld 4"
    base = fake_profile().model_copy(update=dict(device=prof.device_info(), target=ModelId.of(t), draft=ModelId.of(d)))
    on_gpu = base.model_copy(update=dict(offload=prof.offload_of(config(-1))))
    paths = {prof.save(base), prof.save(on_gpu)}
    assert len(paths) == 2  # both kept
    assert prof.load(t, d) == base and prof.load(t, d, "-ngl -1 -ngld 0") == on_gpu
    assert prof.load(t, d, "-ngl -1 -ngld 4") is None  # the draft offloaded too: measured again
    cpu = base.device
    assert cpu.gpus == "" and cpu.model_copy(update=dict(gpus="CUDA0 (NVIDIA H200)")).key != cpu.key
    assert cpu.model_copy(update=dict(gpus="")).key == cpu.key


def test_auto_loads_the_draft_only_where_the_profile_says_a_draft_could_pay():
    """engine.Engine asks planning.rounds.draft_can_pay whether mode auto needs the draft model in
    memory at all: not on a compute-bound device (a verify of 4 tokens at 2.7 steps: even a draft
    accepted at 0.9 loses to plain steps), yes where verifying is nearly free, and yes without a
    profile (the first-use calibration measures with it)."""
    from ssd_edge.config import EngineConfig
    from ssd_edge.planning.rounds import draft_can_pay

    def curve(steps):  # ThreadCosts at 1+1 and 2+2 with the target's verify of n tokens at steps[n - 1] x 40 ms
        return [ThreadCosts(target_threads=t, draft_threads=t, target_ms=[40.0 * x for x in steps],
                            draft_ms=[12.0 + 4.0 * i for i in range(9)], target_overlap=1.05, draft_overlap=1.05)
                for t in (1, 2)]
    steep = fake_profile().model_copy(update=dict(costs=curve([1, 1.7, 2.2, 2.7, 3.4, 4.1, 4.8, 5.4, 5.9])))
    flat = fake_profile().model_copy(update=dict(costs=curve([1, 1.37, 1.5, 1.69, 1.72, 1.75, 1.78, 1.8, 1.85])))
    cfg = EngineConfig.build(target=dict(path="t.gguf", threads=2), draft=dict(path="d.gguf", threads=2))
    assert not draft_can_pay(cfg, steep)
    assert draft_can_pay(cfg, flat)
    assert draft_can_pay(cfg, None)
    assert not draft_can_pay(cfg.model_copy(update=dict(draft=None)), flat)
