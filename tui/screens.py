"""Modal screens that show things: help (keys and what the panel means), the
list of saved chats, and the "models not downloaded yet" offer to pull."""

from __future__ import annotations

import time
from typing import Iterable

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, OptionList, Static
from textual.widgets.option_list import Option

from ssd_edge.events import HIT_RATE_HEALTHY, HIT_RATE_POOR
from ssd_edge.models.catalog import CatalogModel

from .chats import ChatSummary
from .widgets.chat import PROVENANCE_COLOURS, PROVENANCE_LABELS

PANEL_HELP = [  # (the panel's label, what it shows): a grid, so that a narrow terminal wraps each in its column
    ("pre-spec hit", f"share of SSD rounds whose draft was ready before the target finished verifying: green at "
                     f"{HIT_RATE_HEALTHY:.0%} or more, yellow in between, red under {HIT_RATE_POOR:.0%}"),
    ("acceptance", "accepted draft tokens / drafted tokens"),
    ("tokens/s", "now: the last few rounds; avg: this reply (the engine's own figure once it ends)"),
    ("per token", "median latency per token on pre-speculation hits and misses (the engine's p50 at the end)"),
    ("util", "share of wall time the draft / target spent computing"),
    ("branch mem", "draft KV cells held by pre-speculation branches, against the budget"),
    ("state", "what served the last round: ar (a plain step), lookup (n-gram), sd (draft), ssd (a prepared "
              "branch), backup (ssd's n-gram), rolled-back (ssd drafting just in time), sla-cut; "
              "\"idle (last: ...)\" between replies"),
]


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def __init__(self, keys: Iterable[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = list(keys)

    def compose(self) -> ComposeResult:
        table, panel = self._grid(self.keys, "bold cyan"), self._grid(PANEL_HELP, "bold")
        legend = Text("provenance colours (F3): ")
        for name, colour in PROVENANCE_COLOURS.items():
            legend.append(f"■ {PROVENANCE_LABELS[name]}  ", colour or "default")
        with VerticalScroll(classes="dialog wide"):
            yield Label("ssd-edge keys", classes="title")
            yield Static(table)
            yield Label("\nThe live panel", classes="title")
            yield Static(panel)
            yield Static(legend)
            yield Static("↑↓ scroll · Esc closes this help.", classes="hint")

    @staticmethod
    def _grid(rows: Iterable[tuple[str, str]], style: str) -> Table:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style=style, no_wrap=True)
        grid.add_column()
        for name, what in rows:
            grid.add_row(name, what)
        return grid


class ChatsScreen(ModalScreen):
    """Saved chats, newest first. Enter opens one (dismisses with its id); Delete removes it."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Close"), Binding("delete", "delete", "Delete chat")]

    def __init__(self, chats: list[ChatSummary], delete) -> None:
        super().__init__()
        self.chats = chats
        self.delete = delete

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("Saved chats", classes="title")
            yield OptionList(*self._options(), id="chats")
            yield Static("Enter opens · Delete removes · Esc closes", classes="hint")

    def _options(self) -> list[Option]:
        if not self.chats:
            return [Option("no saved chats yet", disabled=True)]
        out = []
        for c in self.chats:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.updated))
            out.append(Option(Text.assemble((when, "dim"), "  ", c.title[:70], (f"  ({c.n_messages})", "dim")),
                              id=c.id))
        return out

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option.id:
            self.dismiss(event.option.id)

    def action_delete(self) -> None:
        ol = self.query_one("#chats", OptionList)
        if ol.highlighted is None or not self.chats:
            return
        chat_id = ol.get_option_at_index(ol.highlighted).id
        self.delete(chat_id)
        self.chats = [c for c in self.chats if c.id != chat_id]
        ol.clear_options()
        ol.add_options(self._options())


class MissingModelsScreen(ModalScreen):
    """Dismisses with "pull", "pick", and "back" (to the models loaded before a
    switch, when there are some) or "quit"."""

    BINDINGS = [Binding("escape", "leave", "Back / quit")]

    def __init__(self, models: list[CatalogModel], error: str, can_go_back: bool = False) -> None:
        super().__init__()
        self.models = models
        self.error = error
        self.leave = "back" if can_go_back else "quit"

    def action_leave(self) -> None:
        self.dismiss(self.leave)

    def compose(self) -> ComposeResult:
        total = sum(m.size for m in self.models) / 1e9
        lines = Text(self.error + "\n\n", "dim")
        lines.append("Not downloaded yet:\n", "bold")
        for m in self.models:
            lines.append(f"  {m.name:<20} {m.title} ({m.size / 1e9:.2f} GB)\n")
        lines.append("\nFrom a shell:\n", "bold")
        for m in self.models:
            lines.append(f"  ssd-edge models pull {m.name}\n", "cyan")
        lines.append(f"\nOr pull now from here ({total:.2f} GB, checked by sha256).")
        with Vertical(classes="dialog wide"):
            yield Label("Models are missing", classes="title")
            yield Static(lines, id="missing")
            leave = Button("Back to the previous models", id="back") if self.leave == "back" else \
                Button("Quit", variant="error", id="quit")
            yield Horizontal(Button("Pull now", variant="primary", id="pull"), Button("Pick other models", id="pick"),
                             leave, classes="buttons")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id)
