"""The ssd-edge terminal UI: chat on the left, live speculation panel on the right.

    run_app(EngineConfig.build(target=dict(path="qwen2.5-coder-1.5b"), ...))

Threads: the engine is built, models are pulled and replies are generated in
worker threads; they only post messages (tui/messages.py) or fill an Outbox
(tui/stream.py). Every widget is touched from the UI thread alone. Streamed
text is redrawn at most every RENDER_INTERVAL seconds, and the chat is saved
to disk at each redraw, so whatever was shown survives a crash.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Header, Input, ProgressBar, Static
from textual.worker import Worker

from ssd_edge import catalog, paths
from ssd_edge.config import EngineConfig

from .chats import Chat, ChatStore, Message
from .commands import SSDEdgeCommands
from .controls import Controls
from .engine_host import EngineHost
from .live import LiveModel, finish_note
from .loader import EngineFactory
from .messages import LogNotice, NoticeHandler, StreamWake
from .stream import Chunk, Failure, Outbox, run_generation
from .widgets.chat import ChatView, MessageView, PromptInput, ProvenanceLegend
from .widgets.panel import LivePanel

log = logging.getLogger(__name__)

RENDER_INTERVAL = 0.05  # seconds between redraws of streaming text and gauges


def default_engine_factory(config: EngineConfig, models_dir: str | None) -> Any:
    from ssd_edge.engine import Engine  # imported here: loading llama.cpp is the worker's job

    return Engine(config, models_dir=models_dir)


def calibrating_engine_factory(config: EngineConfig, models_dir: str | None) -> Any:
    """The default factory, and the first time mode auto meets the pair on this device, its
    measurement (a longer "loading…"; `ssd-edge calibrate` shows the details)."""
    engine = default_engine_factory(config, models_dir)
    if not engine.plans_with_profile:
        return engine
    from ssd_edge.calibrate import calibrate_first_use, needs_first_use

    try:
        if needs_first_use(engine):
            log.info("first use of this pair on this device: calibrating for mode auto")
            calibrate_first_use(engine)
    except BaseException:
        engine.close()
        raise
    return engine


class SSDEdgeApp(EngineHost, Controls, App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "ssd-edge"
    COMMANDS = App.COMMANDS | {SSDEdgeCommands}
    BINDINGS = [
        Binding("escape", "stop", "Stop", tooltip="stop the reply being written, at once"),
        Binding("ctrl+n", "new_chat", "New chat", tooltip="start an empty chat (keeps the system prompt)"),
        Binding("ctrl+o", "open_chats", "Chats", tooltip="reopen a saved chat, or delete one"),
        Binding("f1", "help", "Help", tooltip="this list"),
        Binding("f2", "system_prompt", "System", tooltip="edit the chat's system prompt"),
        Binding("f3", "toggle_provenance", "Provenance",
                tooltip="colour each token by its origin: target, accepted draft, pre-speculation hit, n-gram"),
        Binding("f4", "settings", "Settings", tooltip="mode, k, temperature, max tokens (no reload)"),
        Binding("f5", "cycle_mode", "Mode", tooltip="next mode: ar, sd, lookup, ssd, auto"),
        Binding("f6", "pick_models", "Models", tooltip="pick target and draft from the catalog (reloads)"),
        Binding("ctrl+s", "screenshot", "Screenshot", show=False,
                tooltip="save an SVG screenshot in the current folder (or $SSD_EDGE_SCREENSHOTS)"),
        Binding("ctrl+q", "quit", "Quit", tooltip="stop the reply, save, close the models, leave"),
    ]

    def __init__(self, config: EngineConfig, *, models_dir: str | None = None,
                 engine_factory: EngineFactory = default_engine_factory, clock: Callable[[], float] = time.time,
                 pull: Callable[..., Any] = catalog.pull, max_tokens: int = 512) -> None:
        super().__init__()
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
        self._last_render = 0.0
        self._render_timer: Any = None
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
        self.show_chat(self.chat)
        self.query_one(LivePanel).show_live(self.live)
        self.query_one("#prompt").focus()
        self.set_interval(1.0, self._tick)
        self._notices = NoticeHandler(self.post_message)
        logging.getLogger("ssd_edge").addHandler(self._notices)
        self.start_load(self.config)

    def on_unmount(self) -> None:
        logging.getLogger("ssd_edge").removeHandler(self._notices)

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
        self.set_status(f"Writing ({self.config.mode})… Esc stops")
        self.cancel = threading.Event()
        self.outbox = Outbox(lambda: self.post_message(StreamWake()))
        body = partial(run_generation, self.engine, messages, self.max_tokens, self.cancel, self.outbox)
        self.jobs["generate"] = self.run_worker(body, thread=True, group="generate", exit_on_error=False)

    def show_chat_title(self) -> None:
        title = self.chat.title or "New chat"
        if self.chat.system:
            title += f"  ·  system: {self.chat.system.splitlines()[0][:60]}"
        self.query_one("#chat-title", Static).update(title)

    def on_stream_wake(self, _: StreamWake) -> None:
        if self.outbox is None or self.reply is None:
            return
        done = False
        for item in self.outbox.drain():
            if isinstance(item, Chunk):
                for prov, text in item.spans:
                    self.reply.add(prov, text)
                self.live.observe(item.round, item.n_tokens, item.live)
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
        if done:
            self.render_stream(finished=True)
        elif time.monotonic() - self._last_render >= RENDER_INTERVAL:
            self.render_stream()
        elif self._render_timer is None:
            self._render_timer = self.set_timer(RENDER_INTERVAL, self.render_stream)

    def render_stream(self, finished: bool = False) -> None:
        """One redraw of the streaming reply and the panel, then a save."""
        if self._render_timer is not None:  # a redraw was due: this is it (a late one would revive the cursor)
            self._render_timer.stop()
            self._render_timer = None
        self._last_render = time.monotonic()
        if self.reply_view is not None:
            self.reply_view.streaming = not finished and self.phase == "generating"
            self.reply_view.refresh_message()
            self.query_one(ChatView).follow()
        panel = self.query_one(LivePanel)
        panel.show_live(self.live)
        panel.show_settings(self.config, self.live)
        self.save_chat()
        if finished:
            self.phase = "ready"
            self.set_status(f"Ready · {self.config.mode}", error=bool(self.reply and self.reply.note.startswith("error")))
            if self.pending:
                pending, self.pending = self.pending, {}
                if error := self.configure(pending):
                    self.notify(error, title="Settings not applied", severity="error")

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
        self.on_stream_wake(StreamWake())  # whatever the reply sent before it stopped
        self.save_chat()
        self.close_engine()
        self.exit(return_code=self.exit_code if self.phase == "failed" else 0)

    def close_engine(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()


@contextlib.contextmanager
def logs_to_file() -> Iterator[Path]:
    """While the app owns the terminal, log records go to a file instead of the
    screen: handlers writing to stderr/stdout (e.g. the CLI's) are set aside and
    put back afterwards."""
    path = paths.home() / "logs" / "tui.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler.setLevel(logging.WARNING)
    saved = []
    for logger in (logging.getLogger(), logging.getLogger("ssd_edge")):
        to_terminal = [h for h in logger.handlers if type(h) is logging.StreamHandler
                       and getattr(h, "stream", None) in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)]
        for h in to_terminal:
            logger.removeHandler(h)
        saved.append((logger, to_terminal, logger.level))
        if logger.level == logging.NOTSET or logger.level > logging.WARNING:
            logger.setLevel(logging.WARNING)
        if logger is logging.getLogger() or not logger.propagate:  # one copy of each record
            logger.addHandler(handler)
    try:
        yield path
    finally:
        for logger, to_terminal, level in saved:
            if handler in logger.handlers:
                logger.removeHandler(handler)
            for h in to_terminal:
                logger.addHandler(h)
            logger.setLevel(level)
        handler.close()


def run_app(config: EngineConfig, models_dir: str | None = None, calibrate: bool = True,
            max_tokens: int = 512) -> int:
    """Run the TUI until the user quits; returns the process exit code. calibrate: measure the
    device the first time mode auto meets the model pair (see calibrating_engine_factory);
    max_tokens: the most tokens a reply may have (-n; the settings dialog changes it)."""
    app = SSDEdgeApp(config, models_dir=models_dir, max_tokens=max_tokens,
                     engine_factory=calibrating_engine_factory if calibrate else default_engine_factory)
    with logs_to_file():
        try:
            app.run()
        finally:
            app.close_engine()
    return app.return_code or 0
