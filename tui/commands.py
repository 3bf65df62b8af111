"""The app's own commands in Textual's command palette (Ctrl+P): switch mode,
open dialogs, new chat, stop, screenshot. Each command calls an app action,
so the palette, the keys and the help screen do the same thing."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from ssd_edge.config import MODES

from .dialogs import MODE_HELP

COMMANDS: list[tuple[str, str, str]] = [  # (title, action, help)
    *[(f"Mode: {m}", f"set_mode('{m}')", f"switch to {m} ({MODE_HELP[m]}) without reloading") for m in MODES],
    ("New chat", "new_chat", "start an empty chat (Ctrl+N)"),
    ("Open a saved chat", "open_chats", "list saved chats (Ctrl+O)"),
    ("System prompt", "system_prompt", "edit this chat's system prompt (F2)"),
    ("Settings: mode, k, temperature", "settings", "generation settings (F4)"),
    ("Pick models", "pick_models", "choose target and draft from the catalog (F6)"),
    ("Toggle provenance colours", "toggle_provenance", "colour tokens by where they came from (F3)"),
    ("Stop generation", "stop", "cancel the reply being written (Esc)"),
    ("Save screenshot", "screenshot", "write an SVG of the screen to the current folder (Ctrl+S)"),
    ("Help: keys", "help", "every key and what the panel shows (F1)"),
]


class SSDEdgeCommands(Provider):
    async def _run(self, action: str) -> None:
        await self.app.run_action(action)

    async def discover(self) -> Hits:
        for title, action, help_text in COMMANDS:
            yield DiscoveryHit(title, partial(self._run, action), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, action, help_text in COMMANDS:
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), partial(self._run, action), text=title, help=help_text)
