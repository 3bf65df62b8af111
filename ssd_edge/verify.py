"""Lossless verification of a draft against the target: a pure function on token ids.

Given k draft tokens d[0..k-1] and the target's own draws x[0..k] at the same
positions (x[i] from the target's row for the position of d[i]; x[k] the one
after the last draft token), return (a, b): the number of draft tokens
accepted and the token the target emits next (its recovery token if a < k,
its bonus token if a == k).

The target's draw at a position is its argmax when greedy, and otherwise the
coupled Gumbel-max draw of coupling.py, keyed by (seed, position): an exact
sample of the target's distribution that does not depend on the draft. So the
rule is the same at every temperature: accept while the draft token equals the
target's draw. What gets committed, d[:a] + [b] = x[:a + 1], is exactly what
the target alone would have produced, token for token.

The lossless rule for anything adaptive (drafters, the round planner, the SSD
worker): whether drafted token e_j is verified may depend only on what was
known before e_j was drawn (draft state up to e_{j-1}, timings, costs), never
on tokens drawn after it. With this verifier, cutting a draft cannot bias the
output (the committed tokens ignore the draft), but the code keeps the rule
anyway: a branch that --draft-p-min ended counts as complete, --draft-min is a
length fixed before drawing, so that a verifier whose output depended on q
(rejection sampling) would stay exact too.
"""

from __future__ import annotations

from typing import Sequence


def verify(draft: Sequence[int], target_draws: Sequence[int]) -> tuple[int, int]:
    """Accept while the draft token is the target's own draw at its position."""
    k = len(draft)
    assert len(target_draws) == k + 1, "need one target draw more than draft tokens"
    a = 0
    while a < k and int(draft[a]) == int(target_draws[a]):
        a += 1
    return a, int(target_draws[a])  # recovery (a < k) or bonus (a == k): the target's draw either way
