"""Shared fixtures.

Groups (markers):
  real          runs real GGUF models (SmolLM2-135M and a truncated draft of it); CI runs them
  default_pair  runs the default Qwen2.5-Coder 1.5B/0.5B pair (1.6 GB, pulled on first use); CI runs them

Fast loop while editing:  pytest -m "not real and not default_pair"
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import testpair  # noqa: E402


@pytest.fixture(scope="session")
def small_pair() -> tuple[Path, Path]:
    """(target, draft) GGUF paths of the cheap real test pair."""
    return testpair.ensure_pair()


@pytest.fixture(scope="session")
def default_pair() -> tuple[Path, Path]:
    """(target, draft) GGUF paths of the default Qwen pair, pulled (and verified) if needed."""
    from ssd_edge import catalog

    cat = catalog.load_catalog()
    target, _ = catalog.pull(cat.get(cat.default_target))
    draft, _ = catalog.pull(cat.get(cat.default_draft))
    return target, draft


def make_engine(pair: tuple[Path, Path], **overrides):
    """An Engine on a pair, one thread per model unless told otherwise."""
    from ssd_edge.config import EngineConfig
    from ssd_edge.engine import Engine

    target, draft = pair
    cfg = dict(target=dict(path=str(target), threads=1), draft=dict(path=str(draft), threads=1),
               n_ctx=1024, mode="ar")
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return Engine(EngineConfig.build(**cfg))


@pytest.fixture(scope="session")
def small_engine(small_pair):
    """One Engine on the small pair for the whole session (load once; tests set mode per call)."""
    eng = make_engine(small_pair)
    yield eng
    eng.close()
