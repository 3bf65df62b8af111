"""How many of the project's modules one round runs through: a newcomer following an `sd` round reads
these files and no others (docs/design.md, "An sd round, file by file", gives each a line).

The round is traced with sys.setprofile on the fake backend (tests/fakes.py): every Python function
that runs during the round's next() is recorded by its module, except what the fake backend itself
calls (the stand-in for llama.cpp is not a room of the house)."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

from fakes import FakeContext, FakeModel
from test_rounds import PROMPT, fake_engine

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = str(ROOT / "ssd_edge")
# the fake backend's files (tests/fakes.py, and the cell table it borrows): not counted, nor what runs beneath them
BACKEND = {inspect.getfile(c) for cls in (FakeContext, FakeModel) for c in cls.__mro__ if c is not object}

# The sd round, file by file (docs/design.md): at most 9, leaves such as verify.py and coupling.py included.
SD_ROUND = {"ssd_edge/engine.py", "ssd_edge/generation.py", "ssd_edge/planning/planner.py",
            "ssd_edge/planning/proposers.py", "ssd_edge/speculation/drafters.py", "ssd_edge/llama/kvseq.py",
            "ssd_edge/verify.py", "ssd_edge/coupling.py", "ssd_edge/metrics.py"}


def modules_of_one_round(mode: str, **sampling) -> set[str]:
    """The project modules whose functions run while the generation makes its third round."""
    from ssd_edge.config import SamplingConfig

    eng = fake_engine(mode)
    events = eng.generate(tokens=PROMPT, max_tokens=30, mode=mode, sampling=SamplingConfig(**sampling))
    next(events), next(events)  # the prompt's round, then one more: caches and estimates warm
    seen: set[str] = set()

    def called(frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(PACKAGE) or frame.f_code.co_filename in BACKEND:
            return
        f = frame.f_back
        while f is not None:  # beneath the fake backend: the stand-in's own work
            if f.f_code.co_filename in BACKEND:
                return
            f = f.f_back
        seen.add(Path(frame.f_code.co_filename).relative_to(ROOT).as_posix())

    sys.setprofile(called)
    try:
        next(events)
    finally:
        sys.setprofile(None)
    events.close()
    eng.close()
    return seen


def test_an_sd_round_runs_through_nine_modules():
    seen = modules_of_one_round("sd")
    assert seen == SD_ROUND, f"more: {sorted(seen - SD_ROUND)}, fewer: {sorted(SD_ROUND - seen)}"
    assert len(SD_ROUND) <= 9


def test_a_sampled_sd_round_adds_the_sampling_chain_alone():
    """Sampling, the target's draws go through the filter chain (sampling.py: top-k, top-p, min-p,
    temperature, as the config says): the one room a greedy round does not enter."""
    seen = modules_of_one_round("sd", temperature=0.8, seed=5)
    assert seen - SD_ROUND == {"ssd_edge/sampling.py", "ssd_edge/config.py"} and SD_ROUND <= seen


def test_the_trace_sees_a_module_the_round_reaches(monkeypatch):
    """The count is not blind: a round that reads the config's property each token is seen doing it."""
    from ssd_edge.speculation.drafters import ModelDrafter

    monkeypatch.setattr(ModelDrafter, "cand_temperature",
                        lambda self: 1.0 if self.sampling.greedy else self.sampling.temperature)
    assert "ssd_edge/config.py" in modules_of_one_round("sd", temperature=0.0)
