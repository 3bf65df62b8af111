"""The main screen after one exchange, checked by structure rather than by pixels: which widgets
are there and where, the text they show, and the colour each provenance role is drawn in. An SVG
snapshot (the old test) broke with any Textual release (textual is not pinned) and, compared with
a render of itself, proved nothing; this holds across releases and fails when the look's meaning
changes: a widget gone, a reply not shown, a role drawn in another role's colour.

Stable by construction: a fixed clock and the scripted engine's figures (tests/scripted.py)."""

from __future__ import annotations

from rich.style import Style
from textual.widgets import Footer, Header, Input

from pilot import make_app, send
from scripted import REPLY
from tui.widgets.chat import PROVENANCE_COLOURS, PROVENANCES, ChatView, MessageView, PromptInput, ProvenanceLegend
from tui.widgets.panel import LivePanel

QUESTION = "How does SSD speed up decoding?"


def colour_of(style) -> str | None:
    """The foreground colour of a rich Style or a Textual style, as #rrggbb (None: the default)."""
    if isinstance(style, str):
        style = Style.parse(style)
    if hasattr(style, "color"):
        return style.color.triplet.hex.lower() if style.color is not None and style.color.triplet is not None else None
    fg = getattr(style, "foreground", None)
    return fg.hex.lower()[:7] if fg is not None else None


async def test_main_screen_structure_text_and_colours(tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_EDGE_CHATS", str(tmp_path / "chats"))
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await send(pilot, app, QUESTION)
        await pilot.press("f3")  # provenance colours on
        await pilot.pause()
        # the widgets, each once, in their places: the chat column left of the live panel
        for kind in (Header, Footer, ChatView, PromptInput, ProvenanceLegend, LivePanel):
            assert len(app.query(kind)) == 1, kind.__name__
        chat, panel = app.query_one(ChatView), app.query_one(LivePanel)
        assert chat.region.right <= panel.region.x and chat.region.width > panel.region.width
        assert app.query_one(PromptInput).region.y > chat.region.y  # the prompt below the chat
        assert isinstance(app.query_one(PromptInput), Input) and app.query_one(PromptInput).value == ""
        assert app.query_one(ProvenanceLegend).display  # shown while provenance is on

        # the text: the question and the whole reply, by role
        views = list(app.query(MessageView))
        assert [v.message.role for v in views] == ["user", "assistant"]
        user, reply = (v.render() for v in views)
        assert user.plain == "you\n" + QUESTION
        assert reply.plain.startswith("assistant\n") and REPLY.strip() in reply.plain

        # the colours by role: every provenance in the reply is drawn in its colour, the target's in
        # the normal text colour (none of the others'), and the legend uses the same colours
        drawn: dict[str, set] = {}
        view = views[1]
        for prov, piece in view.message.spans():
            drawn.setdefault(prov, set()).add(colour_of(view.get_component_rich_style(f"message--{prov}")))
        assert set(drawn) == set(PROVENANCES) - {"grammar"}, drawn  # the scripted reply: all but a grammar's
        for prov in ("draft", "prespec", "ngram"):
            assert drawn[prov] == {PROVENANCE_COLOURS[prov]}, (prov, drawn[prov])
        assert not drawn["target"] & {PROVENANCE_COLOURS[p] for p in ("draft", "prespec", "ngram")}
        in_reply = {colour_of(s.style) for s in reply.spans}  # the render draws with those styles
        in_legend = {colour_of(s.style) for s in app.query_one(ProvenanceLegend).render().spans}
        for prov in ("draft", "prespec", "ngram"):
            assert PROVENANCE_COLOURS[prov] in in_reply and PROVENANCE_COLOURS[prov] in in_legend, (
                prov, in_reply, in_legend)
