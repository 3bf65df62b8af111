"""The llama.cpp adapter on real GGUF files (SmolLM2-135M; the Qwen target's
check is in tests/default_pair/test_backend_qwen.py, the checks of a model path
that need no library in tests/unit/test_model_files.py).

Batched vs one-token logits: on SmolLM2 (Q4_1) they were bitwise equal in every
measurement here, so the tolerance is tight (SMALL_TOL).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import testpair
from logits_check import CONTINUATION, PROMPT, check_batched_equals_one_token, new_ctx, prefill

from ssd_edge.errors import ContextFullError, CorruptModelError, DecodeError, VocabMismatchError

pytestmark = pytest.mark.real

SMALL_TOL = 1e-3


@pytest.fixture(scope="module")
def model(small_pair):
    from ssd_edge.llama.backend import Model

    m = Model(small_pair[0])
    yield m
    m.close()


# ---------------------------------------------------------------- model metadata and tokens


def test_model_info(model):
    info = model.info()
    assert info.n_vocab == model.n_vocab == 49152 and info.n_layer == 30
    assert info.n_params > 100_000_000 and info.size_bytes > 0 and info.kv_bytes_per_cell > 0
    assert info.gpu_layers == 0 or info.gpu_layers <= info.n_layer + 1
    assert info.path.endswith(".gguf") and info.description


@pytest.mark.parametrize("text", [
    PROMPT,
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "héllo wörld 🦀 日本語 ünïcödé — “quotes”",
])
def test_tokenize_detokenize_round_trip(model, text):
    toks = model.tokenize(text, add_special=False)
    assert toks and all(0 <= t < model.n_vocab for t in toks)
    assert model.detokenize(toks) == text
    assert b"".join(model.piece(t) for t in toks) == text.encode()


def test_special_tokens(model):
    assert model.tokenize("<|im_start|>", add_special=False, parse_special=True) == [1]
    assert len(model.tokenize("<|im_start|>", add_special=False, parse_special=False)) > 1
    assert model.token_text(2) == "<|im_end|>" and model.is_eog(2) and not model.is_eog(100)
    assert model.piece(2) == b""  # special tokens render as nothing


def test_render_chat_with_the_gguf_template(model):
    assert "<|im_start|>" in (model.chat_template() or "")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "How are you?"}]
    text = model.render_chat(msgs)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
                    "<|im_start|>assistant\nHi!<|im_end|>\n<|im_start|>user\nHow are you?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert not model.render_chat(msgs, add_assistant=False).endswith("<|im_start|>assistant\n")
    toks = model.tokenize(text, parse_special=True)
    assert toks.count(1) == 5 and toks.count(2) == 4  # <|im_start|>, <|im_end|> as single tokens


def test_long_chat_message_renders_whole(model):
    long = "word " * 5000
    text = model.render_chat([{"role": "user", "content": long}])
    assert long in text and text.endswith("<|im_start|>assistant\n")


# ---------------------------------------------------------------- decoding and the KV cache


def test_batched_decode_equals_one_token_decodes(model):
    check_batched_equals_one_token(model, SMALL_TOL)


def test_seq_rm_rollback_then_redecode_equals_a_fresh_context(model):
    prompt = model.tokenize(PROMPT)
    n = len(prompt)
    ext = model.tokenize(CONTINUATION, add_special=False)
    rejected, accepted = [17, 42, 99, 1000], ext[:4]
    ctx = new_ctx(model)
    fresh = new_ctx(model)
    try:
        prefill(ctx, prompt)
        ctx.decode(rejected, range(n, n + 4), [0] * 4, [0, 1, 2, 3])
        assert ctx.seq_pos_max(0) == n + 3
        ctx.seq_rm(0, n + 1, -1)  # first a partial rollback (one rejected token kept), then the rest
        assert ctx.seq_pos_max(0) == n
        ctx.seq_rm(0, n, -1)
        assert ctx.seq_pos_max(0) == n - 1
        rows = ctx.decode(accepted, range(n, n + 4), [0] * 4, [0, 1, 2, 3])
        prefill(fresh, prompt)
        want = fresh.decode(accepted, range(n, n + 4), [0] * 4, [0, 1, 2, 3])
        assert float(np.abs(rows - want).max()) <= SMALL_TOL
        assert (rows.argmax(1) == want.argmax(1)).all()
    finally:
        ctx.close()
        fresh.close()


def test_a_decode_that_wakes_ssd_s_worker_is_the_same_decode(model):
    """Context.wake set (SSD's worker beside this target): each decode bumps the word from C as it starts
    (native.decode_woken), and its rows are a plain decode's."""
    import threading

    from ssd_edge.speculation.prespec.handoff import Handoff

    wake = Handoff(abort=threading.Event()).wake
    if wake is None:
        pytest.skip("ssd_edge.native is not built")
    prompt = model.tokenize(PROMPT)
    ext = model.tokenize(CONTINUATION, add_special=False)[:4]
    woken, plain = new_ctx(model), new_ctx(model)
    try:
        woken.wake = wake
        before = wake.seen()
        prefill(woken, prompt)
        rows = woken.decode(ext, range(len(prompt), len(prompt) + 4), [0] * 4, [0, 1, 2, 3])
        assert wake.seen() == before + 2 and woken.started > 0
        prefill(plain, prompt)
        want = plain.decode(ext, range(len(prompt), len(prompt) + 4), [0] * 4, [0, 1, 2, 3])
        assert np.array_equal(rows, want)
    finally:
        woken.close()
        plain.close()


def test_two_branches_in_one_unified_batch(model):
    """Sequences 1 and 2 share the prompt's cells (seq_cp, metadata only) and decode in one batch;
    each must equal decoding its branch alone."""
    prompt = model.tokenize(PROMPT)
    n = len(prompt)
    b1 = model.tokenize(" between two", add_special=False)
    b2 = model.tokenize(" of a batch of", add_special=False)
    ctx = new_ctx(model, n_seq_max=3)
    try:
        prefill(ctx, prompt)
        ctx.seq_cp(0, 1)
        ctx.seq_cp(0, 2)
        toks = b1 + b2
        pos = list(range(n, n + len(b1))) + list(range(n, n + len(b2)))
        seqs = [1] * len(b1) + [2] * len(b2)
        rows = ctx.decode(toks, pos, seqs, list(range(len(toks))))
        assert ctx.seq_pos_max(1) == n + len(b1) - 1 and ctx.seq_pos_max(2) == n + len(b2) - 1
        assert ctx.seq_pos_max(0) == n - 1  # the main sequence is untouched
        for branch, got in ((b1, rows[: len(b1)]), (b2, rows[len(b1):])):
            alone = new_ctx(model)
            try:
                prefill(alone, prompt)
                want = alone.decode(branch, range(n, n + len(branch)), [0] * len(branch), list(range(len(branch))))
            finally:
                alone.close()
            assert float(np.abs(got - want).max()) <= SMALL_TOL
            assert (got.argmax(1) == want.argmax(1)).all()
        # dropping a branch leaves the other intact
        ctx.seq_rm(1, 0, -1)
        assert ctx.seq_pos_max(1) == -1 and ctx.seq_pos_max(2) == n + len(b2) - 1
    finally:
        ctx.close()


def test_one_token_in_two_sequences(model):
    """A token may belong to several sequences at once (n_seq_id > 1)."""
    prompt = model.tokenize(PROMPT)
    ctx = new_ctx(model, n_seq_max=3)
    try:
        ctx.decode(prompt, range(len(prompt)), [(0, 1)] * len(prompt), [len(prompt) - 1])
        assert ctx.seq_pos_max(0) == ctx.seq_pos_max(1) == len(prompt) - 1
    finally:
        ctx.close()


def test_decode_errors(model):
    ctx = new_ctx(model, n_ctx=256, n_batch=16)
    try:
        with pytest.raises(DecodeError, match="exceeds n_batch=16"):
            ctx.decode(list(range(20)), range(20), [0] * 20, [0])
        with pytest.raises(ContextFullError, match="full"):
            ctx.decode([5], [ctx.n_ctx], [0], [0])
        prefill(ctx, [5, 6, 7])
        with pytest.raises(DecodeError, match=r"llama_decode failed .*SmolLM2"):
            ctx.decode([8], [10], [0], [0])  # a gap: the sequence is stored up to 2
        assert ctx.decode([], [], [], []).shape == (0, model.n_vocab)
        assert ctx.decode([8], [3], [0], [0]).shape == (1, model.n_vocab)  # still usable
    finally:
        ctx.close()


def test_text_stream_never_emits_a_replacement_character(model):
    from ssd_edge.generation import TextStream

    text = "héllo wörld 🦀 日本語 ünïcödé — “quotes” 🎉🎉"
    toks = model.tokenize(text, add_special=False)
    split = [t for t in toks if not _valid_utf8(model.piece(t))]
    assert split, "the text should contain characters split across tokens"
    stream = TextStream(model)
    out = [stream.push(t) for t in toks]
    assert all("\ufffd" not in piece for piece in out)
    assert "".join(out) + stream.flush() == text


def _valid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# ---------------------------------------------------------------- bad files


def _load(path):
    from ssd_edge.llama.backend import Model

    return Model(path)


@pytest.mark.parametrize("n_bytes", [4, 6, 1024, 10_000_000, -10])
def test_truncated_gguf_is_a_corrupt_model_error(small_pair, tmp_path, n_bytes):
    data = small_pair[0].read_bytes()
    bad = tmp_path / f"truncated{n_bytes}.gguf"
    bad.write_bytes(data[:n_bytes])
    with pytest.raises(CorruptModelError) as err:
        _load(bad)
    assert str(bad) in str(err.value) and "\n" not in str(err.value) and err.value.exit_code == 3


def test_gguf_header_with_garbage_is_a_corrupt_model_error(tmp_path):
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(range(256)) * 8)
    with pytest.raises(CorruptModelError, match="llama.cpp could not load") as err:
        _load(bad)
    assert str(bad) in str(err.value) and err.value.exit_code == 3


def edited_gguf(src: Path, dst: Path, layers: int, token_edits: dict[int, str]) -> Path:
    """A copy of `src` with only `layers` blocks and some vocabulary entries renamed."""
    return testpair.rewrite_gguf(src, dst, layers, lambda tokens: [token_edits.get(i, t) for i, t in enumerate(tokens)])


@pytest.fixture(scope="module")
def renamed_vocab(small_pair, tmp_path_factory) -> Path:
    """SmolLM2 with 2 blocks and vocabulary entry 300 renamed (same token count)."""
    return edited_gguf(small_pair[0], tmp_path_factory.mktemp("vocab") / "renamed-vocab.gguf", 2,
                       {300: "zzq_not_in_smollm"})


def test_vocabulary_mismatch_same_size(model, small_pair, renamed_vocab):
    """Same token count, one entry different: caught, and the message names both files and the token."""
    from ssd_edge.llama.backend import check_same_vocab

    other = _load(renamed_vocab)
    try:
        assert other.n_vocab == model.n_vocab
        with pytest.raises(VocabMismatchError, match=r"SmolLM2-135M-Instruct\.Q4_1\.gguf and draft renamed-vocab"
                                                     r"\.gguf .*token 300") as err:
            check_same_vocab(model, other)
        assert "\n" not in str(err.value)
        check_same_vocab(model, _load(small_pair[1]))  # the real draft shares the vocabulary
    finally:
        other.close()


def test_vocabulary_mismatch_other_model(model):
    """SmolLM2 (49,152 tokens) against Gemma 3 270M (262,144): pulled once (253 MB) and cached."""
    from ssd_edge.llama.backend import check_same_vocab
    from ssd_edge.models import catalog

    cat = catalog.load_catalog()
    gemma_path, _ = catalog.pull(cat.get("gemma3-270m"))
    gemma = _load(gemma_path)
    try:
        with pytest.raises(VocabMismatchError, match=r"SmolLM2.*gemma-3-270m.*49152 vs 262144"):
            check_same_vocab(model, gemma)
    finally:
        gemma.close()


def test_engine_refuses_a_mismatched_pair(small_pair, renamed_vocab):
    from ssd_edge.config import EngineConfig
    from ssd_edge.engine import Engine

    cfg = EngineConfig.build(target=dict(path=str(small_pair[0])), draft=dict(path=str(renamed_vocab)), n_ctx=256,
                             mode="sd")
    with pytest.raises(VocabMismatchError, match="renamed-vocab.gguf"):
        Engine(cfg)


def test_row_tolerance_script_measures_the_small_pair_bitwise_equal(small_pair, tmp_path):
    """scripts/row_tolerance.py, the measurement behind ROW_TOL and TIE_TOL (tests/lossless_check.py),
    run small: on the small pair batched and one-token rows are bitwise equal, so it must find 0.0
    everywhere, over every row it compared."""
    import json
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "scripts" / "row_tolerance.py"
    out = tmp_path / "rows.json"
    p = subprocess.run([sys.executable, str(script), "--pair", "small", "--prompts", "2", "--tokens", "6",
                        "--batches", "2", "4", "--threads", "1", "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    found = json.loads(out.read_text())
    rows = found["threads"]["1"]
    assert rows["row_diff"]["n"] == rows["gap_shift"]["n"] > 0
    assert rows["row_diff"]["max"] == 0.0 and rows["gap_shift"]["max"] == 0.0
    assert found["implied"] == {"ROW_TOL": 0.0, "TIE_TOL": 0.0}
