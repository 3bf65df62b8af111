"""Pilot helpers for the TUI tests: an app on the scripted engine (tests/scripted.py)
with a fixed clock, and waits that poll the app instead of sleeping."""

from __future__ import annotations

import asyncio

from scripted import default_config, factory
from tui.app import SSDEdgeApp
from tui.widgets.chat import PromptInput

CLOCK = 1_700_000_000.0
SIZE = (140, 44)


def make_app(engine_factory=None, **kw) -> SSDEdgeApp:
    return SSDEdgeApp(kw.pop("cfg", None) or default_config(), engine_factory=engine_factory or factory(),
                      clock=lambda: CLOCK, **kw)


async def wait_for(pilot, condition, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        if loop.time() > end:
            raise AssertionError("condition not reached")
        await pilot.pause(0.02)


async def mounted(pilot, selector: str):
    """The screen's widget matching selector, once mounted: a dialog's nested
    children mount after the screen itself shows."""
    await wait_for(pilot, lambda: bool(pilot.app.screen.query(selector)))
    return pilot.app.screen.query_one(selector)


async def press_button(pilot, selector: str) -> None:
    """Press a dialog button (not a click: a notification toast may lie over it)."""
    (await mounted(pilot, selector)).press()
    await pilot.pause()


async def send(pilot, app: SSDEdgeApp, text: str, finish: bool = True) -> None:
    await wait_for(pilot, lambda: app.phase == "ready")
    app.query_one(PromptInput).value = text
    await pilot.press("enter")
    if finish:
        await wait_for(pilot, lambda: app.phase == "ready")
