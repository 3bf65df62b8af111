"""The exact distribution of the fake backend's generations, computed by hand, and a chi-square
check of Engine.generate's sampled output against it (tests/engine/test_distribution_engine.py,
tests/engine/test_mutations.py).

The fake target (tests/fakes.py, lm_logits) gives each prefix a logit row over V = 32 tokens.
The probability of a whole answer x1..xL after a prompt is the product of the target's
probabilities of each token after the prompt and the tokens before it. Each row's probabilities
are written out here from the definitions (docs/design.md, "Lossless on every path"), not with ssd_edge.sampling:

    top-k: the k largest logits; top-p: the smallest descending set whose mass at temperature 1
    reaches top_p; min-p: logits >= max + log(min_p); then softmax(logit / temperature).

(The fake's rows have distinct top-3 logits, so no tie at a top-k or top-p edge arises.)

Engine.generate runs with the real sampler (sampling.probs), the real coupled draw (coupling.py)
and the real verifier (verify.py), one seed per generation. Pearson's chi-square over the answers
whose expected count is at least 5 (the rest pooled in one cell) is compared with the chi-square
quantile at a false-alarm rate of 1e-6 (Wilson-Hilferty), so a correct engine fails about once
in a million runs.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from fakes import EOS, V, lm_logits

Z_FALSE_ALARM = 4.753  # one-sided normal quantile of 1e-6


@dataclass(frozen=True)
class Setting:
    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def sampling(self, seed: int):
        from ssd_edge.config import SamplingConfig

        return SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                              seed=seed)


def exact_row(prefix: list[int], s: Setting) -> np.ndarray:
    """The target's probabilities of the next token after `prefix`, from the definitions."""
    z = lm_logits(prefix).astype(np.float64)
    keep = np.ones(V, bool)
    if s.top_k:
        keep &= z >= np.sort(z)[-s.top_k]
    if s.top_p < 1.0:
        p1 = np.exp(z - z.max()) * keep
        p1 /= p1.sum()
        mass, kept = 0.0, np.zeros(V, bool)
        for t in np.argsort(-p1, kind="stable"):
            kept[t] = True
            mass += p1[t]
            if mass >= s.top_p:
                break
        keep &= kept
    if s.min_p > 0.0:
        keep &= z >= z[keep].max() + math.log(s.min_p)
    w = np.where(keep, np.exp((z - z.max()) / s.temperature), 0.0)
    return w / w.sum()


def exact_answers(prompt: list[int], length: int, s: Setting) -> dict[tuple[int, ...], float]:
    """P(answer) for every answer of up to `length` tokens with nonzero probability. An answer that
    drew the end-of-generation token ends there, and ends with EOS (never a committed token)."""
    out: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for ans, p in out.items():
            if ans and ans[-1] == EOS:
                nxt[ans] = p
                continue
            row = exact_row(prompt + list(ans), s)
            for t in np.flatnonzero(row):
                nxt[ans + (int(t),)] = p * row[t]
        out = nxt
    return out


def chi_square(counts: dict[tuple[int, ...], int], exact: dict[tuple[int, ...], float], n: int
               ) -> tuple[float, float, int]:
    """(statistic, threshold at 1e-6, degrees of freedom); an answer outside `exact` makes it infinite."""
    if any(a not in exact for a in counts):
        return math.inf, 0.0, 0
    big = [a for a, p in exact.items() if n * p >= 5]
    cells = [(counts.get(a, 0), n * exact[a]) for a in big]
    rest_e = n - sum(e for _, e in cells)
    if rest_e >= 5:
        cells.append((n - sum(c for c, _ in cells), rest_e))
    stat = sum((c - e) ** 2 / e for c, e in cells)
    df = len(cells) - 1
    h = 2.0 / (9 * df)
    return stat, df * (1 - h + Z_FALSE_ALARM * math.sqrt(h)) ** 3, df


def sample_answers(engine, prompt: list[int], length: int, s: Setting, n: int, mode: str) -> dict[tuple[int, ...], int]:
    """Counts of the answers of n generations (seeds 0..n-1) through Engine.generate."""
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(n):
        c = engine.complete(tokens=prompt, max_tokens=length, mode=mode, sampling=s.sampling(seed))
        ans = c.tokens + ((EOS,) if c.stop_reason == "eos" else ())
        assert c.stop_reason in ("eos", "length") and len(ans) <= length, c
        counts[ans] = counts.get(ans, 0) + 1
    return counts


def check_follows_target(engine, prompt: list[int], length: int, s: Setting, n: int, mode: str) -> float:
    """Assert the engine's answers follow the exact distribution; return statistic / threshold."""
    counts = sample_answers(engine, prompt, length, s, n, mode)
    stat, limit, df = chi_square(counts, exact_answers(prompt, length, s), n)
    assert stat <= limit, (f"{mode} at {s}: chi-square {stat:.1f} > {limit:.1f} ({df} degrees of freedom, "
                           f"false-alarm rate 1e-6) over {n} answers of {length} tokens")
    return stat / limit
