"""Mode auto inside the engine, on the fake backend: the profile's choice runs,
the autopilot switches mode mid-generation when the live numbers say so, and
the output stays exactly the target's greedy output whatever ran."""

from __future__ import annotations

from ssd_edge.config import EngineConfig
from ssd_edge.engine import Engine
from ssd_edge.events import FinishEvent
from ssd_edge.profile import Acceptance, DeviceInfo, ModelId, Profile, ThreadCosts

from fakes import FakeContext, FakeModel

PROMPT = [3, 9, 4, 17, 2]


def engine(disagree_every: int) -> Engine:
    cfg = EngineConfig.build(target=dict(path="fake-target"), draft=dict(path="fake-draft"), n_ctx=512, mode="auto")
    target, draft = FakeModel("target"), FakeModel("draft", disagree_every=disagree_every)
    # decodes as slow as profile() says, 20 times faster: ssd's round planner weighs the times it measures
    draft_ctx = FakeContext(draft, n_ctx=1024, n_seq_max=cfg.prespec.fanout_max + 1,
                            decode_delay=lambda n: (10 + 5 * (n - 1)) / 20_000)
    return Engine.from_parts(cfg, target, FakeContext(target, decode_delay=lambda n: (170 + 20 * (n - 1)) / 20_000),
                             draft, draft_ctx)


def profile(alpha: float, hit: float) -> Profile:
    """A fake device with a cheap draft and a cheap batch: ssd is the best plan at any acceptance
    from about 0.5 up (one thread each), so auto starts with it rather than watching first."""
    return Profile(created="2026-01-01T00:00:00+00:00",
                   device=DeviceInfo(machine="x86_64", cpu="fake", cores=2, llama_cpp_python="0.3.36"),
                   target=ModelId(name="fake-target", size=1), draft=ModelId(name="fake-draft", size=1), k_max=6,
                   costs=[ThreadCosts(target_threads=1, draft_threads=1, target_ms=[170 + 20 * i for i in range(7)],
                                      draft_ms=[10 + 5 * i for i in range(7)], target_overlap=1.05,
                                      draft_overlap=1.05)],
                   acceptance=Acceptance(alpha=alpha, ngram_alpha=0.1, ngram_proposal_rate=0.1, hit_rate=hit))


def run(eng: Engine, mode: str, n: int = 80):
    rounds, fin = [], None
    for ev in eng.generate(tokens=PROMPT, max_tokens=n, mode=mode):
        if isinstance(ev, FinishEvent):
            fin = ev
        else:
            rounds.append(ev.round)
    return rounds, fin


def test_without_a_profile_auto_falls_back_and_says_so_in_the_mode():
    eng = engine(disagree_every=0)
    assert eng.auto_profile() is None       # fake models have no files: no profile, no crash
    assert eng.resolve_mode("auto") == "ssd"


def test_auto_runs_the_profile_choice_and_reports_it():
    eng = engine(disagree_every=0)          # the draft always agrees
    eng.profile = profile(alpha=0.95, hit=0.9)
    rounds, fin = run(eng, "auto")
    _, ref = run(eng, "ar")
    assert fin.tokens == ref.tokens
    assert fin.stats["mode"] == "auto"
    auto = fin.stats["auto"]
    assert auto["mode"] == "ssd" and all(mode == "ssd" for _, mode, _ in auto["switches"])  # k may grow
    assert {r.mode for r in rounds} <= {"ssd", "rolled-back"}
    assert max(r.drafted for r in rounds) == auto["k"]


def test_auto_switches_mid_generation_when_the_draft_disagrees_and_stays_lossless():
    eng = engine(disagree_every=-1)         # a draft that is wrong in unpredictable ways
    eng.profile = profile(alpha=0.95, hit=0.9)  # ... although the probe said it was good
    rounds, fin = run(eng, "auto", n=120)
    _, ref = run(eng, "ar", n=120)
    assert fin.tokens == ref.tokens
    switches = fin.stats["auto"]["switches"]
    assert switches, "the autopilot should leave ssd"
    assert rounds[0].mode in ("ssd", "rolled-back")
    assert rounds[-1].mode in ("ar", "lookup")
    assert fin.stats["auto"]["live"]["alpha"] < 0.5


def test_auto_watches_in_ar_first_when_the_best_plan_depends_on_the_prompt():
    eng = engine(disagree_every=0)
    p = profile(alpha=0.9, hit=0.9)
    c = p.costs[0]
    dear = c.model_copy(update=dict(target_ms=[170 + 90 * i for i in range(7)], draft_ms=[60 + 20 * i for i in range(7)]))
    eng.profile = p.model_copy(update=dict(costs=[dear]))  # the draft pays at alpha 0.95, not at 0.5
    rounds, fin = run(eng, "auto")
    _, ref = run(eng, "ar")
    assert fin.tokens == ref.tokens
    assert fin.stats["auto"]["watched"]
    assert [r.mode for r in rounds[:4]] == ["ar"] * 4
