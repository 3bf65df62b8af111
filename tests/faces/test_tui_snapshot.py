"""A snapshot of the main screen: the SVG that `App.export_screenshot()` writes,
compared with the committed tests/faces/snapshots/tui_main.svg.

Stable by construction: a fixed clock, the scripted engine's figures (no
wall time), no cursor blink, no notifications. After an intended change of the
look, regenerate and review the picture:

    SSD_EDGE_UPDATE_SNAPSHOTS=1 .venv/bin/pytest tests/faces/test_tui_snapshot.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tui.widgets.chat import PromptInput
from pilot import make_app, send

SNAPSHOT = Path(__file__).parent / "snapshots" / "tui_main.svg"
UPDATE = os.environ.get("SSD_EDGE_UPDATE_SNAPSHOTS") == "1"


async def main_screen_svg() -> str:
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await send(pilot, app, "How does SSD speed up decoding?")
        await pilot.press("f3")  # provenance colours on
        prompt = app.query_one(PromptInput)
        prompt.cursor_blink = False
        app.screen.set_focus(None)
        await pilot.pause()
        return app.export_screenshot(title="ssd-edge")


async def test_main_screen_matches_snapshot(tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_EDGE_CHATS", str(tmp_path / "chats"))
    svg = await main_screen_svg()
    if UPDATE:
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_text(svg, encoding="utf-8")
        pytest.skip(f"snapshot written to {SNAPSHOT}")
    assert SNAPSHOT.exists(), f"no snapshot yet: run with SSD_EDGE_UPDATE_SNAPSHOTS=1 to write {SNAPSHOT}"
    if svg != SNAPSHOT.read_text(encoding="utf-8"):
        actual = tmp_path / "tui_main.actual.svg"
        actual.write_text(svg, encoding="utf-8")
        pytest.fail(f"main screen differs from {SNAPSHOT}; this run's picture: {actual} "
                    "(SSD_EDGE_UPDATE_SNAPSHOTS=1 rewrites the snapshot after an intended change)")


async def test_snapshot_is_stable_between_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_EDGE_CHATS", str(tmp_path / "chats"))
    assert await main_screen_svg() == await main_screen_svg()
