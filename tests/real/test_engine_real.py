"""The engine's generate() stream, stop strings and cancellation on the small real pair."""

from __future__ import annotations

import importlib.util
import threading
import time

import pytest

from native_build import skip_or_fail
from ssd_edge.config import EngineConfig
from ssd_edge.errors import ConfigError, ContextFullError
from ssd_edge.events import FinishEvent, TokenEvent

SPEC_MODES = ("sd", "lookup", "ssd")
native_built = importlib.util.find_spec("ssd_edge.native") is not None

COUNTING = "Count from 1 to 500, separated by commas: 1, 2, 3, 4, 5,"


def events(engine, **kwargs) -> tuple[list[TokenEvent], FinishEvent]:
    evs = list(engine.generate(**kwargs))
    assert all(isinstance(e, TokenEvent) for e in evs[:-1]) and isinstance(evs[-1], FinishEvent)
    return evs[:-1], evs[-1]


@pytest.mark.real
@pytest.mark.parametrize("mode", ("ar", *SPEC_MODES))
def test_event_stream_invariants(small_engine, mode):
    toks, fin = events(small_engine, prompt=COUNTING, max_tokens=40, mode=mode)
    assert fin.stop_reason == "length" and len(fin.tokens) == 40
    assert sum((e.tokens for e in toks), ()) == fin.tokens
    assert "".join(e.text for e in toks) + fin.tail == fin.text
    assert fin.text == small_engine.target.detokenize(fin.tokens)
    for e in toks:
        assert len(e.provenance) == len(e.tokens) >= 1
        assert e.round.accepted <= e.round.drafted and e.round.mode in ("ar", "sd", "lookup", "ssd", "rolled-back",
                                                                        "sla-cut")
        assert set(e.provenance) <= {"target", "draft", "prespec", "ngram"}
        assert e.provenance[-1] == "target" or len(fin.tokens) == e.live.tokens  # last is the target's, unless cut
    # each event carries the rounds since the last: one, or in ar the plain steps made in one C call
    assert [e.round.index for e in toks] == list(range(len(toks)))  # a round an event
    assert fin.stats.rounds == sum(e.rounds for e in toks)
    if mode == "ar" and native_built:
        assert any(e.rounds > 1 for e in toks)  # the steps after the prompt ran in C
    else:
        assert all(e.rounds == 1 for e in toks)
    assert fin.stats.tokens == 40 and fin.stats.mode == mode
    if mode != "ar":
        assert fin.stats.drafted > 0  # speculation really ran
        assert any(p != "target" for e in toks for p in e.provenance)


@pytest.mark.real
def test_same_seed_same_sample(small_engine):
    from ssd_edge.config import SamplingConfig

    s = SamplingConfig(temperature=1.0, seed=1234)
    for mode in ("ar", "sd"):
        a = small_engine.complete("Once upon a time", max_tokens=12, mode=mode, sampling=s)
        b = small_engine.complete("Once upon a time", max_tokens=12, mode=mode, sampling=s)
        assert a.tokens == b.tokens


@pytest.mark.real
def test_chat_messages_and_token_prompts(small_engine):
    msgs = [{"role": "user", "content": "Name a colour."}]
    by_msgs = small_engine.complete(messages=msgs, max_tokens=8, mode="ar")
    ids = small_engine.prompt_tokens(messages=msgs)
    assert ids[0] == 1  # <|im_start|> parsed as a special token
    by_ids = small_engine.complete(tokens=ids, max_tokens=8, mode="ar")
    assert by_msgs.tokens == by_ids.tokens


@pytest.mark.real
@pytest.mark.parametrize("mode", ("ar", *SPEC_MODES))
def test_stop_string_on_a_real_model(small_engine, mode):
    """The stop string is cut from the text (never sent in any delta) and the generation ends there."""
    ref = small_engine.complete(COUNTING, max_tokens=40, mode="ar").text
    stop = ref[ref.index("1") + 1:][:3]  # a few characters from the middle of the greedy answer
    assert len(stop) == 3
    toks, fin = events(small_engine, prompt=COUNTING, max_tokens=40, mode=mode, stop=[stop])
    assert fin.stop_reason == "stop"
    assert fin.text == ref[: ref.index(stop)] and stop not in fin.text
    sent = ""
    for e in toks:
        sent += e.text
        assert stop not in sent
    assert sent + fin.tail == fin.text


@pytest.mark.real
def test_errors_before_generating(small_engine):
    with pytest.raises(ConfigError, match="max_tokens"):
        list(small_engine.generate("hi", max_tokens=0))
    with pytest.raises(ConfigError, match="empty"):
        list(small_engine.generate("", max_tokens=4))
    with pytest.raises(ContextFullError, match="does not fit"):
        list(small_engine.generate(tokens=[100] * 2000, max_tokens=4))
    with pytest.raises(ConfigError, match="unknown setting 'speed'"):
        small_engine.configure(speed=3)


@pytest.mark.real
def test_one_generation_at_a_time(small_engine):
    gen = small_engine.generate(COUNTING, max_tokens=8, mode="ar")
    next(gen)
    with pytest.raises(RuntimeError, match="already generating"):
        list(small_engine.generate("hi", max_tokens=2))
    gen.close()  # closing the first releases the engine
    assert len(small_engine.complete("hi", max_tokens=2, mode="ar").tokens) == 2


@pytest.mark.real
def test_draft_modes_need_a_draft(small_pair):
    from ssd_edge.engine import Engine

    cfg = EngineConfig.build(target=dict(path=str(small_pair[0])), n_ctx=256, mode="sd")
    with pytest.raises(ConfigError, match="needs a draft model"):
        Engine(cfg)
    eng = Engine(EngineConfig.build(target=dict(path=str(small_pair[0])), n_ctx=256, mode="lookup"))
    try:
        with pytest.raises(ConfigError, match="needs a draft model"):
            list(eng.generate("hi", mode="ssd"))
        with pytest.raises(ConfigError, match="needs a draft model"):
            eng.configure(mode="sd")
        fin = eng.complete("1, 2, 3, 4, 5, 6,", max_tokens=12, mode="auto")
        assert fin.stats.mode == "auto" and set(fin.stats.speculators) <= {"none", "ngram"}
    finally:
        eng.close()


# ---------------------------------------------------------------- cancellation


def cancel_from_another_thread(engine, mode: str, after: int = 3):
    """Consume on a worker thread; cancel from this one once `after` events arrived.
    Returns (events received after the cancel, the FinishEvent, tokens before the cancel)."""
    cancel = threading.Event()
    received: list[tuple[float, object]] = []
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            for ev in engine.generate(COUNTING, max_tokens=500, mode=mode, cancel=cancel):
                received.append((time.monotonic(), ev))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    th = threading.Thread(target=consume)
    th.start()
    deadline = time.monotonic() + 120
    while len(received) < after and th.is_alive() and time.monotonic() < deadline:
        time.sleep(0.002)
    cancel.set()
    t_cancel = time.monotonic()  # after set(): a round in flight now may still finish, nothing later
    th.join(120)
    assert not th.is_alive() and not errors, errors
    late = [ev for t, ev in received if t > t_cancel and isinstance(ev, TokenEvent)]
    return late, received[-1][1]


@pytest.mark.real
@pytest.mark.parametrize("mode", ("ar", *SPEC_MODES))
def test_cancel_from_another_thread_stops_within_one_round(small_engine, mode):
    ref = small_engine.complete(COUNTING, max_tokens=30, mode="ar").tokens
    late, fin = cancel_from_another_thread(small_engine, mode)
    assert isinstance(fin, FinishEvent) and fin.stop_reason == "cancelled"
    assert len(late) <= 1, f"{len(late)} rounds ran after the cancel"
    assert 0 < len(fin.tokens) < 500
    # the engine is reusable afterwards and its KV state is consistent: greedy output unchanged
    assert small_engine.complete(COUNTING, max_tokens=30, mode=mode).tokens == ref


@pytest.mark.real
def test_cancel_before_the_start(small_engine):
    cancel = threading.Event()
    cancel.set()
    toks, fin = events(small_engine, prompt=COUNTING, max_tokens=50, mode="sd", cancel=cancel)
    assert toks == [] and fin.stop_reason == "cancelled" and fin.tokens == () and fin.text == ""


@pytest.mark.real
def test_configure_budget_down_and_back_up(small_engine):
    """The draft context is sized for the budget loaded with: lowering it and raising it back is fine."""
    loaded = small_engine.config.prespec.budget_cells
    try:
        small_engine.configure(budget_cells=4)
        assert small_engine.config.prespec.budget_cells == 4
        small_engine.configure(budget_cells=loaded)
        with pytest.raises(ConfigError, match="cannot grow"):
            small_engine.configure(budget_cells=loaded + 1)
    finally:
        small_engine.configure(budget_cells=loaded)


@pytest.mark.real
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_plain_steps_in_c_are_the_rounds_own_tokens(small_engine, monkeypatch, temperature):
    """Mode ar's steps after the prompt run in one C call each (engine._plain_run, native.steps); with them
    switched off every step is a round of the engine's Python loop. The two must give the same tokens,
    text and ending, greedy and sampled, ending on an end of generation, a stop string, or the length,
    each from an empty cache (a cached prefix changes the first batch: tests/lossless_check.py)."""
    from ssd_edge.config import SamplingConfig

    if not native_built:
        skip_or_fail("native.steps")

    s = SamplingConfig(temperature=temperature, seed=3)
    cases = [dict(messages=[{"role": "user", "content": m}], max_tokens=64)
             for m in ("Name a colour.", "Say hello.", "What is 2+2?")]
    cases.append(dict(prompt=COUNTING, max_tokens=60, stop=[" 12,"]))
    endings = set()
    for case in cases:
        runs = []
        for c_steps in (True, False):
            with monkeypatch.context() as m:
                if not c_steps:
                    m.setattr("ssd_edge.engine._plain_run", lambda *args: None)
                small_engine.target_kv.truncate(0)
                toks, fin = events(small_engine, mode="ar", sampling=s, **case)
            runs.append((fin.tokens, fin.text, fin.stop_reason, fin.stats.tokens, fin.stats.rounds, len(toks)))
        (tokens, text, reason, n, rounds, n_events), rounds_path = runs
        assert (tokens, text, reason, n, rounds) == rounds_path[:5], case
        assert n_events < rounds_path[5] or rounds <= 2  # the C path made several steps an event
        endings.add(reason)
    assert endings == {"eos", "length", "stop"}
