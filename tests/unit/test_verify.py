"""verify: edge cases of the acceptance rule (accept while the draft equals the target's draw).

That the target's draws follow its distribution is tests/unit/test_coupling.py and
tests/unit/test_distribution.py; that every mode commits exactly them is
tests/engine/test_auto.py and tests/real/test_lossless.py. Here each case has a known answer.
"""

from __future__ import annotations

import numpy as np
import pytest

from ssd_edge.coupling import gumbel_pick
from ssd_edge.verify import verify


# ---------------------------------------------------------------- the rule

def test_k0_emits_the_targets_draw():
    assert verify([], [5]) == (0, 5)


def test_all_accepted_gives_the_bonus():
    assert verify([1, 2, 3], [1, 2, 3, 7]) == (3, 7)


def test_first_rejected_gives_the_recovery():
    assert verify([4, 2, 3], [1, 2, 3, 7]) == (0, 1)


def test_acceptance_stops_at_the_first_mismatch():
    # position 2 would match again, but acceptance is a prefix
    assert verify([1, 9, 3], [1, 2, 3, 7]) == (1, 2)


def test_it_needs_one_row_more_than_the_draft():
    with pytest.raises(AssertionError):
        verify([1, 2], [1, 2])


def test_sampled_rounds_commit_the_targets_draws_whatever_was_drafted():
    """With coupled draws, a round commits x[:a + 1], the target's own draws, for any draft."""
    rng = np.random.default_rng(0)
    for trial in range(200):
        p = rng.dirichlet(np.ones(12) * 0.5, size=4)
        x = [gumbel_pick(row, 7, 100 + i) for i, row in enumerate(p)]
        draft = [int(t) for t in rng.integers(0, 12, 3)]
        draft[:trial % 4] = x[:trial % 4]  # a prefix of right guesses, then anything
        a, b = verify(draft, x)
        assert [*draft[:a], b] == x[:a + 1]
        assert a >= trial % 4
