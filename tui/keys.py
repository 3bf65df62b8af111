"""The app's keys: each binding, the action it runs, and the tooltip the footer and F1 show."""

from __future__ import annotations

from textual.binding import Binding

KEYS = [
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

# Keys that are not the app's bindings (the prompt's, the palette's, the dialogs'): F1 lists them first.
EXTRA_KEYS = [("enter", "send the prompt"), ("up / down", "earlier / later prompts"),
              ("ctrl+p", "command palette (modes, dialogs, everything below)"), ("esc (in a dialog)", "close it")]


def help_rows() -> list[tuple[str, str]]:
    """(key, what it does) for the help screen (F1): EXTRA_KEYS, then every binding's tooltip."""
    return EXTRA_KEYS + [(b.key.replace("escape", "esc"), b.tooltip or b.description) for b in KEYS]
