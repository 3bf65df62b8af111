"""The engine's text handling (offline, with a fake vocabulary of raw byte pieces),
its typed errors and config errors. The generate() stream on real weights is in
tests/real/test_engine_real.py."""

from __future__ import annotations

import random

import pytest

from ssd_edge.config import EngineConfig
from ssd_edge.generation import StopText as _Text, TextStream
from ssd_edge.errors import (ConfigError, ContextFullError, CorruptModelError, DecodeError, FetchError, ModelError,
                             ModelNotFoundError, NotGGUFError, SSDEdgeError, VocabMismatchError)

SPEC_MODES = ("sd", "lookup", "ssd")


class BytePieces:
    """A vocabulary whose token i is the byte string pieces[i] (the only Model method TextStream uses)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def piece(self, token: int) -> bytes:
        return self.pieces[token]


def stream_of(chunks: list[bytes]) -> tuple[BytePieces, list[int]]:
    return BytePieces(chunks), list(range(len(chunks)))


# ---------------------------------------------------------------- TextStream: incremental UTF-8


def test_text_stream_holds_a_split_character_back():
    model, toks = stream_of([b"caf", b"\xc3", b"\xa9 ", b"\xf0\x9f", b"\xa6", b"\x80!"])  # "café 🦀!"
    ts = TextStream(model)
    out = [ts.push(t) for t in toks]
    assert out == ["caf", "", "é ", "", "", "🦀!"]
    assert ts.flush() == ""


def test_text_stream_random_byte_splits_never_emit_a_replacement_character():
    text = "héllo wörld 🦀 日本語 — “quotes” ünïcödé 🎉 end"
    data = text.encode()
    rng = random.Random(0)
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(1, 25)))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
        model, toks = stream_of(chunks)
        ts = TextStream(model)
        out = [ts.push(t) for t in toks]
        assert all("\ufffd" not in o for o in out)
        assert "".join(out) + ts.flush() == text


def test_text_stream_flushes_an_unfinished_character_as_replacement():
    model, toks = stream_of([b"ok", b"\xe6\x97"])  # the model stopped inside a character
    ts = TextStream(model)
    assert [ts.push(t) for t in toks] == ["ok", ""]
    assert ts.flush() == "\ufffd"


# ---------------------------------------------------------------- _Text: stop strings


def feed(chunks: list[bytes], stop: list[str]) -> tuple[_Text, list[str]]:
    """Push one token at a time, taking the text delta after each (as the engine does per round)."""
    model, toks = stream_of(chunks)
    text = _Text(model, stop)
    deltas = []
    for t in toks:
        text.push(t)
        deltas.append(text.take())
        if text.stopped:
            break
    return text, deltas


def test_stop_string_split_across_tokens_is_held_back_and_cut():
    text, deltas = feed([b"Hello S", b"T", b"OP and more"], ["STOP"])
    assert deltas == ["Hello ", "", ""]  # "S", then "ST" are held back: they could start STOP
    assert text.stopped and text.text == "Hello " and text.finish() == ""


def test_held_back_prefix_is_released_when_it_is_not_a_stop():
    text, deltas = feed([b"a ST", b"ART b"], ["STOP"])
    assert deltas == ["a ", "START b"] and not text.stopped


def test_held_back_prefix_comes_out_in_finish():
    text, deltas = feed([b"the end S", b"T"], ["STOP"])
    assert "".join(deltas) == "the end " and not text.stopped
    assert text.finish() == "ST" and text.text == "the end ST"


def test_earliest_of_several_stop_strings_wins():
    text, _ = feed([b"one two\n", b"\nthree END"], ["END", "\n\n"])
    assert text.stopped and text.text == "one two"


def test_stop_string_with_a_split_multibyte_character():
    text, deltas = feed([b"caf", b"\xc3", b"\xa9 au lait"], ["é au"])
    assert text.stopped and text.text == "caf" and "".join(deltas) == "caf"


def test_stop_strings_random_splits():
    """Random byte splits of random texts, with stop strings that may or may not occur: the text handed
    out never contains a stop string, is exactly the text up to the first stop, and nothing is lost."""
    rng = random.Random(1)
    alphabet = "ab é🦀\n"
    for _ in range(500):
        full = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        data = full.encode()
        cuts = sorted(set(rng.randint(1, max(1, len(data) - 1)) for _ in range(rng.randint(0, 12))))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)]) if b > a]
        text, deltas = feed(chunks, stops)
        sent = "".join(deltas) + text.finish()
        first = min((i for i in (full.find(s) for s in stops) if i >= 0), default=-1)
        want = full if first < 0 else full[:first]
        assert text.stopped == (first >= 0), (full, stops)
        assert sent == want == text.text, (full, stops, chunks)
        for i in range(len(deltas)):
            so_far = "".join(deltas[: i + 1])
            assert not any(s in so_far for s in stops)
            assert "\ufffd" not in so_far


def test_empty_stop_strings_are_ignored():
    text, deltas = feed([b"abc"], ["", ""])
    assert deltas == ["abc"] and not text.stopped


# ---------------------------------------------------------------- errors


def test_error_classes_and_exit_codes():
    codes = {ConfigError: 2, ModelError: 3, ModelNotFoundError: 3, NotGGUFError: 3, CorruptModelError: 3,
             VocabMismatchError: 3, FetchError: 4, ContextFullError: 5, DecodeError: 6}
    for cls, code in codes.items():
        assert issubclass(cls, SSDEdgeError) and cls.exit_code == code
        assert str(cls("model file not found: /x.gguf")) == "model file not found: /x.gguf"
    assert SSDEdgeError.exit_code == 1


@pytest.mark.parametrize("kwargs, where", [
    (dict(target=dict(path="m.gguf"), n_ctx=8), "n_ctx"),
    (dict(target=dict(path="m.gguf", threads=0)), "target.threads"),
    (dict(target=dict(path="m.gguf"), sampling=dict(temperature=-1)), "sampling.temperature"),
    (dict(target=dict(path="m.gguf"), spec=dict(ngram_min=3, ngram_max=2)), "ngram_max"),
    (dict(target=dict(path="m.gguf"), mode="fast"), "mode"),
    (dict(target=dict(path="m.gguf"), colour="red"), "colour"),
])
def test_config_errors_are_one_line_and_name_the_setting(kwargs, where):
    with pytest.raises(ConfigError) as err:
        EngineConfig.build(**kwargs)
    msg = str(err.value)
    assert msg.startswith("invalid setting: ") and where in msg and "\n" not in msg
