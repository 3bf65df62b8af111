"""Fill-in-the-middle prompts (ssd_edge/infill.py) on the fake model with FIM tokens: llama-server's layout
token by token, its cuts to n_batch and n_ctx, a model without FIM tokens refused, the Python API's answer
equal to the engine's own over the layout; and the stop rules editors send (ssd_edge/stops.py)."""

from __future__ import annotations

import pytest

from fakes import FIM, FakeContext, FakeModel
from ssd_edge.config import EngineConfig
from ssd_edge.engine import Engine
from ssd_edge.errors import ConfigError
from ssd_edge.events import FinishEvent
from ssd_edge.infill import Chunk, infill, layout
from ssd_edge.stops import IndentLimit, TimeLimit


# ---------------------------------------------------------------- the layout

def test_the_layout_is_llama_servers_token_by_token():
    m = FakeModel(fim=True)
    t = lambda s: m.tokenize(s)  # noqa: E731  (the fake tokenizer adds no start token)
    got = layout(m, "ab", "cd", prompt="e", extra=[Chunk("xy", "f.py"), Chunk("z")], n_batch=512, n_ctx=4096)
    assert list(got.tokens) == ([FIM.rep, *t("myproject\n"), FIM.sep, *t("f.py\n"), *t("xy"), FIM.sep, *t("tmp\n"),
                                 *t("z"), FIM.sep, *t("filename\n"), FIM.pre, *t("ab"), *t("e"), FIM.suf, *t("cd"),
                                 FIM.mid])
    assert not got.truncated and (got.n_prefix, got.n_suffix) == (2, 2)


def test_the_layout_cuts_as_llama_server_does():
    """n_batch 16: the prefix keeps its last 12 tokens, the suffix its first 16/4 - 2 - len(prompt); the extra
    context the last n_ctx - n_batch - 2 * n_predict tokens (the oldest chunk goes first)."""
    m = FakeModel(fim=True)
    prefix, suffix = "abcdefghijklmnopqrst", "uvwxyz"
    got = layout(m, prefix, suffix, prompt="q", extra=[Chunk("o" * 30), Chunk("n" * 10)], n_batch=16, n_ctx=64,
                 n_predict=8)
    extra = [FIM.rep, *m.tokenize("myproject\n"), FIM.sep, *m.tokenize("tmp\n" + "o" * 30), FIM.sep,
             *m.tokenize("tmp\n" + "n" * 10), FIM.sep, *m.tokenize("filename\n")]
    assert (got.n_prefix, got.n_suffix, got.n_extra) == (12, 1, 64 - 16 - 16) and got.truncated
    assert list(got.tokens) == (extra[-32:] + [FIM.pre, *m.tokenize(prefix[-12:] + "q"), FIM.suf,
                                               *m.tokenize(suffix[:1]), FIM.mid])


def test_the_extra_context_leaves_the_answer_room():
    """With n_predict 0 (a warm-up) llama-server's budget, n_ctx - n_batch, plus a full prefix and suffix would
    pass n_ctx by a token: the extra context gives way, so that the prompt fits with room for one token."""
    m = FakeModel(fim=True)
    got = layout(m, "p" * 200, "s" * 200, extra=[Chunk("x" * 500)], n_batch=64, n_ctx=128, n_predict=0)
    assert (got.n_prefix, got.n_suffix) == (48, 14) and len(got.tokens) == 127 and got.n_extra == 127 - 65
    got = layout(m, "p" * 200, "s" * 200, extra=[Chunk("x" * 500)], n_batch=64, n_ctx=128, n_predict=10)
    assert got.n_extra == 128 - 64 - 20 and len(got.tokens) + 10 <= 128


def test_a_model_without_fim_tokens_cannot_lay_one_out():
    with pytest.raises(ConfigError, match="has no fill-in-the-middle tokens"):
        layout(FakeModel(), "a", "b")


def test_the_python_api_generates_the_middle():
    cfg = EngineConfig.build(target=dict(path="fake-target", threads=1), draft=dict(path="fake-draft", threads=1),
                             n_ctx=1024, mode="ar")
    target, draft = FakeModel("target", fim=True), FakeModel("draft", 3, fim=True)
    eng = Engine.from_parts(cfg, target, FakeContext(target, n_ctx=1024), draft,
                            FakeContext(draft, n_ctx=2048, n_seq_max=cfg.prespec.fanout_max + 1))
    laid = layout(eng.target, "ab", "cd", n_batch=cfg.n_batch, n_ctx=cfg.n_ctx, n_predict=12)
    ref = [ev for ev in eng.generate(tokens=list(laid.tokens), max_tokens=12) if isinstance(ev, FinishEvent)][0]
    fin = [ev for ev in infill(eng, "ab", "cd", max_tokens=12, mode="sd") if isinstance(ev, FinishEvent)][0]
    assert fin.tokens == ref.tokens and len(fin.tokens) == 12


# ---------------------------------------------------------------- stop rules

def test_indent_limit_cuts_the_first_line_that_leaves_the_block():
    rule = IndentLimit(4)
    assert rule.cut("x = 1", 0) is None                     # the first line is never checked
    assert rule.cut("x\n    y\n        z\n  ", 0) is None    # deep enough; the last line still open
    text = "x\n    y\n  w = 2"
    assert text[:rule.cut(text, 0)] == "x\n    y\n  "         # cut before the first character left of column 4
    assert rule.cut("x\n\n", 0) == 2                          # an empty line is left of it too (llama-server's rule)


def test_time_limit_ends_at_a_line_break_once_past_its_time():
    rule = TimeLimit(250)
    assert rule.cut("a\nb", 0.2) is None and rule.cut("ab", 0.3) is None
    assert rule.cut("a\nb", 0.3) == 3
