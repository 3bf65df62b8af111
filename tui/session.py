"""The chat session: what a conversation is and does, apart from the widgets that show it.

    session = Session(config, run_worker=app.run_worker, post=app.post_message, engine_thread=EngineThread(),
                      clock=time.time, pull=catalog.pull)

A Session holds the open chat and its store (tui/chats.py), the engine and its config, the phase
(loading, pulling, ready, generating, failed), the reply being written, the settings asked for while
it is, and the live figures (tui/live.py). Its verbs change that state and start the work: a reply,
a load or a pull, each on a Textual worker thread (the engine's work through the engine thread,
tui/cores.py). The workers report only by filling an Outbox (tui/stream.py) or posting messages
(tui/messages.py); `take_stream` folds what the outbox holds into the reply and the live figures.

Nothing here touches a widget. The app (tui/app.py) calls these verbs on the UI thread, from its
message handlers and actions, and then shows what they changed.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from textual.worker import Worker

from ssd_edge.config import EngineConfig, ModelConfig
from ssd_edge.errors import ConfigError

from .chats import Chat, ChatStore, Message
from .cores import EngineThread
from .live import LiveModel, finish_note
from .loader import EngineFactory, Post, default_engine_factory, load_engine, missing_models, pull_models
from .messages import StreamWake
from .stream import Chunk, Failure, Outbox, run_generation

RunWorker = Callable[..., Worker]  # App.run_worker; `post` is App.post_message, safe from any thread


@dataclass(frozen=True)
class Streamed:
    """What a drain of the outbox did to the reply."""

    grew: bool             # text was added to it
    ended: bool            # its FinishEvent or Failure came
    failure: str | None    # the Failure's line for the user


class Session:
    """One conversation with the loaded engine. Used from the UI thread; the workers it starts touch
    only the Outbox, the engine (on the engine thread) and `post`."""

    def __init__(self, config: EngineConfig, *, run_worker: RunWorker, post: Post, engine_thread: EngineThread,
                 models_dir: str | None = None, engine_factory: EngineFactory = default_engine_factory,
                 clock: Callable[[], float], pull: Callable[..., Any], max_tokens: int = 512) -> None:
        self._run_worker, self._post = run_worker, post
        self.engine_thread = engine_thread  # the engine is built and generates on this thread alone
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
        self.pending: dict[str, Any] = {}  # settings asked for during a reply, applied after it
        self.fallback: EngineConfig | None = None  # the config to go back to if a model switch fails
        self.jobs: dict[str, Worker] = {}  # the latest worker of each kind: load, pull, generate
        self.pull_cancel = threading.Event()
        self.load_started = 0.0         # clock() when the latest load began

    def _start(self, kind: str, body: Callable[[], None], group: str) -> None:
        self.jobs[kind] = self._run_worker(body, thread=True, group=group, exit_on_error=False)

    # ------------------------------------------------------------ the chat
    def save(self) -> None:
        """Save the open chat (once it has a message), stamped now; OSError when the store cannot."""
        if not self.chat.messages:
            return
        self.chat.updated = self.clock()
        self.store.save(self.chat)

    def new_chat(self) -> Chat:
        """A fresh chat, with the open one's system prompt."""
        self.chat = self.store.new(self.clock(), system=self.chat.system)
        return self.chat

    def open_chat(self, chat_id: str) -> Chat:
        """The saved chat `chat_id`, now the open one (OSError, ValueError, KeyError, TypeError: unreadable)."""
        self.chat = self.store.load(chat_id)
        return self.chat

    def delete_chat(self, chat_id: str) -> bool:
        """Delete a saved chat; True when it was the open one (the session then carries on in a fresh one)."""
        self.store.delete(chat_id)
        if chat_id == self.chat.id:
            self.new_chat()
            return True
        return False

    # ------------------------------------------------------------ a reply
    def ask(self, text: str) -> tuple[Message, Message]:
        """The user's prompt and its reply, added to the chat; the reply (empty) is written from now on by
        a worker, into the outbox, which posts StreamWake when it goes from empty to not."""
        asked = Message("user", text)
        self.chat.messages.append(asked)
        self.chat.title = self.chat.title or text.splitlines()[0][:80]
        messages = self.chat.engine_messages()
        self.reply = Message("assistant", "")
        self.chat.messages.append(self.reply)
        self.live.start()
        self.phase = "generating"
        self.cancel = threading.Event()
        self.outbox = Outbox(lambda: self._post(StreamWake()))
        body = partial(self.engine_thread.call,
                       partial(run_generation, self.engine, messages, self.max_tokens, self.cancel, self.outbox))
        self._start("generate", body, group="generate")
        return asked, self.reply

    def take_stream(self) -> Streamed | None:
        """Drain the outbox into the reply and the live figures; None when no reply was ever started."""
        if self.outbox is None or self.reply is None:
            return None
        grew = ended = False
        failure = None
        for item in self.outbox.drain():
            if isinstance(item, Chunk):
                for prov, text in item.spans:
                    self.reply.add(prov, text)
                    grew = True
                self.live.observe(item.round, item.n_tokens, item.live, item.wall_ms)
            elif isinstance(item, Failure):
                self.reply.note = "error: " + item.message
                self.live.finish(None)
                failure = item.message
                ended = True
            else:  # the FinishEvent
                self.reply.add("target", item.tail)
                self.live.finish(item.stats)
                self.reply.note = finish_note(item.stop_reason, item.stats, item.message)
                ended = True
        return Streamed(grew, ended, failure)

    def end_reply(self) -> dict[str, Any]:
        """The reply is drawn to its end: ready again. Returns the settings queued during it (to configure)."""
        self.phase = "ready"
        pending, self.pending = self.pending, {}
        return pending

    def configure(self, changes: dict[str, Any]) -> str | None:
        """Apply mode / k / temperature / max tokens; an error line, or None when applied, or queued in
        `pending` while a reply is being written (end_reply hands them back)."""
        changes = dict(changes)
        max_tokens = changes.pop("max_tokens", self.max_tokens)
        if max_tokens < 1:
            return "max tokens must be at least 1"
        if self.engine is None:
            return "no model is loaded yet"
        if self.phase == "generating":
            self.pending.update(changes, max_tokens=max_tokens)
            return None
        try:
            self.config = self.engine.configure(**changes)
        except ConfigError as e:
            return str(e)
        self.max_tokens = max_tokens
        return None

    # ------------------------------------------------------------ the engine's life
    def start_load(self, config: EngineConfig, old_engine: Any = None) -> None:
        """Build the engine for `config` on the engine thread, closing `old_engine` there first;
        EngineLoaded or EngineFailed is posted when it is done."""
        self.phase, self.config, self.load_started = "loading", config, self.clock()

        def body() -> None:
            if old_engine is not None:
                old_engine.close()
            load_engine(self.engine_factory, config, self.models_dir, self._post)

        self._start("load", partial(self.engine_thread.call, body), group="engine")

    def loaded(self, engine: Any) -> None:
        self.engine, self.phase, self.fallback = engine, "ready", None
        self.config = getattr(engine, "config", self.config)  # as loaded: --memory-budget may have dropped the draft

    def failed(self, exit_code: int | None = None) -> None:
        """No engine: a load or a pull failed (`exit_code`: the load's, returned when the user quits now)."""
        self.phase = "failed"
        if exit_code is not None:
            self.exit_code = exit_code

    def take_fallback(self) -> EngineConfig | None:
        """The config to go back to after a failed switch (once: it is forgotten here)."""
        config, self.fallback = self.fallback, None
        return config

    def start_pull(self, models: list) -> None:
        """Download `models` on a worker; PullProgress and then PullFinished are posted."""
        self.phase = "pulling"
        self._start("pull", partial(pull_models, models, self.models_dir, self.pull, self.pull_cancel, self._post),
                    group="pull")

    def pull_ended(self, error: str | None) -> tuple[str | None, list]:
        """After a pull (`error`: why it failed): (None, []) when the config's models are all there now,
        else the line to show and the models still missing, the session failed."""
        missing = missing_models(self.config, self.models_dir)
        if error or missing:
            self.failed()
            return error or "the pull ended but models are still missing", missing
        return None, []

    def models_config(self, target: str, draft: str | None) -> EngineConfig:
        """The config on other models: the same settings, and mode lookup where sd or ssd lose their draft."""
        cfg = self.config
        t = cfg.target.model_copy(update={"path": target})
        d = None
        if draft is not None:
            d = (cfg.draft or ModelConfig(path=draft, threads=cfg.target.threads)).model_copy(update={"path": draft})
        mode = cfg.mode if d is not None or cfg.mode not in ("sd", "ssd") else "lookup"
        return cfg.model_copy(update={"target": t, "draft": d, "mode": mode})

    def release_engine(self) -> Any:
        """The engine, no longer the session's (for start_load to close); its config is the fallback."""
        old, self.engine = self.engine, None
        self.fallback = self.config if old is not None else None
        return old

    # ------------------------------------------------------------ stopping
    def stop(self) -> None:
        """Stop the reply and a pull (safe from any thread: only Events are set)."""
        self.cancel.set()
        self.pull_cancel.set()

    async def wait_workers(self, waiting: Callable[[str], None]) -> None:
        """Wait for every running worker, telling `waiting` the kind of each before its wait."""
        for name, worker in self.jobs.items():
            if worker.is_running:
                waiting(name)
                with contextlib.suppress(Exception):
                    await worker.wait()

    def close_engine(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()
