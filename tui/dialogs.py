"""Modal dialogs that change settings: generation settings (mode, k,
temperature, max tokens), the chat's system prompt, and the model picker."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static, TextArea

from ssd_edge.config import MODES, EngineConfig
from ssd_edge.models.catalog import Catalog, model_path

MODE_HELP = {"ar": "target alone", "sd": "draft model + target", "lookup": "n-gram drafts + target",
             "ssd": "sd + pre-speculation", "auto": "planned each round (default)"}


class Dialog(ModalScreen):
    """Esc cancels; buttons with id 'ok' and 'cancel' do the obvious."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "cancel":
            self.dismiss(None)
        elif event.button.id == "ok":
            self.accept()

    def accept(self) -> None:  # pragma: no cover - every dialog overrides it
        raise NotImplementedError

    def buttons(self, ok: str) -> Horizontal:
        return Horizontal(Button(ok, variant="primary", id="ok"), Button("Cancel", id="cancel"), classes="buttons")


class SettingsScreen(Dialog):
    """Mode, k, temperature and max tokens; `apply` returns an error line or None."""

    def __init__(self, config: EngineConfig, max_tokens: int, apply: Callable[[dict], str | None]) -> None:
        super().__init__()
        self.config, self.max_tokens, self.apply = config, max_tokens, apply

    def compose(self) -> ComposeResult:
        c = self.config
        with Vertical(classes="dialog"):
            yield Label("Generation settings", classes="title")
            yield Label("mode")
            yield Select([(f"{m:<7} {MODE_HELP[m]}", m) for m in MODES], value=c.mode, allow_blank=False, id="mode")
            yield Label("k (most draft tokens per round, 1-32; empty: auto plans it)")
            yield Input("" if c.spec.k is None else str(c.spec.k), id="k", type="integer")
            yield Label("temperature (0 = greedy)")
            yield Input(f"{c.sampling.temperature:g}", id="temperature", type="number")
            yield Label("max tokens per reply")
            yield Input(str(self.max_tokens), id="max_tokens", type="integer")
            yield Static("", id="error", classes="error")
            yield self.buttons("Apply")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.accept()

    def accept(self) -> None:
        try:
            changes = {"mode": self.query_one("#mode", Select).value,
                       "k": int(k) if (k := self.query_one("#k", Input).value.strip()) else None,
                       "temperature": float(self.query_one("#temperature", Input).value),
                       "max_tokens": int(self.query_one("#max_tokens", Input).value)}
        except ValueError:
            self.query_one("#error", Static).update("k and max tokens are whole numbers, temperature a number")
            return
        error = self.apply(changes)
        if error:
            self.query_one("#error", Static).update(error)
        else:
            self.dismiss(changes)


class SystemPromptScreen(Dialog):
    """Edit the current chat's system prompt (takes effect from the next reply)."""

    BINDINGS = [Binding("ctrl+s", "save", "Save")]

    def __init__(self, system: str) -> None:
        super().__init__()
        self.system = system

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("System prompt for this chat", classes="title")
            yield TextArea(self.system, id="system", soft_wrap=True, show_line_numbers=False)
            yield Static("Used from the next reply on. Empty: the model's default.", classes="hint")
            yield self.buttons("Save")

    def action_save(self) -> None:
        self.accept()

    def accept(self) -> None:
        self.dismiss(self.query_one("#system", TextArea).text.strip())


class ModelsScreen(Dialog):
    """Pick a target and a draft from the catalog; dismisses with (target, draft or None)."""

    def __init__(self, catalog: Catalog, config: EngineConfig, models_dir: str | None) -> None:
        super().__init__()
        self.catalog, self.config = catalog, config
        self.models_dir = Path(models_dir) if models_dir else None

    def _options(self) -> list[tuple[str, str]]:
        out = []
        for m in self.catalog.models:
            there = "✓" if model_path(m, self.models_dir).exists() else f"↓ {m.size / 1e9:.1f} GB"
            out.append((f"{m.name:<20} {m.role:<6} {there}", m.name))
        for mc in (self.config.target, self.config.draft):  # a file outside the catalog stays selectable
            if mc is not None and mc.path not in self.catalog.names():
                out.append((f"{Path(mc.path).name} (file)", mc.path))
        return out

    def compose(self) -> ComposeResult:
        options = self._options()
        draft = self.config.draft.path if self.config.draft else "none"
        with Vertical(classes="dialog"):
            yield Label("Models", classes="title")
            yield Label("target")
            yield Select(options, value=self.config.target.path, allow_blank=False, id="target")
            yield Label("draft (must share the target's vocabulary)")
            yield Select([("none (modes ar and lookup only)", "none"), *options], value=draft,
                         allow_blank=False, id="draft")
            yield Static("✓ downloaded · ↓ not downloaded yet (the app offers to pull it)\n"
                         "Loading new models rebuilds the engine; the chat stays.", classes="hint")
            yield self.buttons("Load")

    def accept(self) -> None:
        target = str(self.query_one("#target", Select).value)
        draft = str(self.query_one("#draft", Select).value)
        self.dismiss((target, None if draft == "none" else draft))
