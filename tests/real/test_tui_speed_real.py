"""The TUI next to the engine alone on the small pair (issue 24): the real app, headless (Pilot), and the
engine's own loop, back to back on one engine and one prompt (tui/speedcheck.py, the core of
scripts/tui_speed.py).

What is asserted is structure, not speed: the same answer through both faces, the frames bounded by the
frame clock, the UI's CPU time charged to its parts. The speed ratio (TUI / engine decode tokens/s) is
reported, in the test's output and its junit properties, not asserted: on a shared 2-core machine one
run's wall-clock figures can move by more than any bound worth asserting (the house rule: no timed
asserts). scripts/tui_speed.py measures it on the default pair, in a real terminal too."""

from __future__ import annotations

import json

import pytest

from tui.app import draw_intervals
from tui.speedcheck import compare

pytestmark = pytest.mark.real

PROMPT = "Name three colours and say why each one is nice."


async def test_tui_and_engine_alone_on_one_prompt(small_engine, record_property):
    config = small_engine.configure(mode="sd")  # drafts every round: the gauges move in every frame
    report = await compare(small_engine, config, PROMPT, max_tokens=48, runs=1, size=(150, 45))
    print(json.dumps(report))
    record_property("tui_speed", json.dumps(report))
    run = report["runs"][0]
    assert run["same_text"] and run["tui"]["tokens"] == run["engine"]["tokens"] > 1  # one answer, both faces
    assert run["tui"]["decoded"] and run["ratio"] is not None and run["ratio"] > 0  # reported: see above
    # the frame clock: at most one frame per frame interval (5 a second on this CPU), plus the last one (a
    # finished reply draws at once)
    assert 1 <= run["frames"] <= run["tui_wall_s"] / draw_intervals(config)[0] + 2
    parts = run["ui_cpu_ms_per_token_by_part"]
    assert {"reply text", "compositor", "gauges"} <= set(parts) and all(v >= 0 for v in parts.values())
    assert run["ui_cpu_ms_per_token"] > 0
