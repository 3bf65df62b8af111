"""The TUI leaves the model its cores (tui/cores.py): the engine's work runs on a thread started
before the UI thread lowers itself, so llama.cpp's threads (created by the engine thread) keep the
process's priority while the UI draws below them.

Every lowering happens in a throwaway thread: a thread cannot raise its priority again, and the test
process's own threads must keep theirs."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from tui.cores import EngineThread, lower_this_thread, urgent_keys_driver, yield_to_the_engine

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")


def in_thread(fn):
    """fn() in a fresh thread (at this thread's priority); its result, or its exception raised here."""
    out: dict = {}

    def body() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            out["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join(30)
    if "error" in out:
        raise out["error"]
    return out["value"]


def nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)  # Linux: the calling thread's


def test_the_engine_thread_keeps_the_priority_the_ui_thread_gives_up():
    base = nice()

    def ui() -> dict:
        engine = EngineThread()                      # started first, as run_app does
        try:
            did = lower_this_thread(f"nice:{base + 5}")
            child = in_thread(nice)                  # what a thread the UI starts would get
            return {"did": did, "ui": nice(), "engine": engine.call(nice), "child": child,
                    "engine_child": engine.call(lambda: in_thread(nice))}  # llama.cpp's threads, the worker's
        finally:
            engine.close()

    got = in_thread(ui)
    assert got["did"] == f"nice {base + 5}"
    assert got["ui"] == base + 5
    assert got["child"] == base + 5                  # inherited: why the engine needs a thread of its own
    assert got["engine"] == base and got["engine_child"] == base
    assert nice() == base                            # this thread untouched


def test_idle_puts_the_thread_under_sched_idle_or_nice_19():
    def ui() -> tuple:
        did = lower_this_thread("idle")
        return did, os.sched_getscheduler(0), nice()

    did, policy, value = in_thread(ui)
    assert (did, policy) == ("SCHED_IDLE", os.SCHED_IDLE) or (did, value) == ("nice 19", 19)


def test_the_environment_chooses_and_normal_or_nonsense_leave_it(monkeypatch, caplog):
    base = nice()
    monkeypatch.setenv("SSD_EDGE_TUI_PRIORITY", "normal")
    assert in_thread(lambda: (lower_this_thread(), nice())) == (None, base)
    if base <= 3:  # (above 3, nice 3 would be a raise, which an unprivileged thread is refused)
        monkeypatch.setenv("SSD_EDGE_TUI_PRIORITY", "nice:3")
        assert in_thread(lambda: (lower_this_thread(), nice())) == ("nice 3", 3)
    monkeypatch.setenv("SSD_EDGE_TUI_PRIORITY", "fast please")
    assert in_thread(lambda: (lower_this_thread(), nice())) == (None, base)
    assert "is not nice:N, idle or normal" in caplog.text


def test_engine_thread_returns_results_and_raises_errors_where_called():
    engine = EngineThread()
    try:
        assert engine.call(lambda: 6 * 7) == 42
        names = engine.call(lambda: threading.current_thread().name)
        assert names.startswith("ssd-edge-engine") and engine.call(lambda: threading.current_thread().name) == names
        with pytest.raises(ZeroDivisionError):
            engine.call(lambda: 1 / 0)
    finally:
        engine.close()


def test_yield_to_the_engine_lowers_the_ui_thread_and_shortens_the_switch_interval(monkeypatch):
    from tui.cores import SWITCH_INTERVAL_S

    monkeypatch.delenv("SSD_EDGE_TUI_PRIORITY", raising=False)
    before = sys.getswitchinterval()
    try:
        said = in_thread(yield_to_the_engine)
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
        assert said.startswith("UI thread nice 19")  # the default: not SCHED_IDLE, which starved the screen
    finally:
        sys.setswitchinterval(before)


def test_yield_to_the_engine_lowers_the_threads_it_is_given_and_no_other():
    stop = threading.Event()
    writer, spared = threading.Thread(target=stop.wait), threading.Thread(target=stop.wait)
    writer.start()
    spared.start()
    before = sys.getswitchinterval()
    try:
        in_thread(lambda: yield_to_the_engine(writer))
        lowered = lambda t: (os.sched_getscheduler(t.native_id) == os.SCHED_IDLE  # noqa: E731
                             or os.getpriority(os.PRIO_PROCESS, t.native_id) == 19)
        assert lowered(writer) and not lowered(spared)
    finally:
        stop.set()
        writer.join()
        spared.join()
        sys.setswitchinterval(before)


def test_the_urgent_keys_driver_hands_each_key_over_then_passes_every_message_on():
    from textual import events

    seen, passed = [], []

    class Base:  # stands for Textual's driver: only process_message matters here
        def process_message(self, message):
            passed.append(message)

    driver = urgent_keys_driver(Base, seen.append)()
    key, paste = events.Key("escape", None), events.Paste("text")
    driver.process_message(key)
    driver.process_message(paste)
    assert seen == ["escape"] and passed == [key, paste]
