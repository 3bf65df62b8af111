"""The TUI end to end on real weights: the small test pair (SmolLM2-135M and a
truncated draft of it), one thread per model, a few tokens per reply."""

from __future__ import annotations

import pytest

from ssd_edge.config import EngineConfig
from tui.app import SSDEdgeApp
from tui.widgets.panel import Gauge
from pilot import send, wait_for

pytestmark = pytest.mark.real


async def test_real_pair_streams_switches_mode_and_quits(small_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_EDGE_CHATS", str(tmp_path / "chats"))
    target, draft = small_pair
    cfg = EngineConfig.build(target=dict(path=str(target), threads=1), draft=dict(path=str(draft), threads=1),
                             n_ctx=1024, mode="sd")
    app = SSDEdgeApp(cfg, max_tokens=12)
    async with app.run_test(size=(140, 44)) as pilot:
        await wait_for(pilot, lambda: app.phase in ("ready", "failed"), timeout=120)
        assert app.phase == "ready", str(app.query_one("#status").render())
        assert "CPU" in str(app.query_one("#models").render())  # model info and device from the real engine
        await send(pilot, app, "Name three colours.", finish=False)
        await wait_for(pilot, lambda: app.phase == "ready", timeout=120)
        reply = app.chat.messages[-1]
        assert reply.content.strip() and "tokens" in reply.note and "error" not in reply.note
        assert {p for p, _ in reply.spans()} <= {"target", "draft"}
        assert app.query_one("#accept", Gauge).fraction is not None  # sd drafted, so acceptance is known

        await app.run_action("set_mode('ssd')")
        assert app.engine.config.mode == "ssd"
        await send(pilot, app, "And three animals?", finish=False)
        await wait_for(pilot, lambda: app.phase == "ready", timeout=120)
        assert app.chat.messages[-1].content.strip()
        assert app.live.final.mode == "ssd" and app.live.final.prespec.lookups > 0
        assert app.query_one("#hit", Gauge).fraction is not None
        engine = app.engine
        await pilot.press("ctrl+q")
    assert app.return_code == 0 and app.engine is None and engine.target_ctx._closed  # quit closed the engine
