"""The chat column: the conversation (one widget per message) and the prompt input.

A message widget renders its `chats.Message` on demand; the app calls
`refresh_message()` at most once per frame while text streams in, and the
screen is laid out again only when the message's height changed. With
provenance on, each piece of an answer is coloured by where its tokens came
from: the target itself, an accepted draft, a pre-speculation hit, an n-gram.
"""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Input, Static

from ..chats import Chat, Message

PROVENANCES = ("target", "draft", "prespec", "ngram")
PROVENANCE_LABELS = {"target": "target", "draft": "accepted draft", "prespec": "pre-speculation hit",
                     "ngram": "n-gram"}
# Colours, also used by the help screen's legend; the target keeps the normal text colour ("").
PROVENANCE_COLOURS = {"target": "", "draft": "#5fafff", "prespec": "#5fd75f", "ngram": "#d787d7"}
_PROVENANCE_CSS = "\n".join(f"{{owner}} > .message--{p} {{{{ color: {c or '$foreground'}; }}}}"
                             for p, c in PROVENANCE_COLOURS.items())

WELCOME = ("Type a prompt below and press Enter.\n"
           "Esc stops a reply · F3 shows where each token came from · F1 lists every key · Ctrl+P commands")


class MessageView(Widget):
    """One chat message; its height follows its text."""

    COMPONENT_CLASSES = {f"message--{p}" for p in PROVENANCES} | {"message--note", "message--role"}
    DEFAULT_CSS = "MessageView { height: auto; }\n" + _PROVENANCE_CSS.format(owner="MessageView")

    def __init__(self, message: Message, show_provenance: bool = False) -> None:
        super().__init__(classes=message.role)
        self.message = message
        self.show_provenance = show_provenance
        self.streaming = False

    def refresh_message(self) -> bool:
        """Redraw after the message changed. Returns True when its height changed, and only then asks for
        a layout of the screen (most frames add text to the last line: a repaint of this widget does)."""
        height, width = self.content_size.height, self.content_size.width
        self.refresh()
        if width and self.get_content_height(self.size, self.size, width) == height:
            return False
        self.refresh(layout=True)
        return True

    def render(self) -> Text:
        m = self.message
        text = Text(overflow="fold")
        text.append("you\n" if m.role == "user" else "assistant\n", self.get_component_rich_style("message--role"))
        if m.role == "assistant" and self.show_provenance:
            for prov, piece in m.spans():
                text.append(piece, self.get_component_rich_style(f"message--{prov}"))
        else:
            text.append(m.content)
        if self.streaming:
            text.append("▍", self.get_component_rich_style("message--note"))
        elif not m.content and m.role == "assistant" and not m.note:
            text.append("…", self.get_component_rich_style("message--note"))
        if m.note:
            text.append("\n" + m.note, self.get_component_rich_style("message--note"))
        return text


class ProvenanceLegend(Static):
    """The colour key shown above the chat while provenance is on."""

    COMPONENT_CLASSES = {f"message--{p}" for p in PROVENANCES}
    DEFAULT_CSS = _PROVENANCE_CSS.format(owner="ProvenanceLegend")

    def on_mount(self) -> None:
        text = Text("provenance: ")
        for i, p in enumerate(PROVENANCES):
            text.append(("· " if i else "") + f"■ {PROVENANCE_LABELS[p]} ", self.get_component_rich_style(f"message--{p}"))
        self.update(text)


class ChatView(VerticalScroll):
    """The conversation; follows new text at the bottom unless the user has scrolled up."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.show_provenance = False

    def show_chat(self, chat: Chat) -> None:
        self.remove_children()
        views = [MessageView(m, self.show_provenance) for m in chat.messages]
        self.mount_all(views or [Static(WELCOME, id="welcome")])
        self.follow(force=True)

    def add_message(self, message: Message) -> MessageView:
        for w in self.query("#welcome"):
            w.remove()
        view = MessageView(message, self.show_provenance)
        self.mount(view)
        self.follow(force=True)
        return view

    def follow(self, force: bool = False) -> None:
        """Call when content grew: scroll to the end after the next layout if the view was at the end.
        (Layout has not run yet, so max_scroll_y still describes the content before the change.)"""
        if force or self.scroll_y >= self.max_scroll_y - 1:
            self.call_after_refresh(self.scroll_end, animate=False, immediate=True)

    def set_provenance(self, on: bool) -> None:
        self.show_provenance = on
        for view in self.query(MessageView):
            view.show_provenance = on
            view.refresh_message()


class PromptInput(Input):
    """The prompt line; Up and Down walk through earlier prompts."""

    BINDINGS = [Binding("up", "history(-1)", "Earlier prompt", show=False),
                Binding("down", "history(1)", "Later prompt", show=False)]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.history: list[str] = []
        self._pos: int | None = None  # index into history while walking it; None: editing a new prompt
        self._draft = ""               # what was typed before walking started

    def remember(self, prompt: str) -> None:
        if prompt and (not self.history or self.history[-1] != prompt):
            self.history.append(prompt)
        self._pos = None

    def action_history(self, step: int) -> None:
        if not self.history or (self._pos is None and step > 0):
            return
        if self._pos is None:
            self._draft, self._pos = self.value, len(self.history)
        self._pos = max(0, min(len(self.history), self._pos + step))
        if self._pos == len(self.history):
            self.value, self._pos = self._draft, None
        else:
            self.value = self.history[self._pos]
        self.cursor_position = len(self.value)
