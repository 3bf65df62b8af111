"""The ssd-edge terminal UI: chat on the left, live speculation panel on the right.

    run_app(EngineConfig.build(target=dict(path="qwen2.5-coder-1.5b"), ...))

Threads: the engine is built and replies are generated on one engine thread
(tui/cores.py: run_app starts it before lowering the UI thread's priority, so
llama.cpp keeps the cores), which the app's worker threads wait on; models are
pulled in a worker thread. They only post messages (tui/messages.py) or fill an
Outbox (tui/stream.py). Every widget is touched from the UI thread alone.

A streaming reply is drawn in frames, at most one per frame interval (draw_intervals()):
a frame drains the outbox and redraws only what changed (the reply's open line
when it grew, a screen layout only when its reserved rows ran out); the panel at
most once per panel interval, after the reply's repaint, each gauge and line of it
only when its value changed. On a CPU-only device the model needs every core, and
the UI's work takes from them (issue 24: scripts/tui_speed.py measures it), so
both intervals are longer there. The chat is saved at most SAVE_INTERVAL behind
the screen, and at the reply's end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from functools import partial
from typing import Any, Callable

from textual import events
from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Header, Input, ProgressBar, Static
from textual.worker import Worker

from ssd_edge.config import MODES, EngineConfig, ModelConfig
from ssd_edge.errors import ConfigError
from ssd_edge.models import catalog
from ssd_edge.models.catalog import load_catalog
from ssd_edge.planning.planner import k_text

from .chats import Chat, ChatStore, Message
from .commands import SSDEdgeCommands
from .cores import EngineThread, urgent_keys_driver, yield_to_the_engine
from .dialogs import ModelsScreen, SettingsScreen, SystemPromptScreen
from .keys import KEYS
from .live import LiveModel, finish_note
from .logs import logs_to_file
from .loader import (EngineFactory, calibrating_engine_factory, default_engine_factory, load_engine, missing_models,
                     model_label, pull_models)
from .messages import EngineFailed, EngineLoaded, LogNotice, NoticeHandler, PullFinished, PullProgress, StreamWake
from .screens import ChatsScreen, HelpScreen, MissingModelsScreen
from .stream import Chunk, Failure, Outbox, run_generation
from .widgets.chat import ChatView, MessageView, PromptInput, ProvenanceLegend
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
NARROW_BELOW = 120    # terminal columns below which the live panel is narrow (app.tcss: #panel.-narrow)
SAVE_INTERVAL = 1.0   # seconds between saves of the chat while a reply streams (and once at its end)
EXTRA_KEYS = [("enter", "send the prompt"), ("up / down", "earlier / later prompts"),
              ("ctrl+p", "command palette (modes, dialogs, everything below)"), ("esc (in a dialog)", "close it")]


def draw_intervals(config: EngineConfig) -> tuple[float, float]:
    """(frame, panel) seconds: INTERVALS where the model leaves this CPU cores to spare, else INTERVALS_CPU."""
    from ssd_edge.config import usable_cores
    from ssd_edge.planning.rounds import offloaded

    return INTERVALS if offloaded(config) or usable_cores() > 4 else INTERVALS_CPU


class SSDEdgeApp(App[int]):
    """The app: its layout, a reply streaming in, the engine's life (load, pull, switch, settings)
    and the user's verbs (keys, palette, dialogs), each a section below; state lives here alone."""

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
        self.engine_thread = engine_thread or EngineThread()
        self._below_engine = below_engine
        if below_engine:
            self.driver_class = urgent_keys_driver(self.driver_class, self.urgent_key)
        self._owns_engine_thread = engine_thread is None
        self.config, self.models_dir = config, models_dir
        self.engine_factory, self.clock, self.pull = engine_factory, clock, pull
        self.max_tokens = max_tokens
        self.store = ChatStore()
        self.chat: Chat = self.store.new(clock())
        self.engine: Any = None
        self.phase = "loading"          # loading, pulling, ready, generating, failed
        self.exit_code = 0              # returned when the user quits from a failed state
        self.live = LiveModel()
        self.cancel = threading.Event()
        self.outbox: Outbox | None = None
        self.reply: Message | None = None
        self.reply_view: MessageView | None = None
        self.pending: dict[str, Any] = {}  # settings asked for during a reply, applied after it
        self.fallback: EngineConfig | None = None  # the config to go back to if a model switch fails
        self.jobs: dict[str, Worker] = {}  # the latest worker of each kind: load, pull, generate
        self.pull_cancel = threading.Event()
        self._last_frame = 0.0          # monotonic time of the last frame
        self._frame_due = False         # a frame is scheduled (by _frame_timer, or next in the queue)
        self._frame_timer: Any = None
        self._last_save = 0.0
        self._last_panel = 0.0
        self._frame_interval, self._panel_interval = INTERVALS_CPU
        self._shown_info: Any = None    # the engine's model_info the panel shows
        self.frames = 0                 # frames drawn (scripts/tui_speed.py reports frames per second)
        self._load_started = 0.0

    # ------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Header(icon="◆")
        with Horizontal(id="main"):
            with Vertical(id="chat-column"):
                yield Static("", id="chat-title")
                yield ProvenanceLegend("", id="legend")
                yield ChatView(id="chat")
                yield Static("", id="status")
                yield ProgressBar(total=None, show_eta=False, id="progress")
                yield PromptInput(placeholder="Ask something…  Enter sends · ↑↓ earlier prompts", id="prompt")
            yield LivePanel(id="panel")
        yield Footer()

    def on_mount(self) -> None:
        if self._below_engine:  # the driver's threads run by now: its input thread keeps its priority
            writer = getattr(self._driver, "_writer_thread", None)
            lowered = yield_to_the_engine(*([writer] if isinstance(writer, threading.Thread) else []))
            logging.getLogger(__name__).info("leaving the model its cores: %s", lowered)
        self.fit_panel(self.size.width)
        self.show_chat(self.chat)
        self.query_one(LivePanel).show_live(self.live)
        self.query_one("#prompt").focus()
        self.set_interval(1.0, self._tick)
        self._notices = NoticeHandler(self.post_message)
        logging.getLogger("ssd_edge").addHandler(self._notices)
        self.start_load(self.config)

    def on_resize(self, event: events.Resize) -> None:
        self.fit_panel(event.size.width)

    def fit_panel(self, width: int) -> None:
        """A terminal narrower than NARROW_BELOW columns gets the narrow panel: at 80 columns the full
        one left the chat 26 columns, where code wraps into twice the rows (and a streaming reply lays
        the screen out twice as often)."""
        self.query_one(LivePanel).set_class(width < NARROW_BELOW, "-narrow")

    def on_unmount(self) -> None:
        logging.getLogger("ssd_edge").removeHandler(self._notices)
        if self._owns_engine_thread:
            self.engine_thread.close()

    def on_log_notice(self, msg: LogNotice) -> None:
        self.notify(msg.text, severity="error" if msg.error else "warning", timeout=8)

    def set_status(self, text: str, error: bool = False) -> None:
        status = self.query_one("#status", Static)
        status.update(text)
        status.set_class(error, "error")

    def show_chat(self, chat: Chat) -> None:
        self.chat = chat
        self.query_one(ChatView).show_chat(chat)
        self.show_chat_title()
        prompt = self.query_one(PromptInput)
        for m in chat.messages:
            if m.role == "user":
                prompt.remember(m.content)

    def save_chat(self) -> None:
        if not self.chat.messages:
            return
        self.chat.updated = self.clock()
        try:
            self.store.save(self.chat)
        except OSError as e:
            self.set_status(f"could not save the chat to {self.store.folder}: {e}", error=True)

    # ------------------------------------------------------------ generation
    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "prompt":
            return
        text = event.value.strip()
        if not text:
            return
        if self.phase != "ready":
            why = {"generating": "a reply is being written (Esc stops it)", "failed": "no model is loaded (F6)"}
            self.notify(why.get(self.phase, "the models are still loading"), severity="warning")
            return
        prompt = self.query_one(PromptInput)
        prompt.remember(text)
        prompt.value = ""
        chat_view = self.query_one(ChatView)
        self.chat.messages.append(Message("user", text))
        self.chat.title = self.chat.title or text.splitlines()[0][:80]
        chat_view.add_message(self.chat.messages[-1])
        messages = self.chat.engine_messages()
        self.reply = Message("assistant", "")
        self.chat.messages.append(self.reply)
        self.reply_view = chat_view.add_message(self.reply)
        self.reply_view.streaming = True
        self.show_chat_title()
        self.save_chat()
        self.live.start()
        self.phase = "generating"
        prompt.cursor_blink = False  # a blink is a repaint of its own, twice a second, while the model needs the CPU
        self.set_status(f"Writing ({self.config.mode})… Esc stops")
        self.cancel = threading.Event()
        self.outbox = Outbox(lambda: self.post_message(StreamWake()))
        self._frame_interval, self._panel_interval = draw_intervals(self.config)
        body = partial(self.engine_thread.call,
                       partial(run_generation, self.engine, messages, self.max_tokens, self.cancel, self.outbox))
        self.jobs["generate"] = self.run_worker(body, thread=True, group="generate", exit_on_error=False)

    def show_chat_title(self) -> None:
        title = self.chat.title or "New chat"
        if self.chat.system:
            title += f"  ·  system: {self.chat.system.splitlines()[0][:60]}"
        self.query_one("#chat-title", Static).update(title)

    def on_stream_wake(self, _: StreamWake) -> None:
        """The outbox has items: draw them at the next frame. The outbox is drained only by a frame, and it
        wakes the UI only when a drain emptied it, so the UI wakes at most once per frame however fast
        tokens come (a TokenEvent per round, often 20-40 a second)."""
        if self._frame_due:
            return
        self._frame_due = True
        wait = self._last_frame + self._frame_interval - time.monotonic()
        if wait > 0:
            self._frame_timer = self.set_timer(wait, self.frame)
        else:
            self.call_next(self.frame)

    def frame(self) -> None:
        """One frame of the streaming reply: drain the outbox into the reply and the live model, then
        redraw what changed. At most a frame interval apart; a finished reply is drawn at once."""
        if self._frame_timer is not None:  # a frame was due: this is it (a late one would revive the cursor)
            self._frame_timer.stop()
            self._frame_timer = None
        self._frame_due = False
        self._last_frame = time.monotonic()
        if self.outbox is None or self.reply is None:
            return
        done = grew = False
        for item in self.outbox.drain():
            if isinstance(item, Chunk):
                for prov, text in item.spans:
                    self.reply.add(prov, text)
                    grew = True
                self.live.observe(item.round, item.n_tokens, item.live, item.wall_ms)
            elif isinstance(item, Failure):
                self.reply.note = "error: " + item.message
                self.live.finish(None)
                self.notify(item.message, title="Generation failed", severity="error", timeout=10)
                done = True
            else:  # the FinishEvent
                self.reply.add("target", item.tail)
                self.live.finish(item.stats)
                self.reply.note = finish_note(item.stop_reason, item.stats, item.message)
                done = True
        self.draw(finished=done, grew=grew)

    def draw(self, finished: bool = False, grew: bool = True) -> None:
        """Redraw the streaming reply (when it grew, or ended) and the panel (at most every panel interval,
        each widget only when its value changed); save the chat at most every SAVE_INTERVAL while the
        reply streams, and at its end."""
        self.frames += 1
        if self.reply_view is not None and (grew or finished):
            self.reply_view.streaming = not finished and self.phase == "generating"
            if self.reply_view.refresh_message():
                self.query_one(ChatView).follow()
        now = time.monotonic()
        if finished or now - self._last_panel >= self._panel_interval:
            self._last_panel = now
            # while streaming, after the reply's repaint: Textual repaints the box around everything dirty
            # at once, and the reply (left, bottom) and the gauges (right, top) together span the screen
            if finished:
                self.show_panel()
            else:
                self.call_after_refresh(self.show_panel)
        if finished or now - self._last_save >= SAVE_INTERVAL:
            self._last_save = now
            self.save_chat()
        if finished:
            if self.engine is not None and getattr(self.engine, "model_info", None) != self._shown_info:
                self.show_models()
            self.phase = "ready"
            self.query_one(PromptInput).cursor_blink = True
            self.set_status(f"Ready · {self.config.mode}", error=bool(self.reply and self.reply.note.startswith("error")))
            if self.pending:
                pending, self.pending = self.pending, {}
                if error := self.configure(pending):
                    self.notify(error, title="Settings not applied", severity="error")

    def show_panel(self) -> None:
        panel = self.query_one(LivePanel)
        panel.show_live(self.live)
        panel.show_settings(self.config, self.live)

    # ------------------------------------------------------------ the engine's life
    # Built in a worker (with load progress), models pulled when missing, switched, reconfigured.
    def start_load(self, config: EngineConfig, old_engine: Any = None) -> None:
        self.phase, self.config, self._load_started = "loading", config, self.clock()
        self.sub_title = model_label(config)
        panel = self.query_one(LivePanel)
        panel.show_models(None, config, "loading…")
        panel.show_settings(config, self.live)
        self.set_status(f"Loading {model_label(config)}…")
        bar = self.query_one("#progress", ProgressBar)
        bar.update(total=None)
        bar.display = True

        def body() -> None:
            if old_engine is not None:
                old_engine.close()
            load_engine(self.engine_factory, config, self.models_dir, self.post_message)

        self.jobs["load"] = self.run_worker(partial(self.engine_thread.call, body), thread=True, group="engine",
                                            exit_on_error=False)

    def _tick(self) -> None:
        if self.phase == "loading":
            self.set_status(f"Loading {model_label(self.config)}… {self.clock() - self._load_started:.0f} s")

    def on_engine_loaded(self, msg: EngineLoaded) -> None:
        self.engine, self.phase, self.fallback = msg.engine, "ready", None
        self.config = getattr(msg.engine, "config", self.config)
        self.sub_title = model_label(self.config)  # as loaded: --memory-budget may have dropped the draft
        self.hide_progress()
        self.show_models()
        self.query_one(LivePanel).show_settings(self.config, self.live)
        self.set_status(f"Ready · {self.config.mode} · loaded in {self.clock() - self._load_started:.0f} s")

    def hide_progress(self) -> None:
        """Hide the load/pull bar, and stop it: an indeterminate ProgressBar keeps its animation timer
        (15 refreshes a second) even hidden. (Measured with tui_speed.py pilot: no change to the
        compositor's calls while a reply streams; it is stopped because nothing is left to animate.)"""
        bar = self.query_one("#progress", ProgressBar)
        bar.update(total=1, progress=1)
        bar.display = False

    def show_models(self) -> None:
        """The loaded pair in the panel (again after a reply for which the engine loaded its draft)."""
        profile = getattr(self.engine, "auto_profile", lambda: None)()  # read once, cached by the engine
        self._shown_info = self.engine.model_info
        memory = self.engine.memory() if hasattr(self.engine, "memory") else None
        plan = getattr(self.engine, "budget_plan", None)  # --memory-budget: what it chose
        self.query_one(LivePanel).show_models(self._shown_info, self.config, regime=profile.regime() if profile else None,
                                              memory=memory, budget=plan.describe(self.config.memory_budget) if plan else None)

    def on_engine_failed(self, msg: EngineFailed) -> None:
        self.phase, self.exit_code = "failed", msg.exit_code
        self.hide_progress()
        self.query_one(LivePanel).show_models(None, self.config, "not loaded")
        if msg.missing:
            self.set_status("Models are missing: pull them, or pick others (F6)", error=True)
            self.push_screen(MissingModelsScreen(msg.missing, msg.error, self.fallback is not None),
                             partial(self._missing_choice, msg.missing))
        elif self.fallback is not None:
            self.notify(msg.error, title="Could not load the models; back to the previous ones", severity="error",
                        timeout=10)
            config, self.fallback = self.fallback, None
            self.start_load(config)
        else:
            self.set_status(f"{msg.error}  ·  F6 picks other models · Ctrl+Q quits", error=True)

    def _missing_choice(self, models: list, choice: str | None) -> None:
        if choice == "pull":
            self.start_pull(models)
        elif choice == "pick":
            self.action_pick_models()
        elif choice == "back" and self.fallback is not None:
            config, self.fallback = self.fallback, None
            self.start_load(config)
        else:
            self.exit(return_code=self.exit_code)

    def start_pull(self, models: list) -> None:
        self.phase = "pulling"
        bar = self.query_one("#progress", ProgressBar)
        bar.update(total=sum(m.size for m in models), progress=0)
        bar.display = True
        self.set_status("Pulling " + ", ".join(m.name for m in models) + "…")
        body = partial(pull_models, models, self.models_dir, self.pull, self.pull_cancel, self.post_message)
        self.jobs["pull"] = self.run_worker(body, thread=True, group="pull", exit_on_error=False)

    def on_pull_progress(self, msg: PullProgress) -> None:
        self.query_one("#progress", ProgressBar).update(total=msg.total, progress=msg.done)
        self.set_status(f"{msg.label}  ·  {msg.done / 1e9:.2f} / {msg.total / 1e9:.2f} GB")

    def on_pull_finished(self, msg: PullFinished) -> None:
        self.hide_progress()
        missing = missing_models(self.config, self.models_dir)
        if msg.error or missing:
            self.phase = "failed"
            error = msg.error or "the pull ended but models are still missing"
            self.set_status(error, error=True)
            self.push_screen(MissingModelsScreen(missing, error, self.fallback is not None),
                             partial(self._missing_choice, missing))
        else:
            self.start_load(self.config)

    def switch_models(self, target: str, draft: str | None) -> None:
        """Rebuild the engine on other models (the chat stays)."""
        cfg = self.config
        t = cfg.target.model_copy(update={"path": target})
        d = None
        if draft is not None:
            d = (cfg.draft or ModelConfig(path=draft, threads=cfg.target.threads)).model_copy(update={"path": draft})
        mode = cfg.mode if d is not None or cfg.mode not in ("sd", "ssd") else "lookup"
        if mode != cfg.mode:
            self.notify(f"no draft model: mode {cfg.mode} -> {mode}")
        old, self.engine = self.engine, None
        self.fallback = cfg if old is not None else None
        self.start_load(cfg.model_copy(update={"target": t, "draft": d, "mode": mode}), old_engine=old)

    def configure(self, changes: dict[str, Any]) -> str | None:
        """Apply mode / k / temperature / max tokens; an error line, or None when applied (or queued)."""
        changes = dict(changes)
        max_tokens = changes.pop("max_tokens", self.max_tokens)
        if max_tokens < 1:
            return "max tokens must be at least 1"
        if self.engine is None:
            return "no model is loaded yet"
        if self.phase == "generating":
            self.pending.update(changes, max_tokens=max_tokens)
            self.notify("applies when this reply ends")
            return None
        try:
            self.config = self.engine.configure(**changes)
        except ConfigError as e:
            return str(e)
        self.max_tokens = max_tokens
        self.query_one(LivePanel).show_settings(self.config, self.live)
        k = k_text(self.config.mode, self.config.spec.k)
        self.set_status(f"Ready · {self.config.mode}{f' · k {k}' if k else ''} · "
                        f"temperature {self.config.sampling.temperature:g}")
        return None

    # ------------------------------------------------------------ the user's verbs
    def _busy(self, what: str) -> bool:
        if self.phase == "generating":
            self.notify(f"a reply is being written: Esc stops it, then {what}", severity="warning")
            return True
        return False

    def urgent_key(self, key: str) -> None:
        """On the driver's input thread, at the engine's priority, as each key is read: Esc (with no
        dialog open) and Ctrl+Q stop the reply and a pull now, where the UI thread, below the engine,
        could take seconds to get a core (tui/cores.py). Only Events are set here; the app then
        handles the key as usual (action_stop, action_quit)."""
        if key == "escape" and self.phase == "generating" and len(self.screen_stack) == 1:
            self.cancel.set()
        elif key == "ctrl+q":
            self.cancel.set()
            self.pull_cancel.set()

    def action_stop(self) -> None:
        if self.phase == "generating":  # (the cancel may be set already: urgent_key)
            self.cancel.set()
            self.set_status("Stopping…")

    def action_new_chat(self) -> None:
        if self._busy("start a new chat"):
            return
        self.show_chat(self.store.new(self.clock(), system=self.chat.system))
        self.query_one(PromptInput).focus()

    def action_open_chats(self) -> None:
        if self._busy("open another chat"):
            return
        self.push_screen(ChatsScreen(self.store.list(), self._delete_chat), self._open_chat)

    def _delete_chat(self, chat_id: str) -> None:
        self.store.delete(chat_id)
        if chat_id == self.chat.id:  # the open chat is gone: carry on in a fresh one
            self.show_chat(self.store.new(self.clock(), system=self.chat.system))

    def _open_chat(self, chat_id: str | None) -> None:
        if not chat_id:
            return
        try:
            chat = self.store.load(chat_id)
        except (OSError, ValueError, KeyError, TypeError) as e:
            self.notify(f"cannot open chat {chat_id}: {e}", severity="error")
            return
        self.show_chat(chat)
        self.set_status(f"Opened “{chat.title}” ({len(chat.messages)} messages)")

    def action_system_prompt(self) -> None:
        def done(text: str | None) -> None:
            if text is not None:
                self.chat.system = text
                self.show_chat_title()
                self.save_chat()

        self.push_screen(SystemPromptScreen(self.chat.system), done)

    def action_toggle_provenance(self) -> None:
        chat_view = self.query_one(ChatView)
        on = not chat_view.show_provenance
        chat_view.set_provenance(on)
        self.query_one("#legend").set_class(on, "-on")

    def action_settings(self) -> None:
        self.push_screen(SettingsScreen(self.config, self.max_tokens, self.configure))

    def action_set_mode(self, mode: str) -> None:
        if error := self.configure({"mode": mode}):
            self.notify(error, title="Mode not changed", severity="error")
        else:
            self.notify(f"mode {mode}")

    def action_cycle_mode(self) -> None:
        self.action_set_mode(MODES[(MODES.index(self.config.mode) + 1) % len(MODES)])

    def action_pick_models(self) -> None:
        if self._busy("pick models") or self.phase in ("loading", "pulling"):
            if self.phase != "generating":
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

        self.push_screen(ModelsScreen(cat, self.config, self.models_dir), done)

    def action_help(self) -> None:
        keys = [(b.key.replace("escape", "esc"), b.tooltip or b.description) for b in self.BINDINGS]
        self.push_screen(HelpScreen(EXTRA_KEYS + keys))

    def action_screenshot(self) -> None:
        folder = os.environ.get("SSD_EDGE_SCREENSHOTS", os.getcwd())
        name = time.strftime("ssd-edge-%Y%m%d-%H%M%S.svg", time.localtime(self.clock()))
        path = self.save_screenshot(filename=name, path=folder)
        self.notify(f"saved {path}")

    # ------------------------------------------------------------ shutdown
    async def action_quit(self) -> None:
        """Stop what runs (cancel the reply, stop a pull), wait for the workers, save, close the engine."""
        self.cancel.set()
        self.pull_cancel.set()
        for name, worker in self.jobs.items():
            if worker.is_running:
                self.set_status(f"Quitting: waiting for the {name} worker to stop…")
                with contextlib.suppress(Exception):
                    await worker.wait()
        self.frame()  # whatever the reply sent before it stopped
        self.save_chat()
        self.close_engine()
        self.exit(return_code=self.exit_code if self.phase == "failed" else 0)

    def close_engine(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()


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
            app.close_engine()
            engine_thread.close()
    return app.return_code or 0
