"""Calibration on the small real pair: it measures, saves a profile that the
engine then finds for mode auto, and leaves the engine as it found it."""

from __future__ import annotations

import pytest

from ssd_edge.bench import calibrate
from ssd_edge.planning import profile
from ssd_edge.events import FinishEvent

from conftest import make_engine


@pytest.mark.real
def test_calibration_measures_saves_and_auto_uses_it(small_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_EDGE_HOME", str(tmp_path))
    eng = make_engine(small_pair, mode="sd")
    try:
        steps = []
        prof, measured = calibrate.ensure_profile(eng, k_max=2, reps=1, probe_tokens=8, pairs=2,
                                                  progress=lambda what, frac: steps.append(frac))
        assert measured and steps[-1] == 1.0 and steps == sorted(steps)
        cores = profile.device_info().cores
        assert {c.split for c in prof.costs} == {(t, d) for t in calibrate.thread_options(cores)
                                                 for d in calibrate.thread_options(cores)}
        for c in prof.costs:
            assert len(c.target_ms) == 3 and len(c.draft_ms) == 3 and min(c.target_ms + c.draft_ms) > 0
        assert 0.0 <= prof.acceptance.alpha <= 1.0
        assert eng.threads == (1, 1)   # restored
        # a second call finds the saved file; a fresh engine on the same pair loads it for auto
        again, measured = calibrate.ensure_profile(eng)
        assert not measured and again == prof
        fresh = make_engine(small_pair, profiles=True, mode="auto")
        try:
            assert fresh.auto_profile() == prof
            evs = list(fresh.generate("def add(a, b):", max_tokens=12))
            fin = evs[-1]
            assert isinstance(fin, FinishEvent) and fin.stats.mode == "auto" and fin.stats.auto is not None
            # auto is capped by the config; it loaded the draft only if the profile says a draft can pay
            # (this pair's draft costs nearly a target step: nowhere)
            assert fresh.threads[0] == 1 and fresh.draft_loaded == fresh.uses_draft("auto")
            assert fresh.threads[1] in ((1,) if fresh.draft_loaded else (None,))
        finally:
            fresh.close()
    finally:
        eng.close()
