"""`ssd-edge generate --suffix TEXT|@FILE` on the fake backend with FIM tokens: the answer is the engine's own
over the layout (infill.py) of the prompt as the prefix and the suffix; a model without FIM tokens, and
--suffix with --chat, exit 2 with one line saying why."""

from __future__ import annotations

import pytest

from fakes import FakeContext, FakeModel
from ssd_edge.cli import loader
from ssd_edge.config import EngineConfig
from ssd_edge.engine import Engine
from ssd_edge.events import FinishEvent
from ssd_edge.infill import layout
from test_cli import clean_env, one_error, run  # noqa: F401  (clean_env: test_cli's autouse fixture)


def engine(fim: bool = True) -> Engine:
    cfg = EngineConfig.build(target=dict(path="fake-target", threads=1), n_ctx=1024, mode="ar")
    target = FakeModel("target", fim=fim)
    return Engine.from_parts(cfg, target, FakeContext(target, n_ctx=1024))


@pytest.fixture
def loaded(monkeypatch):
    def use(eng: Engine) -> Engine:
        monkeypatch.setattr(loader, "load_engine", lambda cfg, s: eng)
        return eng
    return use


def test_generate_with_a_suffix_fills_in_the_middle(loaded, tmp_path):
    reference = engine()
    laid = layout(reference.target, "def f(", "):\n    pass\n", n_batch=512, n_ctx=1024, n_predict=10)
    want = [ev for ev in reference.generate(tokens=list(laid.tokens), max_tokens=10) if isinstance(ev, FinishEvent)]
    loaded(engine())
    code, out, err = run(["generate", "def f(", "--suffix", "):\n    pass\n", "-n", "10", "-q"])
    assert code == 0, err
    assert out == want[0].text
    (tmp_path / "after.py").write_text("):\n    pass\n")
    loaded(engine())
    code, out, _ = run(["generate", "def f(", "--suffix", f"@{tmp_path / 'after.py'}", "-n", "10", "-q"])
    assert code == 0 and out == want[0].text


def test_a_model_without_fim_tokens_exits_2(loaded):
    loaded(engine(fim=False))
    code, _, err = run(["generate", "def f(", "--suffix", "x"])
    assert code == 2 and "has no fill-in-the-middle tokens" in one_error(err)


def test_suffix_and_chat_do_not_go_together(loaded):
    loaded(engine())
    code, _, err = run(["generate", "hi", "--suffix", "x", "--chat"])
    assert code == 2 and "--suffix" in one_error(err)


def test_a_missing_suffix_file_is_named(loaded):
    loaded(engine())
    code, _, err = run(["generate", "hi", "--suffix", "@/nonexistent/after.py"])
    assert code == 2 and "no such file: /nonexistent/after.py" in one_error(err)
