"""The mutation table: bugs planted in the real code (one monkeypatch each), and the check of the
fast layers that catches each. Every test here plants one bug, runs the check that is meant to
catch it, and asserts that the check fails; unplanted, the same checks pass in the tests they come
from (test_distribution_engine.py, test_rounds.py, tests/unit/test_drafters.py).

Each plant is a one-line patch on the most public name the code has, so that a rename of an
engine internal is a one-line change here too. What each bug is and which check kills it:

    sampling   temperature 10% high on the target's rows      exact distribution (t = 2.0, no filter)
    sampling   min-p dropped from the target's rows            exact distribution (t = 1.5, min-p 0.01)
    coupling   one noise for every position (position unkeyed) exact distribution of whole answers
    verify     one drafted token accepted past the first miss  every mode gives ar's tokens
    commit     Generation.take's room one token too large      every mode gives exactly max_tokens
    KV rollback  KVSeq.truncate keeps one rejected token       every mode gives ar's tokens, caches true
    hand-over  KVSeq.adopt takes the branch one token short    a prespec hit's branch is used whole
    n-gram     NgramDrafter.propose ignores the last token     the n-gram lookup equals its definition
    k_min      rounds.verifiable ignores --draft-min           no draft shorter than k_min is verified
"""

from __future__ import annotations

import pytest

import ssd_edge.coupling as coupling
import ssd_edge.engine as engine_mod
import ssd_edge.planning.planner as planner_mod
from distribution_check import check_follows_target
from ssd_edge.errors import DraftSideError
from ssd_edge.generation import Generation
from ssd_edge.llama.kvseq import KVSeq
from ssd_edge.speculation.drafters import NgramDrafter
from ssd_edge.verify import verify
from test_distribution_engine import FILTERED, FLAT, LENGTH, N, PROMPT, fake_engine
from test_rounds import check_draft_min, check_hand_over, check_modes_equal_ar


def distribution(setting):
    return lambda: check_follows_target(fake_engine("sd"), PROMPT, LENGTH, setting, N, "sd")


def ngram_definition():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "unit" / "test_drafters.py"
    spec = importlib.util.spec_from_file_location("test_drafters_for_mutations", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return lambda: [mod.test_ngram_lookup_equals_the_plain_definition(lo, hi) for lo, hi in ((1, 4), (2, 4))]


real_commit, real_truncate, real_adopt, real_propose, real_gumbel_draw, real_drawer = (
    Generation.take, KVSeq.truncate, KVSeq.adopt, NgramDrafter.propose, coupling.gumbel_draw, coupling.Drawer.__init__)

# (what is planted, where, the patch as (object, attribute, replacement), the check that must fail)
MUTATIONS = {
    "sampling-temperature": (coupling.Drawer, "__init__", lambda self, s, seed, hook=None: real_drawer(
                                 self, s.model_copy(update={"temperature": s.temperature * 1.1}), seed, hook),
                             distribution(FLAT)),
    "sampling-min-p-dropped": (coupling.Drawer, "__init__", lambda self, s, seed, hook=None: real_drawer(
                                   self, s.model_copy(update={"min_p": 0.0}), seed, hook),
                               distribution(FILTERED)),
    "coupling-shared-noise": (coupling, "gumbel_draw", lambda ids, p, seed, position: real_gumbel_draw(ids, p, seed, 0),
                              distribution(FLAT)),
    "verify-off-by-one": (engine_mod, "verify", lambda d, x: (lambda a: (a, int(x[a])))(min(verify(d, x)[0] + 1, len(d))),
                          check_modes_equal_ar),
    "commit-room": (Generation, "take", lambda self, tokens, room: real_commit(self, tokens, room + 1),
                    check_modes_equal_ar),
    "kv-rollback": (KVSeq, "truncate", lambda self, n: real_truncate(self, min(n + 1, len(self.tokens))),
                    check_modes_equal_ar),
    "prespec-hand-over": (KVSeq, "adopt",
                          lambda self, seq, tokens, drop=True: real_adopt(self, seq, list(tokens)[:-1], drop),
                          check_hand_over),
    "ngram-drafter": (NgramDrafter, "propose", lambda self, history, k: real_propose(self, list(history)[:-1], k),
                      ngram_definition()),
    "planner-k-min": (planner_mod, "verifiable", lambda draft, k_min: draft, check_draft_min),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_the_planted_bug_is_caught(name, monkeypatch):
    obj, attr, bug, check = MUTATIONS[name]
    assert hasattr(obj, attr), f"{name}: {obj.__name__}.{attr} is gone; re-point this mutation"
    monkeypatch.setattr(obj, attr, bug)
    with pytest.raises((AssertionError, DraftSideError)) as caught:
        check()
    # (an assertion on SSD's worker thread reaches the engine as the draft side's failure, caused by it)
    assert isinstance(caught.value, AssertionError) or isinstance(caught.value.__cause__, AssertionError)
