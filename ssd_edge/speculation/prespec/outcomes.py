"""Which verification outcomes SSD prepares, and the branches prepared for them.

An outcome (a, b) is a round's verification result: a draft tokens accepted, then the target's token
b. rank_outcomes picks the likeliest within the fan-out and the cell budget; the SpeculationCache
holds a Branch for each one the worker grows; why_missed and outcome_of read a finished round
against them; decode_heads is a branch step's decode, its rows handed over as heads. All of it is
plain data: the worker thread (worker.py) is what fills it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import numpy as np

from ...coupling import gumbels
from ...llama.kvseq import common_prefix
from ...sampling import Heads, heads_of
from ..drafters import Candidates, Draft, ModelDrafter, top_candidates, top_probability


class Outcome(NamedTuple):
    a: int        # draft tokens accepted
    b: int        # recovery (a < k) or bonus (a == k) token
    score: float  # estimated probability


def rank_outcomes(draft: Sequence[int], cands: Sequence[Candidates], p_accept: np.ndarray, *, fanout: int,
                  min_confidence: float, budget_cells: int, cells_per_branch: int,
                  coupled: tuple[int, int] | None = None) -> list[Outcome]:
    """The outcomes worth preparing: the likeliest of each acceptance length first (a tree with a branch
    for every length: their estimated P(a) is noisy, and the worker grows them together), then the
    other next tokens, each part likeliest first.

    P(a, b) = P(a) * P(b | a), where P(a) comes from acceptance history and
    P(b | a) from the draft's own distribution at position a: for a < k the
    drafted token is excluded and the rest renormalised (the target's residual
    has no mass on it); for a == k, the draft's distribution after d[k-1].
    Kept where score >= min_confidence, at most `fanout`, within the cell budget.

    coupled (seed, position of cands[0]), when sampling: the target's token at a position is its
    coupled draw there, argmax log p + G(seed, position) (coupling.py). The draft's own coupled order,
    log q + G with the same noise, predicts it better than q's order does (where q = p the two draws
    are equal), so the candidates are ranked in that order, the likeliest of q's probabilities going
    to its first. (Which outcome is prepared never touches losslessness: a branch is only a proposal.)
    """
    k = len(draft)
    n = min(k + 1, len(cands))
    scored: list[Outcome] = []
    noise = None
    if coupled is not None and n:  # every position's noise in one call (a call each cost 15 us)
        seed, first = coupled
        grid = np.zeros((n, max(len(c.ids) for c in cands[:n])), np.int64)
        for a in range(n):
            grid[a, :len(cands[a].ids)] = cands[a].ids
        noise = gumbels(seed, first + np.arange(n)[:, None], grid).tolist()
    # in Python floats: eight numbers a position, where numpy's calls cost more than the arithmetic. An
    # outcome under min_confidence is never prepared, so none is made (nor any of a length whose P(a) is)
    for a in range(n):
        pa = float(p_accept[a])
        if pa < min_confidence:
            continue
        ids, pr = cands[a].ids.tolist(), cands[a].probs.tolist()
        g = noise[a][:len(ids)] if noise is not None else None
        if a < k:
            d = draft[a]
            rest = max(1.0 - sum(p for t, p in zip(ids, pr) if t == d), 1e-9)
            kept = [j for j, t in enumerate(ids) if t != d]
            ids, pr = [ids[j] for j in kept], [pr[j] / rest for j in kept]
            g = [g[j] for j in kept] if g is not None else None
        if g is not None and len(ids) > 1:
            order = sorted(range(len(ids)), key=lambda j: -(math.log(max(pr[j], 1e-300)) + g[j]))
            desc = sorted(pr, reverse=True)
            ranked = [0.0] * len(pr)
            for r, j in enumerate(order):
                ranked[j] = desc[r]
            pr = ranked
        scored.extend(Outcome(a, t, pa * pb) for t, pb in zip(ids, pr) if pa * pb >= min_confidence)
    scored.sort(key=lambda o: -o.score)
    # the tree: each acceptance length's likeliest outcome first, then second guesses, each part by score
    lengths: set[int] = set()
    first = [o for o in scored if not (o.a in lengths or lengths.add(o.a))]
    chosen = {id(o) for o in first}
    most = min(fanout, budget_cells // cells_per_branch) if cells_per_branch > 0 else fanout * (budget_cells >= 0)
    return (first + [o for o in scored if id(o) not in chosen])[:max(most, 0)]


@dataclass
class Branch:
    """One prepared continuation: history C + d[:a] + [b], then `tokens`."""

    a: int
    b: int
    seq: int
    pos: int                  # next KV position to write in this sequence
    feed: int                 # the token to decode next (b, then each drafted token)
    tokens: list[int] = field(default_factory=list)
    cands: list[Candidates] = field(default_factory=list)
    depth: int = 0            # tokens it is drafted to (0: until the caller stops it)
    cells: int = 0            # KV cells this branch holds beyond the shared prefix
    done: bool = False
    shape: Any = None         # under a constraint, its grammar state (structured.shaping.Cursor) as it grows

    def step(self, picked: tuple[int, Candidates] | None) -> None:
        """One decode of `feed` done: its cell written, and the token drawn from its row with that row's
        candidates, or None where the draft was too unsure to go on (--draft-p-min): it stops there.
        (The candidates go in before the token: a lookup reading the branch meanwhile sees no token
        without its candidates.)"""
        self.pos += 1
        self.cells += 1
        if picked is None:
            self.done = True
            return
        token, cand = picked
        self.cands.append(cand)
        self.tokens.append(token)
        self.feed = token
        self.done = len(self.tokens) >= self.depth

    def pick(self, drafter: ModelDrafter, row: np.ndarray) -> tuple[int, Candidates] | None:
        """The draft's next token here from its row (under the branch's constraint), with the row's
        candidates; None where the draft is too unsure to go on (--draft-p-min)."""
        if self.shape is not None:
            self.shape.shape(row)
        if drafter.p_min > 0 and top_probability(row) < drafter.p_min:
            return None
        cand = top_candidates(row, drafter.cand_temperature())
        t = drafter.pick(row, self.pos + 1, cand)
        if self.shape is not None:
            self.shape.push(t)
        return t, cand

    def draft(self, n: int) -> Draft:
        """Its first n drafted tokens (at most what it has), with their candidates."""
        n = min(n, len(self.tokens))
        return Draft(tuple(self.tokens[:n]), "prespec", tuple(self.cands[:n]))


class SpeculationCache:
    """(a, b) -> Branch, with the cells they hold."""

    def __init__(self) -> None:
        self.branches: dict[tuple[int, int], Branch] = {}

    def get(self, a: int, b: int) -> Branch | None:
        return self.branches.get((a, b))

    def put(self, br: Branch) -> None:
        self.branches[(br.a, br.b)] = br

    def cells(self) -> int:
        return sum(br.cells for br in self.branches.values())

    def prepared_tokens(self) -> int:
        return sum(len(br.tokens) for br in self.branches.values())

    def pop_all(self) -> list[Branch]:
        out = list(self.branches.values())
        self.branches.clear()
        return out


class LookupResult(NamedTuple):
    status: str           # "hit", "partial", "miss", or "none" (nothing was pre-speculated)
    draft: Draft | None
    finished: bool = False  # the branch is complete: drafted to depth, or ended by --draft-p-min
    why: str | None = None  # a miss's reason (why_missed)
    depth: int = 0          # a found branch's planned depth (its length is what was drawn; 0: not found)


def why_missed(outcome: tuple[int, int] | None, planned: set[tuple[int, int]] | frozenset[tuple[int, int]]) -> str:
    """Why no branch was there for the round's outcome (a, b), one of MISS_REASONS; `planned`: the
    outcomes the round's plan ranked."""
    if outcome is None:
        return "off-path"  # the round did not end as a verify of the draft looked at
    if outcome in planned:
        return "not-ready"  # ranked, but the worker had not begun its branch when the verify ended
    if any(a == outcome[0] for a, _ in planned):
        return "wrong-token"  # the accepted count was prepared, with another next token
    return "wrong-count" if planned else "none-ranked"  # nothing ranked above the floor and budget


def outcome_of(base: tuple[list[int], Draft], history: list[int]) -> tuple[int, int] | None:
    """The verification outcome (a, b) that took history C + d to `history`: a draft tokens of d
    accepted, then the target's token b; None if `history` does not follow C that way."""
    C, d = base
    n = len(C)
    a = common_prefix(history[n:], d.tokens)
    if len(history) == n + a + 1 and history[:n] == C:
        return a, history[n + a]
    return None


def decode_heads(ctx: Any, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int],
                 logits_for: Sequence[int], width: int) -> Heads:
    """One decode of branch rows, each handed back as its head (sampling.Heads): made where the rows are
    where the backend can (a context's own decode_heads: the priced pair, a GPU's top-k), else read off
    the rows here (the C top-k pass a row, on the CPU build)."""
    own = getattr(ctx, "decode_heads", None)
    if own is not None:
        return own(tokens, positions, seqs, logits_for, width)
    return heads_of(ctx.decode(tokens, positions, seqs, logits_for, copy=False), width)
