"""The terminal chat loop (ssd_edge/cli/chat.py) without a TTY: lines from a stream,
output to a rich Console, and the scripted engine (tests/scripted.py), which
yields the real event types with a real Meter's Stats."""

from __future__ import annotations

import io
import json
import os
import signal
from typing import Any

import pytest
from rich.console import Console

from scripted import ONE_WORD, ScriptedEngine, default_config
from ssd_edge.cli.chat import ChatSession, stream_reader
from ssd_edge.errors import ConfigError, DecodeError

REPLY = "Speculation lets a small model draft tokens that the target checks in one batch."


def one_word_engine(reply: str = REPLY, n_ctx: int = 512) -> ScriptedEngine:
    """The scripted engine, a word per round: tests here act between words (before_token)."""
    return ScriptedEngine(default_config(n_ctx=n_ctx), reply, script=ONE_WORD)


def session_for(engine: ScriptedEngine, **kwargs: Any) -> tuple[ChatSession, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, width=200, soft_wrap=True, color_system=None)
    kwargs.setdefault("max_tokens", 256)
    return ChatSession(engine, console, **kwargs), out


def chat(engine: ScriptedEngine, text: str, **kwargs: Any) -> tuple[int, str, ChatSession]:
    session, out = session_for(engine, **kwargs)
    code = session.run(stream_reader(io.StringIO(text), session.console))
    return code, out.getvalue(), session


def test_answer_streams_with_a_stats_line():
    engine = one_word_engine()
    code, out, session = chat(engine, "Hello there\n")
    assert code == 0
    assert "you › Hello there" in out
    assert REPLY in out
    stats = out.split(REPLY, 1)[1]
    assert "14 tokens" in stats and "tok/s" in stats and "acceptance 1.00" in stats
    assert "hit rate 1.00 healthy" in stats and "mode ssd" in stats
    assert session.messages == [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": REPLY}]
    assert engine.requests == [[{"role": "user", "content": "Hello there"}]]


def test_multiline_input_backslash_and_block():
    engine = one_word_engine()
    code, out, _ = chat(engine, 'first \\\nsecond\n"""\nline one\n\nline three\n"""\n"""one liner"""\n')
    assert code == 0
    sent = [r[-1]["content"] for r in engine.requests]
    assert sent == ["first \nsecond", "line one\n\nline three", "one liner"]


def test_history_is_sent_each_turn_with_the_system_prompt():
    engine = one_word_engine()
    chat(engine, "one\ntwo\n", system="Be brief.")
    assert [m["role"] for m in engine.requests[1]] == ["system", "user", "assistant", "user"]
    assert engine.requests[1][0]["content"] == "Be brief."


def test_slash_commands_change_settings():
    engine = one_word_engine()
    code, out, _ = chat(engine, "/mode ar\n/k 6\n/temp 0.3\n/k\n")
    assert code == 0
    cfg = engine.config
    assert (cfg.mode, cfg.spec.k, cfg.sampling.temperature) == ("ar", 6, 0.3)
    assert "mode ar · k 6 · temp 0.3" in out


def test_the_settings_line_says_the_draft_length_each_mode_runs():
    engine = one_word_engine()
    code, out, _ = chat(engine, "/mode sd\n/mode auto\n/mode ar\n")
    assert code == 0
    assert "mode sd · k 3 · temp 0" in out  # FIXED_K without -k, not "auto"
    assert "mode auto · k auto · temp 0" in out and "mode ar · temp 0" in out  # ar drafts nothing


@pytest.mark.parametrize("line,message", [
    ("/temp -1", "error: /temp -1: must be at least 0"),
    ("/k 0", "error: /k 0: must be at least 1"),
    ("/k many", "error: /k needs a number, not 'many'"),
    ("/mode fast", "error: /mode fast: choose one of ar, sd, lookup, ssd, auto"),
    ("/bogus", "unknown command /bogus (/help lists them)"),
])
def test_bad_slash_commands_say_why_and_change_nothing(line, message):
    engine = one_word_engine()
    before = engine.config
    code, out, _ = chat(engine, line + "\nstill here\n")
    assert code == 0 and message in out
    assert engine.config == before
    assert len(engine.requests) == 1  # the session went on


def test_system_clear_stats_help_quit():
    engine = one_word_engine()
    text = "/stats\n/system Talk like a pirate.\n/system\nhi\n/stats\n/clear\n/system none\n/help\n/quit\nnever sent\n"
    code, out, session = chat(engine, text)
    assert code == 0
    assert "no answer yet" in out
    assert "system prompt: Talk like a pirate." in out
    assert engine.requests[0][0] == {"role": "system", "content": "Talk like a pirate."}
    assert "per-position acceptance" in out and "prespec hits / partial / misses" in out  # the /stats table
    assert "conversation cleared" in out and session.messages == [] and session.system == ""
    assert "/save" in out and "/mode" in out  # /help
    assert len(engine.requests) == 1  # /quit: nothing after it ran


def test_double_slash_sends_a_literal_slash():
    engine = one_word_engine()
    chat(engine, "//etc/hosts is a file\n")
    assert engine.requests[0][-1]["content"] == "/etc/hosts is a file"


def test_save_json_markdown_and_default_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_EDGE_CHATS", str(tmp_path / "chats"))
    engine = one_word_engine()
    j, md = tmp_path / "c.json", tmp_path / "c.md"
    code, out, session = chat(engine, f"What is SSD?\n/save {j}\n/save {md}\n/save\n", system="sys")
    assert code == 0 and f"saved 2 messages to {j}" in out
    data = json.loads(j.read_text())
    assert data["format"] == 1 and data["system"] == "sys" and data["title"] == "What is SSD?"
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert "**user:**" in md.read_text() and REPLY in md.read_text()
    default = tmp_path / "chats" / f"{session.chat_id}.json"
    assert default.exists() and json.loads(default.read_text())["messages"] == data["messages"]
    chats = pytest.importorskip("tui.chats")  # the TUI reads chats saved here
    assert chats.Chat.from_json(data).engine_messages()[-1]["content"] == REPLY


def test_save_to_an_unwritable_place_is_an_error_not_a_crash(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, out, _ = chat(one_word_engine(), f"/save {blocker}/sub/c.json\nhi\n")
    assert code == 0 and "error: cannot save to" in out and REPLY in out


def test_ctrl_c_stops_the_answer_not_the_session():
    engine = one_word_engine()
    asked: list[int] = []

    def interrupt(i: int) -> None:
        if i == 3 and not asked:
            asked.append(i)
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C does; CancelOnSignal turns it into cancel
    engine.before_token = interrupt
    handler = signal.getsignal(signal.SIGINT)
    code, out, session = chat(engine, "first question\nsecond question\n")
    assert code == 0
    assert "(stopped)" in out
    first, second = out.split("you › second question")
    assert "Speculation lets a" in first and REPLY not in first   # cut after three words
    assert REPLY in second                                        # the next question was answered in full
    assert session.messages[1] == {"role": "assistant", "content": "Speculation lets a"}
    assert signal.getsignal(signal.SIGINT) is handler             # the handler is restored


def test_sigterm_during_an_answer_ends_the_session_with_143():
    engine = one_word_engine()
    engine.before_token = lambda i: os.kill(os.getpid(), signal.SIGTERM) if i == 2 else None
    code, out, _ = chat(engine, "first\nnever answered\n")
    assert code == 143 and "(stopped)" in out
    assert len(engine.requests) == 1


def test_ctrl_c_at_the_prompt_discards_the_line():
    lines = iter(["typed half", None])
    calls = {"n": 0}

    def reader(prompt: str) -> str | None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        return next(lines)
    engine = one_word_engine()
    session, out = session_for(engine)
    assert session.run(reader) == 0
    assert "input discarded" in out.getvalue()
    assert engine.requests[0][-1]["content"] == "typed half"


def test_long_conversations_drop_the_oldest_turns():
    engine = one_word_engine(reply="word " * 20, n_ctx=120)
    code, out, session = chat(engine, "".join(f"question number {i} " + "pad " * 10 + "\n" for i in range(5)))
    assert code == 0 and "left out the 2 oldest messages to fit the context of 120 tokens" in out
    last = engine.requests[-1]
    assert last[-1]["content"].startswith("question number 4")
    assert not any(m["content"].startswith("question number 0") for m in last)


def test_a_message_longer_than_the_context_is_refused_and_forgotten():
    engine = one_word_engine(n_ctx=64)
    code, out, session = chat(engine, "long " * 100 + "\nshort one\n")
    assert code == 0
    assert "error: the prompt has 104 tokens and does not fit in the context of 64" in out
    assert "/clear starts over" in out
    assert session.messages[0]["content"] == "short one"


def test_context_filling_mid_answer_stops_cleanly_and_says_why():
    engine = one_word_engine(reply="more " * 200, n_ctx=64)
    code, out, session = chat(engine, "tell me everything\n")
    assert code == 0
    assert "(stopped: the context of 64 tokens is full; /clear starts over)" in out
    assert session.messages[-1]["role"] == "assistant"


def test_engine_errors_are_reported_and_the_session_goes_on():
    engine = one_word_engine()

    def fail(i: int) -> None:
        if i == 2 and len(engine.requests) == 1:
            raise DecodeError("llama_decode failed with code -3 (fake.gguf)")
    engine.before_token = fail
    code, out, session = chat(engine, "first\nsecond\n")
    assert code == 0
    assert "error: llama_decode failed with code -3 (fake.gguf)" in out
    assert [m["content"] for m in session.messages] == ["second", REPLY]


def test_invalid_utf8_input_is_a_config_error():
    engine = one_word_engine()
    session, out = session_for(engine)
    stream = io.TextIOWrapper(io.BytesIO(b"hi \xff\xfe there\n"), encoding="utf-8", errors="strict")
    with pytest.raises(ConfigError, match=r"the input is not valid UTF-8 \(byte 0xff\)"):
        session.run(stream_reader(stream, session.console))
