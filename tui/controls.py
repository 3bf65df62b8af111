"""The app's actions: what the keys, the command palette and the dialogs do.

A mixin of SSDEdgeApp (tui/app.py), kept apart so that the app module holds
the engine and streaming plumbing and this one the user-facing verbs.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from ssd_edge.catalog import load_catalog
from ssd_edge.config import MODES

from .dialogs import ModelsScreen, SettingsScreen, SystemPromptScreen
from .screens import ChatsScreen, HelpScreen
from .widgets.chat import ChatView, PromptInput

if TYPE_CHECKING:  # pragma: no cover
    from .app import SSDEdgeApp

EXTRA_KEYS = [("enter", "send the prompt"), ("up / down", "earlier / later prompts"),
              ("ctrl+p", "command palette (modes, dialogs, everything below)"), ("esc (in a dialog)", "close it")]


class Controls:
    def _busy(self: "SSDEdgeApp", what: str) -> bool:
        if self.phase == "generating":
            self.notify(f"a reply is being written: Esc stops it, then {what}", severity="warning")
            return True
        return False

    def action_stop(self: "SSDEdgeApp") -> None:
        if self.phase == "generating" and not self.cancel.is_set():
            self.cancel.set()
            self.set_status("Stopping…")

    def action_new_chat(self: "SSDEdgeApp") -> None:
        if self._busy("start a new chat"):
            return
        self.show_chat(self.store.new(self.clock(), system=self.chat.system))
        self.query_one(PromptInput).focus()

    def action_open_chats(self: "SSDEdgeApp") -> None:
        if self._busy("open another chat"):
            return
        self.push_screen(ChatsScreen(self.store.list(), self._delete_chat), self._open_chat)

    def _delete_chat(self: "SSDEdgeApp", chat_id: str) -> None:
        self.store.delete(chat_id)
        if chat_id == self.chat.id:  # the open chat is gone: carry on in a fresh one
            self.show_chat(self.store.new(self.clock(), system=self.chat.system))

    def _open_chat(self: "SSDEdgeApp", chat_id: str | None) -> None:
        if not chat_id:
            return
        try:
            chat = self.store.load(chat_id)
        except (OSError, ValueError, KeyError, TypeError) as e:
            self.notify(f"cannot open chat {chat_id}: {e}", severity="error")
            return
        self.show_chat(chat)
        self.set_status(f"Opened “{chat.title}” ({len(chat.messages)} messages)")

    def action_system_prompt(self: "SSDEdgeApp") -> None:
        def done(text: str | None) -> None:
            if text is not None:
                self.chat.system = text
                self.show_chat_title()
                self.save_chat()

        self.push_screen(SystemPromptScreen(self.chat.system), done)

    def action_toggle_provenance(self: "SSDEdgeApp") -> None:
        chat_view = self.query_one(ChatView)
        on = not chat_view.show_provenance
        chat_view.set_provenance(on)
        self.query_one("#legend").set_class(on, "-on")

    def action_settings(self: "SSDEdgeApp") -> None:
        self.push_screen(SettingsScreen(self.config, self.max_tokens, self.configure))

    def action_set_mode(self: "SSDEdgeApp", mode: str) -> None:
        if error := self.configure({"mode": mode}):
            self.notify(error, title="Mode not changed", severity="error")
        else:
            self.notify(f"mode {mode}")

    def action_cycle_mode(self: "SSDEdgeApp") -> None:
        self.action_set_mode(MODES[(MODES.index(self.config.mode) + 1) % len(MODES)])

    def action_pick_models(self: "SSDEdgeApp") -> None:
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

    def action_help(self: "SSDEdgeApp") -> None:
        keys = [(b.key.replace("escape", "esc"), b.tooltip or b.description) for b in self.BINDINGS]
        self.push_screen(HelpScreen(EXTRA_KEYS + keys))

    def action_screenshot(self: "SSDEdgeApp") -> None:
        folder = os.environ.get("SSD_EDGE_SCREENSHOTS", os.getcwd())
        name = time.strftime("ssd-edge-%Y%m%d-%H%M%S.svg", time.localtime(self.clock()))
        path = self.save_screenshot(filename=name, path=folder)
        self.notify(f"saved {path}")
