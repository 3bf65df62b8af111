"""The TUI driven through Textual's Pilot with a scripted engine (tests/scripted.py):
offline, no model. Waits poll the app's state; nothing asserts on timing."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from ssd_edge.config import EngineConfig
from ssd_edge.errors import CorruptModelError, DecodeError, ModelNotFoundError
from tui.app import SSDEdgeApp
from tui.chats import ChatStore
from tui.dialogs import ModelsScreen
from tui.widgets.chat import ChatView
from tui.screens import ChatsScreen, HelpScreen, MissingModelsScreen
from tui.widgets.chat import PromptInput
from tui.widgets.panel import Gauge
from pilot import SIZE, make_app, mounted, press_button, send, wait_for
from scripted import REPLY, ScriptedEngine, factory


@pytest.fixture(autouse=True)
def chats(tmp_path, monkeypatch):
    folder = tmp_path / "chats"
    monkeypatch.setenv("SSD_EDGE_CHATS", str(folder))
    return folder


async def test_prompt_streams_tokens_into_the_chat():
    make = factory()
    app = make_app(make)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "explain SSD")
        user, reply = app.chat.messages
        assert user.content == "explain SSD" and reply.content == REPLY
        assert {p for p, _ in reply.spans()} == {"target", "draft", "prespec", "ngram"}
        assert reply.note.startswith(f"{len(REPLY.split(' '))} tokens")
        assert make.engine.requests == [[{"role": "user", "content": "explain SSD"}]]
        assert app.query_one(PromptInput).value == ""
        # in frames: the outbox is drained by a frame, never a redraw per token
        assert 1 <= app.frames < len(REPLY.split(" "))
        await pilot.press("f3")  # provenance colours on: the legend shows
        assert app.query_one("#legend").display


async def test_escape_stops_generation_and_keeps_what_was_shown(chats):
    gate = threading.Event()  # never set: the fake waits after its first round until cancelled
    app = make_app(factory(gate=gate))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "go", finish=False)
        await wait_for(pilot, lambda: app.session.reply is not None and app.session.reply.content)
        assert app.phase == "generating"
        assert not app.query_one(PromptInput).cursor_blink  # no repaint of its own while the model works
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.phase == "ready")
        assert app.query_one(PromptInput).cursor_blink
        shown = app.session.reply.content
        assert 0 < len(shown) < len(REPLY) and app.session.reply.note.startswith("stopped")
    saved = json.loads(next(chats.glob("*.json")).read_text())
    assert saved["messages"][1]["content"] == shown


async def test_esc_and_ctrl_q_stop_the_reply_from_the_input_thread(chats):
    """Below the engine (tui/cores.py) the UI thread may wait seconds for a core, so the driver's input
    thread stops the reply itself as it reads Esc (urgent_key); Esc in a dialog only closes the dialog."""
    gate = threading.Event()  # never set: the fake waits after its first round until cancelled

    def from_the_input_thread(key: str) -> None:
        t = threading.Thread(target=app.urgent_key, args=(key,))
        t.start()
        t.join()

    app = make_app(factory(gate=gate))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "go", finish=False)
        await wait_for(pilot, lambda: app.session.reply is not None and app.session.reply.content)
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        from_the_input_thread("escape")
        assert not app.session.cancel.is_set()                 # Esc belongs to the dialog: the reply goes on
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen))
        from_the_input_thread("escape")
        assert app.session.cancel.is_set()                     # stopped before the UI thread saw the key
        await wait_for(pilot, lambda: app.phase == "ready")
        assert app.session.reply.note.startswith("stopped")
        from_the_input_thread("ctrl+q")                # nothing runs: quitting sets both stops anyway
        assert app.session.cancel.is_set() and app.session.pull_cancel.is_set()


async def test_gauges_follow_the_events():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hi")
        live = app.live.live
        hit = app.query_one("#hit", Gauge)
        assert hit.fraction == live.hit_rate and hit.tone == "poor" and "poor" in hit.text  # 1 hit in 3 rounds
        assert app.query_one("#accept", Gauge).fraction == live.acceptance
        assert app.query_one("#draft-util", Gauge).fraction == live.draft_util
        assert app.query_one("#branches", Gauge).text == f"{live.branch_cells}/64 cells"
        assert list(app.query_one("#spark").data) == list(app.live.rates) and len(app.live.rates) > 3
        assert "hit 40 ms" in str(app.query_one("#latency").render())  # the engine's p50 once finished
        # colours follow the 70 % / 50 % thresholds
        from dataclasses import replace
        for rate, tone in ((0.8, "good"), (0.6, "fair"), (0.2, "poor")):
            app.live.live = replace(live, hit_rate=rate)
            app.query_one("#panel").show_live(app.live)
            assert hit.tone == tone


async def test_mode_k_and_temperature_reach_the_engine():
    make = factory()
    app = make_app(make)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.phase == "ready")
        await pilot.press("f5")  # cycle: ssd -> auto
        assert make.engine.configured[-1] == {"mode": "auto"} and app.config.mode == "auto"
        await app.run_action("set_mode('sd')")  # what the palette's "Mode: sd" runs
        assert make.engine.config.mode == "sd"
        await pilot.pause()
        assert "k 3 · temperature 0" in str(app.query_one("#mode").render())  # sd's FIXED_K, not "auto"
        await pilot.press("f4")
        await pilot.pause()
        dialog = app.screen
        (await mounted(pilot, "#k")).value = "99"
        await press_button(pilot, "#ok")
        assert "spec.k" in str(dialog.query_one("#error").render())  # ConfigError shown, dialog stays
        assert app.screen is dialog and make.engine.config.spec.k is None  # unchanged: auto plans it
        dialog.query_one("#k").value = "6"
        dialog.query_one("#temperature").value = "0.7"
        await press_button(pilot, "#ok")
        await pilot.pause()
        assert app.screen is not dialog
        assert make.engine.config.spec.k == 6 and make.engine.config.sampling.temperature == 0.7
        assert "k 6 · temperature 0.7" in str(app.query_one("#mode").render())



def first_command(app: SSDEdgeApp) -> str:
    from textual.command import CommandList

    found = app.screen.query(CommandList)
    if not found or not found.first().option_count:
        return ""
    return str(found.first().get_option_at_index(0).prompt)


async def test_command_palette_switches_mode():
    make = factory()
    app = make_app(make)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.phase == "ready")
        await pilot.press("ctrl+p")
        await pilot.press(*"Mode: lookup")
        await wait_for(pilot, lambda: "Mode: lookup" in first_command(app))
        await pilot.press("enter")
        await wait_for(pilot, lambda: make.engine.config.mode == "lookup")


async def test_history_survives_a_restart(chats):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "remember me")
        await pilot.press("ctrl+q")
    assert app.return_code == 0
    app2 = make_app()
    async with app2.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app2.phase == "ready")
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app2.screen, ChatsScreen))
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app2.chat.messages) == 2)
        assert app2.chat.messages[0].content == "remember me" and app2.chat.messages[1].content == REPLY
        prompt = app2.query_one(PromptInput)
        prompt.focus()
        await pilot.press("up")
        assert prompt.value == "remember me"
        await send(pilot, app2, "and again")  # the reopened chat goes on as one conversation
        assert len(ChatStore(chats).list()) == 1 and len(app2.chat.messages) == 4


async def test_new_chat_and_system_prompt():
    make = factory()
    app = make_app(make)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "one")
        first = app.chat.id
        await pilot.press("ctrl+n")
        assert app.chat.id != first and app.chat.messages == []
        await pilot.press("f2")
        await pilot.pause()
        (await mounted(pilot, "#system")).text = "Answer in French."
        await press_button(pilot, "#ok")
        await send(pilot, app, "two")
        assert make.engine.requests[-1] == [{"role": "system", "content": "Answer in French."},
                                            {"role": "user", "content": "two"}]


@pytest.mark.parametrize("fail_after", [None, 1])
async def test_engine_error_is_shown_not_raised(fail_after):
    app = make_app(factory(fail=DecodeError("llama_decode returned -1"), fail_after=fail_after))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hi")
        assert app.session.reply.note == "error: llama_decode returned -1"
        assert bool(app.session.reply.content) == (fail_after is not None)  # text shown before the error stays
        assert app.is_running and app.phase == "ready"


async def test_load_error_is_shown_and_sets_the_exit_code():
    def broken(cfg, models_dir):
        raise CorruptModelError("llama.cpp could not load /m/x.gguf (truncated or corrupt GGUF?)")

    app = make_app(broken)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.phase == "failed")
        assert "could not load /m/x.gguf" in str(app.query_one("#status").render())
        app.query_one(PromptInput).value = "hi"
        await pilot.press("enter")  # no engine: a notice, not a crash
        assert app.chat.messages == []
        await pilot.press("ctrl+q")
    assert app.return_code == CorruptModelError.exit_code


async def test_missing_models_are_offered_and_pulled(tmp_path):
    models = tmp_path / "models"
    pulled = []

    def fake_pull(model, models_dir, progress=None):
        progress(f"{model.name}: part 1/1", 0)
        (models_dir / model.file).parent.mkdir(parents=True, exist_ok=True)
        (models_dir / model.file).write_bytes(b"GGUF")
        progress(f"{model.name}: part 1/1", model.size)
        pulled.append(model.name)
        return models_dir / model.file, True

    def make(cfg, models_dir):
        from ssd_edge.models.catalog import resolve_model

        resolve_model(cfg.target.path, models_dir)  # ModelNotFoundError until pulled
        return ScriptedEngine(cfg)

    cfg = EngineConfig.build(target=dict(path="smollm2-135m"), mode="lookup")
    app = make_app(make, cfg=cfg, models_dir=str(models), pull=fake_pull)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, MissingModelsScreen))
        assert "ssd-edge models pull smollm2-135m" in str((await mounted(pilot, "#missing")).render())
        await press_button(pilot, "#pull")
        await wait_for(pilot, lambda: app.phase == "ready")
        assert pulled == ["smollm2-135m"] and app.engine is not None


async def test_missing_models_quit_returns_the_error_code():
    def missing(cfg, models_dir):
        raise ModelNotFoundError("model 'x' is not downloaded yet")

    app = make_app(missing)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.phase == "failed")
        await pilot.press("ctrl+q")
    assert app.return_code == ModelNotFoundError.exit_code


async def test_quit_during_generation_cancels_and_joins(chats):
    gate = threading.Event()
    make = factory(gate=gate)
    app = make_app(make)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "long answer", finish=False)
        await wait_for(pilot, lambda: app.session.reply is not None and app.session.reply.content)
        await pilot.press("ctrl+q")
    assert app.session.cancel.is_set() and not app.session.jobs["generate"].is_running
    assert make.engine.closed
    saved = json.loads(next(chats.glob("*.json")).read_text())
    assert saved["messages"][1]["content"] and saved["messages"][1]["note"].startswith("stopped")


async def test_model_picker_rebuilds_the_engine_in_a_worker():
    make = factory()
    app = make_app(make)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.phase == "ready")
        first = make.engine
        await pilot.press("f6")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
        (await mounted(pilot, "#target")).value = "smollm2-135m"
        (await mounted(pilot, "#draft")).value = "none"
        await press_button(pilot, "#ok")
        await wait_for(pilot, lambda: make.engine is not first and app.phase == "ready")
        assert first.closed  # the old engine is closed before the new one loads
        cfg = make.engine.config
        assert cfg.target.path == "smollm2-135m" and cfg.draft is None
        assert cfg.mode == "lookup"  # ssd needs a draft: the app says so and falls back
        assert "smollm2-135m" in str(app.query_one("#models").render())


async def test_failed_model_switch_goes_back_to_the_previous_models():
    def make(cfg, models_dir):
        if cfg.target.path == "broken.gguf":
            raise CorruptModelError("llama.cpp could not load broken.gguf")
        return ScriptedEngine(cfg)

    app = make_app(make)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.phase == "ready")
        app.switch_models("broken.gguf", "fake-draft.gguf")
        await wait_for(pilot, lambda: app.phase == "ready" and app.config.target.path == "fake-target.gguf")
        assert app.engine is not None


async def test_help_lists_every_key_and_chats_can_be_deleted(chats):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "to be deleted")
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        listed = {key for key, _ in app.screen.keys}
        assert {"esc", "ctrl+n", "ctrl+o", "f3", "f4", "f6", "ctrl+q", "up / down"} <= listed
        await pilot.press("escape")
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        await pilot.press("delete")
        assert not list(chats.glob("*.json")) and app.chat.messages == []  # the open chat was the one deleted


async def test_switching_to_a_missing_model_can_go_back(tmp_path):
    def make(cfg, models_dir):
        if cfg.target.path == "gemma3-270m":
            raise ModelNotFoundError("model 'gemma3-270m' is not downloaded yet")
        return ScriptedEngine(cfg)

    app = make_app(make, models_dir=str(tmp_path / "no-models"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.phase == "ready")
        app.switch_models("gemma3-270m", None)
        await wait_for(pilot, lambda: isinstance(app.screen, MissingModelsScreen))
        assert [m.name for m in app.screen.models] == ["gemma3-270m"]
        await pilot.press("escape")  # back, not quit: the previous models load again
        await wait_for(pilot, lambda: app.phase == "ready")
        assert app.is_running and app.config.target.path == "fake-target.gguf"


async def test_engine_warnings_become_notifications():
    def warn(cfg, models_dir):
        logging.getLogger("ssd_edge.llama.backend").warning("GPU offload asked for x.gguf, but this build has no GPU")
        return ScriptedEngine(cfg)

    app = make_app(warn)
    shown = []
    app.notify = lambda message, **kw: shown.append((message, kw.get("severity")))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.phase == "ready")
        await wait_for(pilot, lambda: shown)
    assert shown == [("GPU offload asked for x.gguf, but this build has no GPU", "warning")]
    assert app._notices not in logging.getLogger("ssd_edge").handlers  # removed when the app ends


async def test_the_models_panel_says_what_the_devices_verify_curve_means():
    """With a calibration profile the panel names the regime ("only long copies pay" here, "speculation
    pays" on a GPU), so a user who sees auto take plain steps knows why; without one it says nothing."""
    import types

    from ssd_edge.planning.costs import describe_regime

    steep = describe_regime([36.0 * n for n in range(1, 6)])
    make = factory()

    def with_profile(config, models_dir):
        engine = make(config, models_dir)
        engine.auto_profile = lambda: types.SimpleNamespace(regime=lambda: steep)
        return engine

    app = make_app(with_profile)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.phase == "ready")
        shown = " ".join(str(app.query_one("#models").render()).split())
        assert "regime" in shown and "compute-bound" in shown
        assert "memory 308 MiB: 100 MiB target weights · 60 MiB draft weights · 12 MiB target KV" in shown
    app = make_app(factory())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.phase == "ready")
        assert "regime" not in str(app.query_one("#models").render())


PIECES = [("target", "def is_pal(s):\n"), ("draft", "    s = s.lower()"), ("prespec", "\n\n"),
          ("ngram", "    return s == s[::-1]\n"), ("target", "This " + "word " * 60), ("draft", "\n"),
          ("prespec", "x" * 300), ("target", "\n```\n"), ("ngram", "end")]


async def test_a_streaming_reply_draws_the_rows_a_whole_render_would():
    """The reply's rows are kept line by line (settled lines rendered once, the open one again per frame):
    after every piece, with provenance on and off, at two widths, they equal a render of the whole text
    (wrapped lines, blank lines, a word longer than the width, the cursor, the note), and a frame
    repaints only from the open line down."""
    from textual.visual import Visual, visualize

    from tui.chats import Message
    from tui.widgets.chat import ChatView

    def whole(view, width):
        return Visual.to_strips(view, visualize(view, view.render()), width, None, view.visual_style, pad=True)

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.phase == "ready")
        for provenance in (False, True):
            view = app.query_one(ChatView).add_message(Message("assistant", ""))
            view.show_provenance, view.streaming = provenance, True
            await pilot.pause()
            for prov, piece in PIECES:
                view.message.add(prov, piece)
                view.refresh_message()
                for width in (view.content_size.width, 23):
                    assert view.rows(width) == whole(view, width), (provenance, width, piece)
            await pilot.pause()
            view.message.add("target", " more")  # no line break: a frame of the open line alone
            assert not view.refresh_message()
            repainted = view._repaint_regions.copy()
            view.streaming, view.message.note = False, "9 tokens · 1.0 s"
            view.refresh_message()
            assert view.rows() == whole(view, view.content_size.width)
            await pilot.pause()
            # that frame repainted the open line's rows, not the reply's top
            assert repainted and min(r.y for r in repainted) > 10, repainted
        # a mouse selection is drawn over the whole text, and gone again when cleared
        from textual.geometry import Offset
        from textual.selection import Selection

        for selections in ({view: Selection(Offset(2, 1), Offset(4, 3))}, {}):
            app.screen.selections = selections
            await pilot.pause()
            width = view.content_size.width
            expected = whole(view, width)
            assert [view.render_line(y) for y in range(len(expected))] == expected  # as the screen asks


async def test_the_panels_own_drawing_matches_textuals():
    """The gauge's bar is drawn in runs and the sparkline from the rows it keeps: each looks exactly as
    the plain way draws it (a span per cell; Textual's own Sparkline), marks and all."""
    from rich.text import Text
    from textual.widget import Widget
    from textual.widgets import Sparkline

    from tui.widgets.panel import LABEL_WIDTH, TEXT_WIDTH, RateSparkline

    def per_cell(g: Gauge) -> Text:
        width = max(g.size.width, LABEL_WIDTH + TEXT_WIDTH + 4)
        bar = width - LABEL_WIDTH - TEXT_WIDTH - 1
        filled = round(max(0.0, min(1.0, g.fraction or 0.0)) * bar)
        marks = {min(bar - 1, int(m * bar)) for m in g.marks}
        style = g.get_component_rich_style
        text = Text(g.label.ljust(LABEL_WIDTH)[:LABEL_WIDTH], style("gauge--label"), no_wrap=True)
        for i in range(bar):
            if i in marks and i >= filled:
                text.append("│", style("gauge--mark"))
            else:
                text.append("━", style(f"gauge--{g.tone}") if i < filled else style("gauge--empty"))
        return text.append(" " + g.text.ljust(TEXT_WIDTH)[:TEXT_WIDTH])

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hi")
        hit = app.query_one("#hit", Gauge)
        for fraction, tone in ((0.0, "poor"), (0.3, "poor"), (0.55, "fair"), (0.69, "fair"), (0.95, "good"), (1.0, "good")):
            hit.set(fraction, f"{fraction:.0%}", tone)
            drawn = hit.render()
            assert drawn.plain == per_cell(hit).plain
            assert [drawn.get_style_at_offset(app.console, i) for i in range(len(drawn))] == \
                   [per_cell(hit).get_style_at_offset(app.console, i) for i in range(len(drawn))]
        spark = app.query_one("#spark", RateSparkline)
        for data in ([], [5.0], [3.0, 9.0, 1.0, 7.5] * 20, list(app.live.rates)):
            spark.data = data
            await pilot.pause()
            spark._dirty_regions.add(spark.size.region)  # Textual's path renders anew only when dirty
            width, base = spark.size.width, spark.visual_style.rich_style  # short rows: padded as the screen pads them
            assert [spark.render_line(y).adjust_cell_length(width, base) for y in range(spark.size.height)] == \
                   [Widget.render_line(spark, y).adjust_cell_length(width, base) for y in range(spark.size.height)]
        assert isinstance(spark, Sparkline)


@pytest.mark.parametrize("size,panel", [((80, 24), 34), ((119, 40), 34), ((140, 44), 54)])
async def test_a_narrow_terminal_gets_a_narrow_panel(size, panel):
    """Below 120 columns the panel narrows so the chat keeps room (at 80 the full panel left it 26),
    and a resize follows; the gauges still draw their label, bar and value."""
    from tui.widgets.panel import LivePanel

    app = make_app()
    async with app.run_test(size=size) as pilot:
        await send(pilot, app, "hi")
        assert app.query_one(LivePanel).outer_size.width == panel
        assert app.query_one(ChatView).size.width >= size[0] - panel - 2
        hit = app.query_one("#hit", Gauge)
        assert hit.render().plain.startswith("pre-spec hit") and hit.text in hit.render().plain
        await pilot.resize_terminal(150, 44) if size[0] < 120 else await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert app.query_one(LivePanel).outer_size.width == (54 if size[0] < 120 else 34)
