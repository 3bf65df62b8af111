"""How fast the TUI decodes next to the engine alone, and where the UI thread's time goes (issue 24).

    report = asyncio.run(compare(engine, config, "Write a palindrome check.", max_tokens=64, runs=2))

One loaded engine serves both sides, run after run, interleaved: the engine alone (the events
consumed and dropped, as `ssd-edge generate` does minus the printing) and the real app driven
headless by Textual's Pilot (it renders every frame into a virtual screen; only the terminal
write is skipped). Each side reports the engine's own decode speed (Stats.tokens_per_s); the
ratio TUI / engine is the figure to watch. A `Probe` charges the UI thread's CPU time to what
spent it (the reply's text, the gauges, the sparkline, layout, compositing, saving the chat, the
event hand-off); it only wraps methods while a run lasts, so it measures the shipped code.

scripts/tui_speed.py is the command line around this (and measures in a real terminal, tmux);
tests/real/test_tui_speed_real.py runs it on the small pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
import threading
import time
from typing import Any, Callable, Iterator

from ssd_edge.events import FinishEvent, Stats

from .app import SSDEdgeApp
from .chats import ChatStore
from .frames import Frames
from .widgets.chat import MessageView, PromptInput
from .widgets.panel import Gauge, LivePanel, RateSparkline

# (category, owner, method): each method's CPU time on the UI thread, its callees in other categories excluded
def _targets() -> list[tuple[str, Any, str]]:
    from textual._compositor import Compositor
    from textual.screen import Screen
    from textual.widgets import Static

    return [
        ("reply text", MessageView, "_update_rows"),
        ("gauges", Gauge, "render"),
        ("sparkline", RateSparkline, "render_line"),
        ("other text", Static, "render"),
        ("panel update", LivePanel, "show_live"),
        ("panel update", LivePanel, "show_settings"),
        ("save chat", SSDEdgeApp, "save_chat"),
        ("event hand-off", SSDEdgeApp, "on_stream_wake"),
        ("frame", Frames, "frame"),
        ("layout", Screen, "_refresh_layout"),
        ("compositor", Compositor, "render_update"),
        ("compositor", Compositor, "update_widgets"),
    ]


class Probe:
    """Exclusive CPU seconds (time.thread_time) per category, counted on one thread only."""

    def __init__(self, thread: threading.Thread | None = None) -> None:
        self.thread = thread or threading.current_thread()
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[list[float]] = []  # per active call: [start, time spent in wrapped callees]

    def _wrap(self, category: str, fn: Callable) -> Callable:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is not self.thread:
                return fn(*args, **kwargs)
            frame = [time.thread_time(), 0.0]
            self._stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                self._stack.pop()
                spent = time.thread_time() - frame[0]
                self.seconds[category] = self.seconds.get(category, 0.0) + spent - frame[1]
                self.calls[category] = self.calls.get(category, 0) + 1
                if self._stack:
                    self._stack[-1][1] += spent

        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    @contextlib.contextmanager
    def installed(self) -> Iterator[Probe]:
        saved = []
        for category, owner, name in _targets():
            fn = owner.__dict__.get(name)
            if fn is None or asyncio.iscoroutinefunction(fn):
                continue
            saved.append((owner, name, fn))
            setattr(owner, name, self._wrap(category, fn))
        try:
            yield self
        finally:
            for owner, name, fn in reversed(saved):
                setattr(owner, name, fn)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def engine_run(engine: Any, prompt: str, max_tokens: int) -> FinishEvent:
    """The engine alone on the prompt (as a chat message), its events consumed as they come."""
    finish = None
    for ev in engine.generate(messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens):
        if isinstance(ev, FinishEvent):
            finish = ev
    assert finish is not None
    return finish


async def _until(pilot: Any, condition: Callable[[], bool], timeout: float, poll: float = 0.1) -> None:
    """Wait for the app's state. A plain sleep, not pilot.pause(): that waits for every widget's message
    queue (a call_later to each, ~60 per poll here), UI-thread work the app does not do on its own."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError("the app did not reach the expected state")
        await asyncio.sleep(poll)


async def tui_run(engine: Any, config: Any, prompt: str, max_tokens: int, size: tuple[int, int] = (150, 45),
                  probe: Probe | None = None, chats_dir: str | None = None, timeout: float = 600.0) -> dict[str, Any]:
    """One reply in the real app (headless, Pilot) on an already loaded engine (the app does not close it).
    Returns the engine's Stats, the UI thread's CPU seconds while the reply streamed, and the frames drawn."""
    app = SSDEdgeApp(config, engine_factory=lambda cfg, models_dir: engine, max_tokens=max_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        app.session.store = ChatStore(chats_dir or tmp)
        async with app.run_test(size=size) as pilot:
            await _until(pilot, lambda: app.phase in ("ready", "failed"), timeout)
            if app.phase != "ready":
                raise RuntimeError(str(app.query_one("#status").render()))
            app.query_one(PromptInput).value = prompt
            if probe is not None:
                probe.reset()
            cpu0, t0 = time.thread_time(), time.perf_counter()
            await pilot.press("enter")
            await _until(pilot, lambda: app.phase == "ready" and app.live.final is not None, timeout)
            cpu, wall = time.thread_time() - cpu0, time.perf_counter() - t0
            reply = app.chat.messages[-1]
            return {"stats": app.live.final, "ui_cpu_s": cpu, "wall_s": wall, "frames": getattr(app, "frames", None),
                    "text": reply.content, "runs": [list(r) for r in reply.runs]}


def _summary(stats: Stats) -> dict[str, Any]:
    return {"tokens": stats.tokens, "rounds": stats.rounds, "tokens_per_s": stats.tokens_per_s,
            "decoded": stats.decoded, "end_to_end_tokens_per_s": stats.end_to_end_tokens_per_s,
            "ttft_s": stats.ttft_s, "wall_s": stats.wall_s}


async def compare(engine: Any, config: Any, prompt: str, max_tokens: int, runs: int = 2,
                  size: tuple[int, int] = (150, 45), breakdown: bool = True) -> dict[str, Any]:
    """`runs` pairs of (engine alone, TUI headless), interleaved, on one engine; a JSON-ready report."""
    probe = Probe()
    out: list[dict[str, Any]] = []
    with probe.installed() if breakdown else contextlib.nullcontext():
        for i in range(runs):
            load = os.getloadavg()[0]
            finish = await asyncio.to_thread(engine_run, engine, prompt, max_tokens)
            alone = finish.stats
            ui = await tui_run(engine, config, prompt, max_tokens, size, probe if breakdown else None)
            st: Stats = ui["stats"]
            per_token = 1e3 * ui["ui_cpu_s"] / st.tokens if st.tokens else None
            known = sum(probe.seconds.values())
            parts = {k: round(1e3 * v / st.tokens, 3) for k, v in sorted(probe.seconds.items())} if st.tokens else {}
            if breakdown and st.tokens:
                parts["rest (event loop, timers, input)"] = round(1e3 * max(ui["ui_cpu_s"] - known, 0.0) / st.tokens, 3)
            frames = ui["frames"] if ui["frames"] is not None else probe.calls.get("frame", 0)
            out.append({
                "run": i, "load_avg_1m": load,
                "engine": _summary(alone), "tui": _summary(st),
                "ratio": st.tokens_per_s / alone.tokens_per_s if alone.tokens_per_s and st.decoded and alone.decoded
                else None,
                "same_text": ui["text"] == finish.text, "tui_wall_s": ui["wall_s"],
                "ui_cpu_ms_per_token": per_token, "ui_cpu_share_of_wall": ui["ui_cpu_s"] / ui["wall_s"],
                "frames": frames, "frames_per_s": frames / ui["wall_s"],
                "ui_cpu_ms_per_token_by_part": parts, "calls_by_part": dict(probe.calls) if breakdown else {},
            })
    ratios = [r["ratio"] for r in out if r["ratio"] is not None]
    return {
        "prompt": prompt, "max_tokens": max_tokens, "size": list(size), "mode": config.mode,
        "target": config.target.path, "draft": config.draft.path if config.draft else None,
        "threads": [config.target.threads, config.draft.threads if config.draft else None],
        "cpus": os.cpu_count(), "runs": out,
        "median_ratio": statistics.median(ratios) if ratios else None,
        "median_ui_cpu_ms_per_token": statistics.median(r["ui_cpu_ms_per_token"] for r in out
                                                        if r["ui_cpu_ms_per_token"] is not None) if out else None,
    }
