"""The chat column: the conversation (one widget per message) and the prompt input, with the
chat's title and the status line and progress bar between them (ChatColumn).

A message widget renders its `chats.Message` on demand; the app calls
`refresh_message()` at most once per frame while text streams in, and the
screen is laid out again only when the message's height changed. With
provenance on, each piece of an answer is coloured by where its tokens came
from: the target itself, an accepted draft, a pre-speculation hit, an n-gram.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style as RichStyle
from rich.text import Text
from textual.binding import Binding
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.geometry import Region
from textual.strip import Strip
from textual.visual import Visual, visualize
from textual.widget import Widget
from textual.widgets import Input, ProgressBar, Static

from ..chats import Chat, Message
from .structured import readable_text

PROVENANCES = ("target", "draft", "prespec", "ngram", "grammar")  # another proposer's kind: drawn as the target's
PROVENANCE_LABELS = {"target": "target", "draft": "accepted draft", "prespec": "pre-speculation hit",
                     "ngram": "n-gram", "grammar": "grammar-forced"}
# Colours, also used by the help screen's legend; the target keeps the normal text colour ("").
PROVENANCE_COLOURS = {"target": "", "draft": "#5fafff", "prespec": "#5fd75f", "ngram": "#d787d7", "grammar": "#d7af5f"}
_PROVENANCE_CSS = "\n".join(f"{{owner}} > .message--{p} {{{{ color: {c or '$foreground'}; }}}}"
                             for p, c in PROVENANCE_COLOURS.items())

WELCOME = ("Type a prompt below and press Enter.\n"
           "Esc stops a reply · F3 shows where each token came from · F1 lists every key · Ctrl+P commands")


# While a reply streams, its widget reserves rows ahead, this many at a time: a code answer adds a line
# every frame or two, and each new line would otherwise lay out the whole screen again (Textual's
# layout and the full repaint after it were the UI thread's largest costs per token).
RESERVE_ROWS = 8


class MessageView(Widget):
    """One chat message; its height follows its text.

    Drawn line by line (Textual's line API) from rows it keeps: the text up to its last line break
    is settled, and its rows are rendered once, a chunk of whole lines at a time as line breaks
    arrive (Rich wraps each line on its own, so those rows are the ones a render of the whole text
    would give); only the open last line, the cursor and the note are rendered again when the text
    grows, and only their rows are repainted. A long reply then costs each frame what its last line
    costs, not what the whole reply does."""

    COMPONENT_CLASSES = {f"message--{p}" for p in PROVENANCES} | {"message--note", "message--role"}
    DEFAULT_CSS = "MessageView { height: auto; }\n" + _PROVENANCE_CSS.format(owner="MessageView")

    def __init__(self, message: Message, show_provenance: bool = False) -> None:
        super().__init__(classes=message.role)
        self.message = message
        self.show_provenance = show_provenance
        self.streaming = False
        self._key: tuple | None = None   # what the rows were rendered for: width, provenance, styles
        self._settled: list[Strip] = []  # the rows of body[:self._cut]
        self._cut = -1                   # the line break that ends the settled text (-1: none yet)
        self._open: list[Strip] = []     # the rows after it: the open line, the cursor, the note
        self._shown: tuple[str, Text | None] | None = None  # (text, its readable form) of a finished answer

    # ---------------------------------------------------------------- the text
    def body(self) -> Text:
        """The role line and the message's text (coloured by provenance when that is on; a finished answer
        that holds JSON or tool calls, readably, when it is off)."""
        m = self.message
        text = Text(overflow="fold")
        text.append("you\n" if m.role == "user" else "assistant\n", self.get_component_rich_style("message--role"))
        shown = self._readable() if m.role == "assistant" and not self.streaming and not self.show_provenance else None
        if shown is not None:
            text.append_text(shown)
        elif m.role == "assistant" and self.show_provenance:
            for prov, piece in m.spans():
                style = f"message--{prov if prov in PROVENANCES else 'target'}"
                text.append(piece, self.get_component_rich_style(style))
        else:
            text.append(m.content)
        return text

    def _readable(self) -> Text | None:
        """The readable form of the finished answer, worked out once per text."""
        content = self.message.content
        if self._shown is None or self._shown[0] != content:
            self._shown = (content, readable_text(content, self.get_component_rich_style("message--note")))
        return self._shown[1]

    def tail(self) -> Text:
        """What follows the text: the streaming cursor, or "…" for an empty answer; the note."""
        m = self.message
        text = Text(overflow="fold")
        if self.streaming:
            text.append("▍", self.get_component_rich_style("message--note"))
        elif not m.content and m.role == "assistant" and not m.note:
            text.append("…", self.get_component_rich_style("message--note"))
        if m.note:
            text.append("\n" + m.note, self.get_component_rich_style("message--note"))
        return text

    def render(self) -> Text:
        """The whole message as one text (what the rows show)."""
        return self.body() + self.tail()

    # ---------------------------------------------------------------- rows
    def _strips(self, text: Text, width: int, line: int) -> list[Strip]:
        """The rows of `text`, which starts at logical line `line` of the message (each piece of text
        carries its (column, line) for mouse selection: shifted here to where the text really is)."""
        strips = Visual.to_strips(self, visualize(self, text), width, None, self.visual_style, pad=True)
        return strips if not line else [_shifted(strip, line) for strip in strips]

    def _update_rows(self, width: int) -> int:
        """Bring the rows up to date with the message at `width`; returns the first row that changed."""
        selection = self.text_selection
        key = (width, self.show_provenance, self.streaming, self.visual_style, selection,
               *(self.get_component_rich_style(c) for c in sorted(self.COMPONENT_CLASSES)))
        if key != self._key:
            self._key, self._settled, self._cut = key, [], -1
        first = len(self._settled)
        body = self.body()
        if selection is not None:  # a selection is drawn over the whole text: render it whole
            self._open = self._strips(body + self.tail(), width, 0)
            return 0
        plain = body.plain
        cut = plain.rfind("\n")
        if cut > self._cut:  # whole lines were completed: render them on their own and keep their rows
            chunk = body[self._cut + 1:cut]
            self._settled += self._strips(chunk, width, plain.count("\n", 0, self._cut + 1)) if chunk.plain else \
                [Strip.blank(width, self.visual_style.rich_style)]
            self._cut = cut
        self._open = self._strips(body[cut + 1:] + self.tail(), width, plain.count("\n"))
        return first

    def rows(self, width: int | None = None) -> list[Strip]:
        """Every row of the message at `width` (default: the widget's content width)."""
        self._update_rows(self.content_size.width if width is None else width)
        return self._settled + self._open

    def _kept(self, width: int) -> int:
        """How many rows are kept for `width` (0: none, or kept for another width)."""
        return len(self._settled) + len(self._open) if self._key is not None and self._key[0] == width else 0

    def _height(self, rows: int) -> int:
        """The widget's height for `rows` rows: while the message streams, rounded up to a multiple of
        RESERVE_ROWS."""
        return -(-rows // RESERVE_ROWS) * RESERVE_ROWS if self.streaming else rows

    def get_content_height(self, container, viewport, width: int) -> int:
        return self._height(self._kept(width) or len(self.rows(width)))

    def render_line(self, y: int) -> Strip:
        width = self.content_size.width
        rows = self._settled + self._open if self._kept(width) else self.rows(width)
        return rows[y] if y < len(rows) else Strip.blank(width, self.visual_style.rich_style)

    def refresh_message(self) -> bool:
        """Redraw after the message changed: only the rows from the first that changed. Returns True when
        the height changed, and only then asks for a layout of the screen."""
        height, width = self.content_size.height, self.content_size.width
        if not width:
            self.refresh(layout=True)
            return True
        old = self._kept(width)
        first = self._update_rows(width)
        now = len(self._settled) + len(self._open)
        if self._height(now) != height:
            self.refresh(layout=True)
            return True
        self.refresh(Region(0, first, width, max(max(old, now) - first, 1)))
        return False

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._key = self._shown = None  # a theme or a class changed: the rows' styles may have

    def selection_updated(self, selection) -> None:
        self._key = None  # the rows are drawn anew, with the selection (or without it)
        super().selection_updated(selection)


def _shifted(strip: Strip, lines: int) -> Strip:
    """`strip` with the line of each piece's selection offset moved down by `lines`."""
    out = []
    for seg in strip:
        style = seg.style
        meta = style.meta if style is not None and style._meta else None
        if meta and "offset" in meta:
            x, y = meta["offset"]
            style = style + RichStyle.from_meta({"offset": (x, y + lines)})
        out.append(Segment(seg.text, style))
    return Strip(out, strip.cell_length)


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


class ChatColumn(Vertical):
    """The column left of the live panel: the chat's title, the provenance legend, the conversation,
    a status line, the load/pull progress bar and the prompt."""

    def compose(self) -> ComposeResult:
        yield Static("", id="chat-title")
        yield ProvenanceLegend("", id="legend")
        yield ChatView(id="chat")
        yield Static("", id="status")
        yield ProgressBar(total=None, show_eta=False, id="progress")
        yield PromptInput(placeholder="Ask something…  Enter sends · ↑↓ earlier prompts", id="prompt")

    def show_chat(self, chat: Chat) -> None:
        """A whole chat: its messages, its title, and its prompts as the prompt's history."""
        self.query_one(ChatView).show_chat(chat)
        self.show_title(chat)
        prompt = self.query_one(PromptInput)
        for m in chat.messages:
            if m.role == "user":
                prompt.remember(m.content)

    def add_exchange(self, asked: Message, reply: Message) -> MessageView:
        """A prompt and the start of its reply, below the conversation; returns the reply's view."""
        chat_view = self.query_one(ChatView)
        chat_view.add_message(asked)
        return chat_view.add_message(reply)

    def show_title(self, chat: Chat) -> None:
        title = chat.title or "New chat"
        if chat.system:
            title += f"  ·  system: {chat.system.splitlines()[0][:60]}"
        self.query_one("#chat-title", Static).update(title)

    def set_status(self, text: str, error: bool = False) -> None:
        status = self.query_one("#status", Static)
        status.update(text)
        status.set_class(error, "error")

    def show_progress(self, **update: int | None) -> None:
        """Show the load/pull bar, updated with ProgressBar.update's arguments (total None: no end known)."""
        bar = self.query_one("#progress", ProgressBar)
        bar.update(**update)
        bar.display = True

    def hide_progress(self) -> None:
        """Hide the load/pull bar, and stop it: an indeterminate ProgressBar keeps its animation timer
        (15 refreshes a second) even hidden. (Measured with tui_speed.py pilot: no change to the
        compositor's calls while a reply streams; it is stopped because nothing is left to animate.)"""
        bar = self.query_one("#progress", ProgressBar)
        bar.update(total=1, progress=1)
        bar.display = False

    def toggle_provenance(self) -> None:
        """Colour each piece of the replies by its provenance, or stop; the legend shows while it is on."""
        chat_view = self.query_one(ChatView)
        on = not chat_view.show_provenance
        chat_view.set_provenance(on)
        self.query_one("#legend").set_class(on, "-on")
