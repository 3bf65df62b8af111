"""llama.cpp's `infill` sampler, as a row's shaping: what llama.vim and llama.vscode ask for in every
/infill request (`samplers: ["top_k", "top_p", "infill"]`).

llama.cpp (src/llama-sampler.cpp, llama_sampler_infill_apply) applies it to the candidates the filters
before it left (top-k, top-p, min-p here), at temperature 1:
  1. where the end tokens (EOG) weigh enough, 3 p_eog n > p_text over the n candidates: the end tokens
     alone;
  2. else a candidate whose text is a prefix of another's is merged with it, into the likelier of the
     two (its probability added, the other gone);
  3. the text candidates under 0.2 go; none left: the end-of-text token alone (EOT, else EOS);
  4. renormalised, the text candidates under 1 / (texts left + 1) go.
End tokens are never dropped by 2-4. The draw that follows (llama.cpp's `dist`) is a softmax of the
kept candidates' own logits: the merged probabilities only decide what is kept.

Here it is the last shaping of a row (structured/shaping.py): every token it does not keep gets -inf,
and the sampling chain after it (sampling.py) then runs with top-p and min-p off, so that what it kept
is drawn as `dist` would draw it (at the request's temperature, 1 in the editors' requests). Being a
function of the row alone, it is applied to the target's rows and the draft's alike, and every mode
draws mode ar's tokens under it.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..config import SamplingConfig
from ..sampling import support

TEXT_FLOOR = 0.2  # llama.cpp's first threshold on a text candidate's (merged) probability
# the likeliest candidates it reads at most: where top-k is off or wider (llama.cpp's own pairwise loop over a
# whole vocabulary's nucleus would take minutes a token), the rest weigh too little to pass its thresholds
MOST = 1024


class InfillFilter:
    """llama.cpp's infill sampler after top-k, top-p and min-p (the request's), on a row in place."""

    def __init__(self, sampling: SamplingConfig, piece: Callable[[int], bytes], is_eog: Callable[[int], bool],
                 eot: int) -> None:
        self.filters = sampling.model_copy(update=dict(temperature=1.0))  # top-k, top-p, min-p at temperature 1
        self.piece, self.is_eog, self.eot = piece, is_eog, eot  # (a token's text: b"" for a special one)

    def candidates(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, their logits, their probabilities at temperature 1) that top-k, top-p and min-p keep of `row`
        (sampling.support, the chain every draw reads), likeliest first (ties: lower ids), MOST at most."""
        ids, p = support(row, self.filters)
        z = row[ids].astype(np.float64)
        order = np.lexsort((ids, -z))[:MOST]
        p = p[order]
        return ids[order], z[order], p / p.sum()

    def keep(self, ids: np.ndarray, z: np.ndarray, p0: np.ndarray) -> tuple[list[int], list[float]]:
        """What the infill sampler keeps of the candidates (ids, logits, probabilities; likeliest first): their
        ids and the logits `dist` draws them by (-inf for an end token merged away; EOT at 1.0 alone)."""
        n = len(ids)
        if n == 0:
            return [], []
        p = list(p0)
        logit = list(z)
        eog = [self.is_eog(int(t)) for t in ids]
        p_eog = sum(q for q, e in zip(p, eog) if e)
        p_txt = sum(q for q, e in zip(p, eog) if not e)
        if 3.0 * p_eog * n > p_txt:  # the end is likely: the end tokens alone
            return [int(t) for t, e in zip(ids, eog) if e], [x for x, e in zip(logit, eog) if e]
        pieces = [self.piece(int(t)) for t in ids]
        # candidates sharing a prefix, merged into the likelier: llama.cpp's loop over every pair (i0, i1) in its
        # order, visiting only the pairs it can merge (i0's text a prefix of i1's): the others change nothing
        for i0, extensions in enumerate(_extensions(pieces)):
            for i1 in extensions:
                if logit[i0] == -np.inf:
                    break
                if logit[i1] == -np.inf:
                    continue
                dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)
                p[dst] += p[src]
                logit[src], p[src] = -np.inf, 0.0
        kept = [i for i in range(n) if p[i] >= TEXT_FLOOR or eog[i]]
        texts = sum(not eog[i] for i in kept)
        if texts == 0:
            return [self.eot], [1.0]
        total = sum(p[i] for i in kept)
        floor = 1.0 / (texts + 1)
        kept = [i for i in kept if p[i] / total >= floor or eog[i]]
        return [int(ids[i]) for i in kept], [logit[i] for i in kept]

    def __call__(self, row: np.ndarray) -> None:
        """Every token of `row` the sampler does not keep set to -inf; the kept keep their logits."""
        kept, logits = self.keep(*self.candidates(row))
        if not kept:
            return
        row.fill(-np.inf)
        row[np.asarray(kept, dtype=np.int64)] = np.asarray(logits, dtype=np.float32)


def _extensions(pieces: list[bytes]) -> list[list[int]]:
    """For each text, the indices (ascending) of the other texts it is a prefix of (none for an empty one):
    with the texts sorted, those that start with a text follow it (equal ones may also precede it)."""
    order = sorted(range(len(pieces)), key=lambda i: pieces[i])
    out: list[list[int]] = [[] for _ in pieces]
    for r, i in enumerate(order):
        a = pieces[i]
        if not a:
            continue
        back = r - 1
        while back >= 0 and pieces[order[back]] == a:
            out[i].append(order[back])
            back -= 1
        ahead = r + 1
        while ahead < len(order) and pieces[order[ahead]].startswith(a):
            out[i].append(order[ahead])
            ahead += 1
        out[i].sort()
    return out
