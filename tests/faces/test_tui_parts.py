"""TUI building blocks without a running app: the chat store, the outbox,
the provenance segmenter, the panel's figures, the session. Offline and fast."""

from __future__ import annotations

import dataclasses
import json
import threading

from ssd_edge.config import EngineConfig
from ssd_edge.events import FinishEvent, LiveStats, Round, TokenEvent
from ssd_edge.metrics import Meter
from tui.chats import Chat, ChatStore, Message
from tui.cores import EngineThread
from tui.live import LiveModel, finish_note
from tui.messages import StreamWake
from tui.session import Session
from tui.stream import Chunk, Failure, Outbox, Segmenter, run_generation
from scripted import REPLY, ScriptedEngine, ScriptedModel, default_config


def _round(i: int, prespec: str | None, wall_ms: float) -> Round:
    return Round(i, "ssd", "prespec", prespec, 3, 2, wall_ms, wall_ms, 0.0)


def _live(**kw) -> LiveStats:
    base = dict(tokens=1, tokens_per_s=1.0, acceptance=None, hit_rate=None, draft_util=0.0, target_util=0.0,
                branch_cells=0, budget_cells=0, mode="ssd", state="ssd")
    return LiveStats(**{**base, **kw})


def test_store_round_trip_list_and_atomic_write(tmp_path):
    store = ChatStore(tmp_path / "chats")
    chat = store.new(1_700_000_000.0, system="be brief")
    chat.title = "first"
    chat.messages.append(Message("user", "hi"))
    reply = Message("assistant", "")
    for prov, text in [("prespec", "Hel"), ("prespec", "lo"), ("target", "!")]:
        reply.add(prov, text)
    chat.messages.append(reply)
    store.save(chat)
    assert [p.name for p in (tmp_path / "chats").iterdir()] == [f"{chat.id}.json"]  # no temp file left
    again = store.load(chat.id)
    assert again.messages[1].spans() == [("prespec", "Hello"), ("target", "!")]
    assert again.engine_messages() == [{"role": "system", "content": "be brief"},
                                       {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}]
    second = store.new(1_700_000_000.0)  # same second: a distinct id
    assert second.id != chat.id
    (tmp_path / "chats" / "broken.json").write_text("{not json")
    assert [s.title for s in store.list()] == ["first"]  # unreadable files are skipped


def test_store_skips_empty_assistant_messages_in_the_prompt():
    chat = Chat("x", 0.0, 0.0, messages=[Message("user", "a"), Message("assistant", "", note="error: boom"),
                                          Message("user", "b")])
    assert [m["content"] for m in chat.engine_messages()] == ["a", "b"]


def test_outbox_wakes_once_per_drain():
    wakes = []
    box = Outbox(lambda: wakes.append(1))
    for i in range(50):
        box.put(Failure(str(i)))
    assert len(wakes) == 1
    assert len(box.drain()) == 50
    box.put(Failure("again"))
    assert len(wakes) == 2


def test_segmenter_splits_a_round_by_provenance():
    model = ScriptedModel("m", 1)
    toks = model.encode("one two three")
    ev = TokenEvent("one two three", tuple(toks), ("prespec", "prespec", "target"),
                    _round(0, "hit", 10.0), _live())
    assert Segmenter(model.piece).split(ev) == (("prespec", "one two"), ("target", " three"))
    # a delta that the pieces do not add up to (a held-back stop string) goes whole to the main provenance
    held = TokenEvent("one", tuple(toks), ("draft", "draft", "target"), _round(0, None, 1.0), _live())
    assert Segmenter(model.piece).split(held) == (("draft", "one"),)
    assert Segmenter(None).split(held) == (("draft", "one"),)


def test_segmenter_holds_a_split_utf8_character():
    model = ScriptedModel("m", 1)
    model.vocab = ["é".encode()[:1], "é".encode()[1:] + b"!"]
    seg = Segmenter(model.piece)
    first = TokenEvent("", (0,), ("draft",), _round(0, None, 1.0), _live())
    second = TokenEvent("é!", (1,), ("target",), _round(1, None, 1.0), _live())
    assert seg.split(first) == ()
    assert seg.split(second) == (("target", "é!"),)


def test_run_generation_puts_chunks_then_finish_and_turns_errors_into_lines():
    cfg = EngineConfig.build(target=dict(path="t.gguf"), draft=dict(path="d.gguf"))
    items = []
    box = Outbox(lambda: None)
    run_generation(ScriptedEngine(cfg), [{"role": "user", "content": "hi"}], 256, threading.Event(), box)
    items = box.drain()
    assert all(isinstance(i, Chunk) for i in items[:-1]) and isinstance(items[-1], FinishEvent)
    assert "".join(t for c in items[:-1] for _, t in c.spans) == REPLY
    run_generation(ScriptedEngine(cfg, fail=RuntimeError("boom")), [], 8, threading.Event(), box)
    assert box.drain() == [Failure("RuntimeError: boom")]


def test_live_model_rates_and_latency_by_outcome():
    live = LiveModel()
    live.start()
    live.observe(_round(0, "hit", 100.0), 4, _live(hit_rate=1.0))   # 25 ms/token on a hit
    live.observe(_round(1, "miss", 300.0), 2, _live(hit_rate=0.5))  # 150 ms/token on a miss
    assert live.rate_now == 1e3 * 6 / 400
    assert live.latency_ms("hit") == 25.0 and live.latency_ms("miss") == 150.0
    empty = Meter("ssd", 4, 64).stats()
    live.finish(dataclasses.replace(empty, tokens=10, first_round_tokens=1, wall_s=1.5, ttft_s=0.5, tokens_per_s=9.0,
                                    latency_ms_p50=60.0,
                                    prespec=dataclasses.replace(empty.prespec, latency_ms_hit_p50=24.0)))
    assert live.latency_ms("hit") == 24.0 and live.latency_ms("miss") is None and live.average_rate() == 9.0
    assert len(live.rates) == 2  # the sparkline keeps its history across generations


def test_finish_note_names_unusual_stops():
    empty = Meter("sd", 3).stats()
    stats = dataclasses.replace(empty, tokens=5, first_round_tokens=1, wall_s=2.5, ttft_s=0.5, tokens_per_s=2.0,
                                acceptance_rate=0.5)
    assert finish_note("eos", stats, None) == "5 tokens · 2.0 tok/s · sd · acceptance 50%"
    assert finish_note("cancelled", stats, None).startswith("stopped · 5 tokens")
    assert finish_note("context", empty, "the context of 64 tokens is full") == \
        "context full · the context of 64 tokens is full"


def test_finish_note_of_a_one_round_reply_shows_no_decode_speed_and_labels_its_end_to_end_rate():
    meter = Meter("sd", 3)
    meter.first_token()
    meter.record(Round(0, "sd", "draft", None, 3, 1, 500.0, 400.0, 0.0), 2)
    meter.record(Round(1, "sd", "none", None, 0, 0, 50.0, 40.0, 0.0), 0)  # the end of text: nothing emitted
    stats = meter.stats()
    assert stats.rounds == 2 and not stats.decoded  # not 2 tokens over the ~50 ms after the first round
    assert finish_note("eos", stats, None) == \
        f"2 tokens · — tok/s · {stats.end_to_end_tokens_per_s:.1f} tok/s end to end · sd · acceptance 33%"
    live = LiveModel()
    live.finish(stats)
    assert live.average_rate() is None  # the panel's "avg" shows "—", not a decode speed


def test_fake_engine_stats_are_the_real_meters():
    """The fake's FinishEvent.stats is a meter's Stats: the same JSON keys as the engine's."""
    real = Meter("ssd", 4, 64).stats()
    fake = next(e for e in ScriptedEngine(EngineConfig.build(target=dict(path="t"), draft=dict(path="d")))
                .generate(messages=[]) if isinstance(e, FinishEvent)).stats
    assert set(fake.to_dict()) == set(real.to_dict())
    assert set(fake.to_dict()["prespec"]) == set(real.to_dict()["prespec"])
    assert json.loads(json.dumps(fake.to_dict()))["tokens"] == fake.tokens > 0


def test_logs_go_to_a_file_while_the_app_runs(tmp_path, monkeypatch):
    import logging
    import sys

    from tui.logs import logs_to_file

    monkeypatch.setenv("SSD_EDGE_HOME", str(tmp_path))
    cli_like = logging.StreamHandler(sys.stderr)  # what the CLI installs on the ssd_edge logger
    logger = logging.getLogger("ssd_edge")
    logger.addHandler(cli_like)
    monkeypatch.setattr(logger, "propagate", False)
    try:
        with logs_to_file() as path:
            assert cli_like not in logger.handlers
            logging.getLogger("ssd_edge.llama.backend").warning("no GPU backend")
        assert cli_like in logger.handlers
        assert path == tmp_path / "logs" / "tui.log" and "no GPU backend" in path.read_text()
    finally:
        logger.removeHandler(cli_like)


def _session(tmp_path, engine_thread):
    """A Session with no app around it: a worker's body runs at once, on this thread, and what the
    workers post is kept in a list."""
    posted = []
    session = Session(default_config(), run_worker=lambda body, **kw: body(), post=posted.append,
                      engine_thread=engine_thread, clock=lambda: 1_700_000_000.0, pull=None)
    session.store = ChatStore(tmp_path / "chats")
    return session, posted


def test_session_writes_a_reply_and_queues_settings_until_it_ends(tmp_path):
    engine_thread = EngineThread()
    try:
        session, posted = _session(tmp_path, engine_thread)
        assert session.configure({"mode": "sd"}) == "no model is loaded yet"
        session.loaded(ScriptedEngine(default_config()))
        assert session.phase == "ready" and session.take_stream() is None  # nothing asked yet

        asked, reply = session.ask("explain SSD")
        assert session.phase == "generating" and session.chat.messages == [asked, reply]
        assert session.chat.title == "explain SSD" and session.engine.requests == [
            [{"role": "user", "content": "explain SSD"}]]
        assert [type(m) for m in posted] == [StreamWake]  # the whole reply came before the one drain
        assert session.configure({"mode": "sd", "max_tokens": 7}) is None  # queued: the reply is not drawn yet
        assert session.engine.configured == [] and session.max_tokens == 512

        streamed = session.take_stream()
        assert streamed.grew and streamed.ended and streamed.failure is None
        assert reply.content == REPLY and reply.note.startswith(f"{len(REPLY.split(' '))} tokens")
        assert session.live.final is not None and not session.live.generating
        assert session.end_reply() == {"mode": "sd", "max_tokens": 7} and session.phase == "ready"
        assert session.configure({"mode": "sd", "max_tokens": 7}) is None
        assert session.config.mode == "sd" and session.max_tokens == 7
        assert session.configure({"max_tokens": 0}) == "max tokens must be at least 1"

        session.save()
        assert session.store.load(session.chat.id).messages[1].content == REPLY
        assert session.delete_chat(session.chat.id) and session.chat.messages == []  # a fresh one
    finally:
        engine_thread.close()


def test_session_switch_without_a_draft_keeps_the_old_config_to_fall_back_to(tmp_path):
    engine_thread = EngineThread()
    try:
        session, _ = _session(tmp_path, engine_thread)
        engine = ScriptedEngine(default_config())
        session.loaded(engine)
        config = session.models_config("other.gguf", None)
        assert (config.target.path, config.draft, config.mode) == ("other.gguf", None, "lookup")  # ssd needs a draft
        assert session.release_engine() is engine and session.engine is None
        assert session.take_fallback().mode == "ssd" and session.take_fallback() is None
    finally:
        engine_thread.close()
