"""The ssd-edge terminal UI: chat on the left, live speculation panel on the right.

    run_app(EngineConfig.build(target=dict(path="qwen2.5-coder-1.5b"), ...))

The conversation itself (the chat, the engine, the reply, the settings, the workers that load,
pull and generate) is a Session (tui/session.py); the app is its face: the widgets, the screens
and dialogs, the keys, and the handlers of what the workers post. Threads: the engine is built
and replies are generated on one engine thread (tui/cores.py: run_app starts it before lowering
the UI thread's priority, so llama.cpp keeps the cores), which the app's worker threads wait on;
models are pulled in a worker thread. They only post messages (tui/messages.py) or fill an Outbox
(tui/stream.py). Every widget is touched from the UI thread alone. A streaming reply is drawn in
frames, at most one per frame interval, each drawing only what changed (tui/frames.py).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from functools import partial
from typing import Any, Callable

from textual import events
from textual.app import App, ComposeResult
from textual.containers import Horizontal
from textual.widgets import Footer, Header, Input, ProgressBar

from ssd_edge.config import MODES, EngineConfig
from ssd_edge.models import catalog
from ssd_edge.models.catalog import load_catalog
from ssd_edge.planning.planner import k_text

from .commands import SSDEdgeCommands
from .cores import EngineThread, urgent_keys_driver, yield_to_the_engine
from .dialogs import ModelsScreen, SettingsScreen, SystemPromptScreen
from .frames import Frames, draw_intervals  # draw_intervals: re-exported (tests/real/test_tui_speed_real.py)
from .keys import KEYS, help_rows
from .logs import logs_to_file
from .loader import EngineFactory, calibrating_engine_factory, default_engine_factory, model_label
from .messages import EngineFailed, EngineLoaded, LogNotice, NoticeHandler, PullFinished, PullProgress, StreamWake
from .screens import ChatsScreen, HelpScreen, MissingModelsScreen
from .session import Session
from .widgets.chat import ChatColumn, PromptInput
from .widgets.panel import LivePanel


class SSDEdgeApp(App[int]):
    """The app: its layout, a reply streaming in, the engine's life (load, pull, switch, settings)
    and the user's verbs (keys, palette, dialogs), each a section below. The state they show and
    change is the session's (tui/session.py); a streaming reply's frames are tui/frames.py's."""

    CSS_PATH = "app.tcss"
    TITLE = "ssd-edge"
    COMMANDS = App.COMMANDS | {SSDEdgeCommands}
    BINDINGS = KEYS

    def __init__(self, config: EngineConfig, *, models_dir: str | None = None,
                 engine_factory: EngineFactory = default_engine_factory, clock: Callable[[], float] = time.time,
                 pull: Callable[..., Any] = catalog.pull, max_tokens: int = 512,
                 engine_thread: EngineThread | None = None, below_engine: bool = False) -> None:
        super().__init__()
        # the engine is built and generates on this thread alone (tui/cores.py: run_app starts it at
        # the process's priority; below_engine: the UI thread lowers itself below it once mounted, and
        # the driver's input thread, left at the engine's priority, acts on Esc and Ctrl+Q at once)
        self._below_engine = below_engine
        if below_engine:
            self.driver_class = urgent_keys_driver(self.driver_class, self.urgent_key)
        self._owns_engine_thread = engine_thread is None
        self.session = Session(config, run_worker=self.run_worker, post=self.post_message,
                               engine_thread=engine_thread or EngineThread(), models_dir=models_dir,
                               engine_factory=engine_factory, clock=clock, pull=pull, max_tokens=max_tokens)
        self.clock = clock
        # save_chat looked up at each call: tui/speedcheck.py's Probe wraps it on the class
        self.reply_frames = Frames(self, self.session, save=lambda: self.save_chat(), ended=self.reply_ended)
        self._shown_info: Any = None    # the engine's model_info the panel shows

    # what tests/pilot.py, tui/speedcheck.py and the tests read off the app: the session's state
    phase = property(lambda self: self.session.phase)
    chat = property(lambda self: self.session.chat)
    engine = property(lambda self: self.session.engine)
    config = property(lambda self: self.session.config)
    live = property(lambda self: self.session.live)
    frames = property(lambda self: self.reply_frames.drawn)  # frames drawn (scripts/tui_speed.py: per second)

    # ------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Header(icon="◆")
        with Horizontal(id="main"):
            yield ChatColumn(id="chat-column")
            yield LivePanel(id="panel")
        yield Footer()

    def on_mount(self) -> None:
        if self._below_engine:  # the driver's threads run by now: its input thread keeps its priority
            writer = getattr(self._driver, "_writer_thread", None)
            lowered = yield_to_the_engine(*([writer] if isinstance(writer, threading.Thread) else []))
            logging.getLogger(__name__).info("leaving the model its cores: %s", lowered)
        self.query_one(LivePanel).fit(self.size.width)
        self.column.show_chat(self.session.chat)
        self.query_one(LivePanel).show_live(self.session.live)
        self.query_one("#prompt").focus()
        self.set_interval(1.0, self._tick)
        self._notices = NoticeHandler(self.post_message)
        logging.getLogger("ssd_edge").addHandler(self._notices)
        self.start_load(self.session.config)

    def on_resize(self, event: events.Resize) -> None:
        self.query_one(LivePanel).fit(event.size.width)

    def on_unmount(self) -> None:
        logging.getLogger("ssd_edge").removeHandler(self._notices)
        if self._owns_engine_thread:
            self.session.engine_thread.close()

    def on_log_notice(self, msg: LogNotice) -> None:
        self.notify(msg.text, severity="error" if msg.error else "warning", timeout=8)

    @property
    def column(self) -> ChatColumn:
        return self.query_one(ChatColumn)

    def save_chat(self) -> None:
        try:
            self.session.save()
        except OSError as e:
            self.column.set_status(f"could not save the chat to {self.session.store.folder}: {e}", error=True)

    # ------------------------------------------------------------ generation
    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "prompt":
            return
        text = event.value.strip()
        if not text:
            return
        if self.session.phase != "ready":
            why = {"generating": "a reply is being written (Esc stops it)", "failed": "no model is loaded (F6)"}
            self.notify(why.get(self.session.phase, "the models are still loading"), severity="warning")
            return
        prompt = self.query_one(PromptInput)
        prompt.remember(text)
        prompt.value = ""
        self.reply_frames.start(self.column.add_exchange(*self.session.ask(text)))
        self.column.show_title(self.session.chat)
        self.save_chat()
        prompt.cursor_blink = False  # a blink is a repaint of its own, twice a second, while the model needs the CPU
        self.column.set_status(f"Writing ({self.session.config.mode})… Esc stops")

    def on_stream_wake(self, _: StreamWake) -> None:
        self.reply_frames.wake()

    def reply_ended(self) -> None:
        """The reply's last frame is drawn: ready for the next prompt, and the settings asked for meanwhile."""
        session = self.session
        if session.engine is not None and getattr(session.engine, "model_info", None) != self._shown_info:
            self.show_models()
        pending = session.end_reply()
        self.query_one(PromptInput).cursor_blink = True
        failed = bool(session.reply and session.reply.note.startswith("error"))
        self.column.set_status(f"Ready · {session.config.mode}", error=failed)
        if pending and (error := self.configure(pending)):
            self.notify(error, title="Settings not applied", severity="error")

    # ------------------------------------------------------------ the engine's life
    # Built in a worker (with load progress), models pulled when missing, switched, reconfigured.
    def start_load(self, config: EngineConfig, old_engine: Any = None) -> None:
        self.session.start_load(config, old_engine)
        self.sub_title = model_label(config)
        panel = self.query_one(LivePanel)
        panel.show_models(None, config, "loading…")
        panel.show_settings(config, self.session.live)
        self.column.set_status(f"Loading {model_label(config)}…")
        self.column.show_progress(total=None)

    def _tick(self) -> None:
        if self.session.phase == "loading":
            self.column.set_status(f"Loading {model_label(self.session.config)}… "
                                   f"{self.clock() - self.session.load_started:.0f} s")

    def on_engine_loaded(self, msg: EngineLoaded) -> None:
        session = self.session
        session.loaded(msg.engine)
        self.sub_title = model_label(session.config)
        self.column.hide_progress()
        self.show_models()
        self.query_one(LivePanel).show_settings(session.config, session.live)
        self.column.set_status(f"Ready · {session.config.mode} · "
                               f"loaded in {self.clock() - session.load_started:.0f} s")

    def show_models(self) -> None:
        """The loaded pair in the panel (again after a reply for which the engine loaded its draft)."""
        engine, config = self.session.engine, self.session.config
        profile = getattr(engine, "auto_profile", lambda: None)()  # read once, cached by the engine
        self._shown_info = engine.model_info
        memory = engine.memory() if hasattr(engine, "memory") else None
        plan = getattr(engine, "budget_plan", None)  # --memory-budget: what it chose
        self.query_one(LivePanel).show_models(self._shown_info, config, regime=profile.regime() if profile else None,
                                              memory=memory, budget=plan.describe(config.memory_budget) if plan else None)

    def on_engine_failed(self, msg: EngineFailed) -> None:
        self.session.failed(msg.exit_code)
        self.column.hide_progress()
        self.query_one(LivePanel).show_models(None, self.session.config, "not loaded")
        if msg.missing:
            self.column.set_status("Models are missing: pull them, or pick others (F6)", error=True)
            self.push_screen(MissingModelsScreen(msg.missing, msg.error, self.session.fallback is not None),
                             partial(self._missing_choice, msg.missing))
        elif self.session.fallback is not None:
            self.notify(msg.error, title="Could not load the models; back to the previous ones", severity="error",
                        timeout=10)
            self.start_load(self.session.take_fallback())
        else:
            self.column.set_status(f"{msg.error}  ·  F6 picks other models · Ctrl+Q quits", error=True)

    def _missing_choice(self, models: list, choice: str | None) -> None:
        if choice == "pull":
            self.start_pull(models)
        elif choice == "pick":
            self.action_pick_models()
        elif choice == "back" and self.session.fallback is not None:
            self.start_load(self.session.take_fallback())
        else:
            self.exit(return_code=self.session.exit_code)

    def start_pull(self, models: list) -> None:
        self.session.start_pull(models)
        self.column.show_progress(total=sum(m.size for m in models), progress=0)
        self.column.set_status("Pulling " + ", ".join(m.name for m in models) + "…")

    def on_pull_progress(self, msg: PullProgress) -> None:
        self.query_one("#progress", ProgressBar).update(total=msg.total, progress=msg.done)
        self.column.set_status(f"{msg.label}  ·  {msg.done / 1e9:.2f} / {msg.total / 1e9:.2f} GB")

    def on_pull_finished(self, msg: PullFinished) -> None:
        self.column.hide_progress()
        error, missing = self.session.pull_ended(msg.error)
        if error is None:
            self.start_load(self.session.config)
            return
        self.column.set_status(error, error=True)
        self.push_screen(MissingModelsScreen(missing, error, self.session.fallback is not None),
                         partial(self._missing_choice, missing))

    def switch_models(self, target: str, draft: str | None) -> None:
        """Rebuild the engine on other models (the chat stays)."""
        was, config = self.session.config.mode, self.session.models_config(target, draft)
        if config.mode != was:
            self.notify(f"no draft model: mode {was} -> {config.mode}")
        self.start_load(config, old_engine=self.session.release_engine())

    def configure(self, changes: dict[str, Any]) -> str | None:
        """Apply mode / k / temperature / max tokens; an error line, or None when applied (or queued)."""
        session = self.session
        if error := session.configure(changes):
            return error
        if session.phase == "generating":
            self.notify("applies when this reply ends")
            return None
        self.query_one(LivePanel).show_settings(session.config, session.live)
        config = session.config
        k = k_text(config.mode, config.spec.k)
        self.column.set_status(f"Ready · {config.mode}{f' · k {k}' if k else ''} · "
                        f"temperature {config.sampling.temperature:g}")
        return None

    # ------------------------------------------------------------ the user's verbs
    def _busy(self, what: str) -> bool:
        if self.session.phase == "generating":
            self.notify(f"a reply is being written: Esc stops it, then {what}", severity="warning")
            return True
        return False

    def urgent_key(self, key: str) -> None:
        """On the driver's input thread, at the engine's priority, as each key is read: Esc (with no
        dialog open) and Ctrl+Q stop the reply and a pull now, where the UI thread, below the engine,
        could take seconds to get a core (tui/cores.py). Only Events are set here; the app then
        handles the key as usual (action_stop, action_quit)."""
        if key == "escape" and self.session.phase == "generating" and len(self.screen_stack) == 1:
            self.session.cancel.set()
        elif key == "ctrl+q":
            self.session.stop()

    def action_stop(self) -> None:
        if self.session.phase == "generating":  # (the cancel may be set already: urgent_key)
            self.session.cancel.set()
            self.column.set_status("Stopping…")

    def action_new_chat(self) -> None:
        if self._busy("start a new chat"):
            return
        self.column.show_chat(self.session.new_chat())
        self.query_one(PromptInput).focus()

    def action_open_chats(self) -> None:
        if self._busy("open another chat"):
            return
        self.push_screen(ChatsScreen(self.session.store.list(), self._delete_chat), self._open_chat)

    def _delete_chat(self, chat_id: str) -> None:
        if self.session.delete_chat(chat_id):  # the open chat is gone: carry on in a fresh one
            self.column.show_chat(self.session.chat)

    def _open_chat(self, chat_id: str | None) -> None:
        if not chat_id:
            return
        try:
            chat = self.session.open_chat(chat_id)
        except (OSError, ValueError, KeyError, TypeError) as e:
            self.notify(f"cannot open chat {chat_id}: {e}", severity="error")
            return
        self.column.show_chat(chat)
        self.column.set_status(f"Opened “{chat.title}” ({len(chat.messages)} messages)")

    def action_system_prompt(self) -> None:
        def done(text: str | None) -> None:
            if text is not None:
                self.session.chat.system = text
                self.column.show_title(self.session.chat)
                self.save_chat()

        self.push_screen(SystemPromptScreen(self.session.chat.system), done)

    def action_toggle_provenance(self) -> None:
        self.column.toggle_provenance()

    def action_settings(self) -> None:
        self.push_screen(SettingsScreen(self.session.config, self.session.max_tokens, self.configure))

    def action_set_mode(self, mode: str) -> None:
        if error := self.configure({"mode": mode}):
            self.notify(error, title="Mode not changed", severity="error")
        else:
            self.notify(f"mode {mode}")

    def action_cycle_mode(self) -> None:
        self.action_set_mode(MODES[(MODES.index(self.session.config.mode) + 1) % len(MODES)])

    def action_pick_models(self) -> None:
        if self._busy("pick models") or self.session.phase in ("loading", "pulling"):
            if self.session.phase != "generating":
                self.notify("wait until the current load or pull ends", severity="warning")
            return
        try:
            cat = load_catalog()
        except (OSError, ValueError) as e:
            self.notify(f"cannot read the model catalog: {e}", severity="error")
            return

        def done(choice: tuple[str, str | None] | None) -> None:
            if choice is not None:
                self.switch_models(*choice)

        self.push_screen(ModelsScreen(cat, self.session.config, self.session.models_dir), done)

    def action_help(self) -> None:
        self.push_screen(HelpScreen(help_rows()))

    def action_screenshot(self) -> None:
        folder = os.environ.get("SSD_EDGE_SCREENSHOTS", os.getcwd())
        name = time.strftime("ssd-edge-%Y%m%d-%H%M%S.svg", time.localtime(self.clock()))
        path = self.save_screenshot(filename=name, path=folder)
        self.notify(f"saved {path}")

    # ------------------------------------------------------------ shutdown
    async def action_quit(self) -> None:
        """Stop what runs (cancel the reply, stop a pull), wait for the workers, save, close the engine."""
        self.session.stop()
        say = self.column.set_status
        await self.session.wait_workers(lambda name: say(f"Quitting: waiting for the {name} worker to stop…"))
        self.reply_frames.frame()  # whatever the reply sent before it stopped
        self.save_chat()
        self.session.close_engine()
        self.exit(return_code=self.session.exit_code if self.session.phase == "failed" else 0)


def run_app(config: EngineConfig, models_dir: str | None = None, calibrate: bool = True,
            max_tokens: int = 512) -> int:
    """Run the TUI until the user quits; returns the process exit code. calibrate: measure the
    device the first time mode auto meets the model pair (see calibrating_engine_factory);
    max_tokens: the most tokens a reply may have (-n; the settings dialog changes it)."""
    engine_thread = EngineThread()  # at this process's priority, before the UI thread lowers its own
    app = SSDEdgeApp(config, models_dir=models_dir, max_tokens=max_tokens, engine_thread=engine_thread,
                     engine_factory=calibrating_engine_factory if calibrate else default_engine_factory,
                     below_engine=True)
    with logs_to_file():
        try:
            app.run()
        finally:
            app.session.close_engine()
            engine_thread.close()
    return app.return_code or 0
