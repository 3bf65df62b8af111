"""The reply on screen while it streams: drawn in frames, at most one per frame interval.

A frame drains the outbox (Session.take_stream) and redraws only what changed (the reply's open line
when it grew, a screen layout only when its reserved rows ran out); the panel at most once per panel
interval, after the reply's repaint, each gauge and line of it only when its value changed. On a
CPU-only device the model needs every core, and the UI's work takes from them (issue 24:
scripts/tui_speed.py measures it), so both intervals are longer there (draw_intervals()). The chat
is saved at most SAVE_INTERVAL behind the screen, and at the reply's end.

Everything here runs on the UI thread: the worker's only part is the StreamWake its outbox posts.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from textual.app import App

from ssd_edge.config import EngineConfig

from .session import Session
from .widgets.chat import ChatView, MessageView
from .widgets.panel import LivePanel

# Seconds between frames while a reply streams: 10 a second where the model does not need this CPU's
# every core (a GPU or --rpc target, or more than 4 cores), 5 where it does. On this project's 2 cores
# a frame costs the UI thread ~20 ms (Textual's compositor and event loop: scripts/tui_speed.py), so
# 10 frames a second took ~9 ms of CPU per token from llama.cpp's two threads, 5 take ~4 (issue 24).
# Seconds between frames of a streaming reply, and between redraws of the live panel (gauges, rates,
# sparkline): where the model leaves this CPU cores to spare, and where it needs every one (CPU-only, 4
# cores or fewer). On 2 cores a panel redraw cost the UI thread 5-7 ms, a frame of the reply 1-2 ms.
INTERVALS = (0.1, 0.25)
INTERVALS_CPU = (0.2, 0.5)
SAVE_INTERVAL = 1.0   # seconds between saves of the chat while a reply streams (and once at its end)


def draw_intervals(config: EngineConfig) -> tuple[float, float]:
    """(frame, panel) seconds: INTERVALS where the model leaves this CPU cores to spare, else INTERVALS_CPU."""
    from ssd_edge.config import usable_cores
    from ssd_edge.planning.rounds import offloaded

    return INTERVALS if offloaded(config) or usable_cores() > 4 else INTERVALS_CPU


class Frames:
    """The pace and the drawing of the reply being written, in `app`'s widgets. `save` saves the chat;
    `ended` is called once the frame that drew the reply's end has drawn everything else."""

    def __init__(self, app: App, session: Session, *, save: Callable[[], None], ended: Callable[[], None]) -> None:
        self.app, self.session = app, session
        self._save, self._ended = save, ended
        self.reply_view: MessageView | None = None
        self._last_frame = 0.0          # monotonic time of the last frame
        self._frame_due = False         # a frame is scheduled (by _frame_timer, or next in the queue)
        self._frame_timer: Any = None
        self._last_save = 0.0
        self._last_panel = 0.0
        self._frame_interval, self._panel_interval = INTERVALS_CPU
        self.drawn = 0                  # frames drawn (scripts/tui_speed.py reports frames per second)

    def start(self, reply_view: MessageView) -> None:
        """A reply has begun (Session.ask): its view streams, at the pace its config allows."""
        self.reply_view = reply_view
        reply_view.streaming = True
        self._frame_interval, self._panel_interval = draw_intervals(self.session.config)

    def wake(self) -> None:
        """The outbox has items: draw them at the next frame. The outbox is drained only by a frame, and it
        wakes the UI only when a drain emptied it, so the UI wakes at most once per frame however fast
        tokens come (a TokenEvent per round, often 20-40 a second)."""
        if self._frame_due:
            return
        self._frame_due = True
        wait = self._last_frame + self._frame_interval - time.monotonic()
        if wait > 0:
            self._frame_timer = self.app.set_timer(wait, self.frame)
        else:
            self.app.call_next(self.frame)

    def frame(self) -> None:
        """One frame of the streaming reply: drain the outbox into the reply and the live model, then
        redraw what changed. At most a frame interval apart; a finished reply is drawn at once."""
        if self._frame_timer is not None:  # a frame was due: this is it (a late one would revive the cursor)
            self._frame_timer.stop()
            self._frame_timer = None
        self._frame_due = False
        self._last_frame = time.monotonic()
        streamed = self.session.take_stream()
        if streamed is None:
            return
        if streamed.failure is not None:
            self.app.notify(streamed.failure, title="Generation failed", severity="error", timeout=10)
        self.draw(finished=streamed.ended, grew=streamed.grew)

    def draw(self, finished: bool = False, grew: bool = True) -> None:
        """Redraw the streaming reply (when it grew, or ended) and the panel (at most every panel interval,
        each widget only when its value changed); save the chat at most every SAVE_INTERVAL while the
        reply streams, and at its end."""
        self.drawn += 1
        if self.reply_view is not None and (grew or finished):
            self.reply_view.streaming = not finished and self.session.phase == "generating"
            if self.reply_view.refresh_message():
                self.app.query_one(ChatView).follow()
        now = time.monotonic()
        if finished or now - self._last_panel >= self._panel_interval:
            self._last_panel = now
            # while streaming, after the reply's repaint: Textual repaints the box around everything dirty
            # at once, and the reply (left, bottom) and the gauges (right, top) together span the screen
            if finished:
                self.show_panel()
            else:
                self.app.call_after_refresh(self.show_panel)
        if finished or now - self._last_save >= SAVE_INTERVAL:
            self._last_save = now
            self._save()
        if finished:
            self._ended()

    def show_panel(self) -> None:
        panel = self.app.query_one(LivePanel)
        panel.show_live(self.session.live)
        panel.show_settings(self.session.config, self.session.live)
