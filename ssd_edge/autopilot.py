"""Mode `auto` during a generation: start from the profile's choice, watch the
live numbers, re-decide when they drift.

The Autopilot sees every round the engine commits. It keeps live estimates,
each blended with a prior as if that prior were `prior_weight` trials:

    alpha        draft model acceptance, from rounds verified with a model draft and
                 from the draft's guesses while it reads along (below); the prior is
                 the estimate from the target's confidence (below)
    hit rate     SSD pre-speculation lookups that hit (prior: alpha^k)
    n-gram       a shadow n-gram drafter asked at the start of every round (it costs
                 microseconds), scored against the tokens the target went on to commit;
                 so prompt lookup's value is known even while another mode runs

Every `every` rounds, if an estimate moved by more than `drift` from what the
current choice assumed, the profile's expected-throughput model is asked again.
Each candidate is priced over the tokens still to come, at its expected rate
times what its mode measured against the model earlier in this generation (the
model knows nothing of Python overheads or the draft thread's share of the
GIL; a plan whose measured speed drifts is re-decided too), plus what switching
to it costs: a draft model that sat idle (ar, lookup) must first read the
history it missed. The engine switches only when that saves more than
`hysteresis` of the time left; `ar` stays preferred unless another plan beats
it by AR_MARGIN.

Watching: when the best plan depends on this prompt's acceptance (the draft
pays on predictable text and not on the rest), the generation starts in `ar`
(never slower than plain decoding) and decides at the first check. The
draft's acceptance is then estimated from the target's own confidence: the
mean top-1 probability of the tokens it commits, times how well that
confidence has predicted the real acceptance in this generation's draft
rounds (1 until there were any).
Measured on 12 prompts of the suite (scripts/confidence_vs_acceptance.py),
the mean top-1 probability came within 0.1 of the draft's acceptance on each.
Where the two models fit on the cores side by side, the draft also reads along
during the watch and guesses each next token (engine._Shadow): every guess is
a real trial of its acceptance, and a switch into sd/ssd finds it caught up.
If the watch settles on ar, the read-along stops and the target runs alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

from .config import EngineConfig
from .drafters import NgramDrafter
from .events import Round
from .profile import (AR_MARGIN, OPTIMISTIC_ALPHA, PESSIMISTIC_ALPHA, Acceptance, Choice, Profile,
                      expected_hit_rate, pick)

log = logging.getLogger(__name__)

MIN_SPEED_TOKENS = 8  # tokens a plan must have made before its measured speed corrects the model


@dataclass
class _Rate:
    """A live ratio blended with a prior: (hits + w * prior) / (n + w)."""

    prior: float
    weight: float
    hits: float = 0.0
    n: float = 0.0

    def add(self, hits: float, n: float = 1.0) -> None:
        self.hits += hits
        self.n += n

    @property
    def value(self) -> float:
        return (self.hits + self.weight * self.prior) / (self.n + self.weight)


@dataclass
class _Geometric:
    """Per-token acceptance alpha, counted as trials: each drafted token the target reached is
    a success (accepted) or the one failure that ends the draft. The maximum-likelihood alpha
    of a capped geometric is successes / (successes + failures); the prior counts as `weight` trials."""

    prior: float
    weight: float
    successes: int = 0
    failures: int = 0

    def add(self, successes: int, failures: int) -> None:
        self.successes += successes
        self.failures += failures

    def add_round(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.add(accepted, int(accepted < drafted))

    @property
    def value(self) -> float:
        return self.blend(self.prior)

    def blend(self, prior: float) -> float:
        """The estimate with another prior in place of the stored one."""
        return (self.successes + self.weight * prior) / (self.successes + self.failures + self.weight)


class NgramShadow:
    """Asks an n-gram drafter at every round start and scores each proposed token as the
    committed tokens decide it (so long proposals are not scored later than short ones)."""

    def __init__(self, drafter: NgramDrafter, k: int) -> None:
        self.drafter = drafter
        self.k = k
        self.pending: list[tuple[int, tuple[int, ...], int]] = []  # (history length when asked, proposal, decided)

    def ask(self, history: Sequence[int]) -> bool:
        """True when the drafter proposed something here."""
        prop = self.drafter.propose(history, self.k).tokens
        if prop:
            self.pending.append((len(history), prop, 0))
        return bool(prop)

    def settle(self, history: Sequence[int]) -> tuple[int, int]:
        """(proposed tokens that matched, proposals that hit a mismatch) decided since the last call."""
        matched = mismatched = 0
        keep = []
        for start, prop, seen in self.pending:
            known = min(len(history) - start, len(prop))
            ended = False
            while seen < known:
                if history[start + seen] != prop[seen]:
                    mismatched += 1
                    ended = True
                    break
                matched += 1
                seen += 1
            if not ended and seen < len(prop):
                keep.append((start, prop, seen))
        self.pending = keep
        return matched, mismatched


@dataclass
class Autopilot:
    profile: Profile
    config: EngineConfig        # the engine's own config: thread caps, k cap, pre-speculation limits
    choice: Choice
    every: int = 4
    prior_weight: float = 4.0  # trials (per-token) or lookups of evidence that the profile's value counts as
    drift: float = 0.08
    hysteresis: float = 0.05
    rounds: int = 0
    switches: list[tuple[int, str, int]] = field(default_factory=list)  # (round, mode, k)
    draft_seen: int = 0         # history tokens the draft model has read (it reads none in ar/lookup)
    watching: bool = False      # the current plan (ar) only measures; decide at the first check
    watched: bool = False       # this generation began by watching
    # measured / expected tokens per second, per mode, from the rounds it ran (the model's error here)
    speed: dict[str, float] = field(default_factory=dict)
    _plan_ms: float = 0.0       # wall time and tokens of the current plan's rounds (its first round,
    _plan_tokens: int = 0       # which pays for the switch, and the watch, left out)
    _plan_rounds: int = 0

    def __post_init__(self) -> None:
        p, w = self.profile.acceptance, self.prior_weight
        self.alpha = _Geometric(p.alpha, w)        # w trials of prior
        self.confidence = _Rate(p.alpha, w)        # mean top-1 probability of committed tokens
        self.calibration = _Rate(1.0, w)           # accepted drafted tokens per unit of confidence at them
        self._top1: list[float] = []
        self.ngram = _Geometric(p.ngram_alpha, w)
        self.proposal = _Rate(p.ngram_proposal_rate, w)
        self.hits = self.lookups = 0               # SSD lookups of this generation (the prior: alpha^k)
        spec = self.config.spec
        self.shadow = NgramShadow(NgramDrafter(spec.ngram_min, spec.ngram_max), self.profile.k_max)

    @classmethod
    def start(cls, profile: Profile, config: EngineConfig, **kwargs) -> "Autopilot":
        """Begin with the profile's choice when it holds whatever this prompt's acceptance turns
        out to be; when it depends on that, watch in ar first (cheaper than guessing wrong)."""
        choice = profile.choose(config)
        if config.draft is not None and profile.draft is not None:
            acc = profile.acceptance.model_copy(update=dict(hit_rate=None))  # hits follow alpha
            hopeful = profile.choose(config, acc.model_copy(update=dict(alpha=max(acc.alpha, OPTIMISTIC_ALPHA))))
            wary = profile.choose(config, acc.model_copy(update=dict(alpha=min(acc.alpha, PESSIMISTIC_ALPHA))))
            if hopeful.mode in ("sd", "ssd") and wary.mode not in ("sd", "ssd"):  # the draft pays on some text only
                ar = [c for c in profile.rates(config) if c.mode == "ar"
                      and (c.target_threads, c.draft_threads) == (hopeful.target_threads, hopeful.draft_threads)]
                if ar:
                    return cls(profile, config, ar[0], watching=True, watched=True, **kwargs)
        return cls(profile, config, choice, **kwargs)

    @property
    def prefill_draft(self) -> bool:
        """Should the draft read the prompt now, beside the target (it may be wanted soon)?"""
        return self.watching

    @property
    def run_config(self) -> EngineConfig:
        """The config that runs the current choice."""
        return self.choice.apply(self.config)

    def live(self) -> Acceptance:
        alpha = min(1.0, self.calibration.value * self.confidence.value)
        if self.alpha.successes + self.alpha.failures:  # measured on the draft itself, that estimate as the prior
            alpha = self.alpha.blend(alpha)
        return Acceptance(alpha=alpha, ngram_alpha=self.ngram.value,
                          ngram_proposal_rate=self.proposal.value, hit_rate=self._hit_rate(alpha))

    def _hit_rate(self, alpha: float) -> float | None:
        """Measured SSD hits, blended with expected_hit_rate(alpha, k) as the prior; None before any."""
        if not self.lookups:
            return None
        k = self.choice.k if self.choice.mode == "ssd" else self.config.spec.k
        w = self.prior_weight
        return (self.hits + w * expected_hit_rate(alpha, k)) / (self.lookups + w)

    # ------------------------------------------------------------ observations
    def round_start(self, history: Sequence[int]) -> None:
        self.proposal.add(1.0 if self.shadow.ask(history) else 0.0)

    def draft_read(self, n: int) -> None:
        """The draft model has read the first n history tokens (a prefill beside the target)."""
        self.draft_seen = max(self.draft_seen, n)

    def draft_guessed(self, right: bool) -> None:
        """The draft, reading along during a watch, guessed the target's next token (right or not):
        one real trial of its acceptance."""
        self.alpha.add(int(right), int(not right))

    def target_confidence(self, top1: Sequence[float]) -> None:
        """The target's top-1 probability at each position it committed this round (accepted
        drafts, then the bonus token); call before round_end."""
        self._top1 = [float(p) for p in top1]

    def round_end(self, rnd: Round, history: Sequence[int], remaining: int = 256) -> Choice | None:
        """Record a committed round (`remaining`: tokens the generation may still make);
        returns the new Choice when the engine should switch."""
        if self.choice.mode in ("sd", "ssd"):
            self.draft_seen = len(history)
        if rnd.speculator in ("draft", "prespec"):
            self.alpha.add_round(rnd.drafted, rnd.accepted)
            reached = self._top1[:min(rnd.drafted, rnd.accepted + 1)]
            if reached:
                self.calibration.add(rnd.accepted, sum(reached))
        if self._top1:
            self.confidence.add(sum(self._top1), len(self._top1))
            self._top1 = []
        if rnd.prespec is not None:
            self.hits += rnd.prespec == "hit"
            self.lookups += 1
        self.ngram.add(*self.shadow.settle(history))
        if not self.watching and self._plan_rounds:
            self._plan_ms += rnd.wall_ms
            self._plan_tokens += rnd.accepted + 1
        self._plan_rounds += 1
        self.rounds += 1
        return self._decide(len(history), remaining) if self.rounds % self.every == 0 else None

    def report(self) -> dict:
        """For the FinishEvent's stats: what ran, what it assumed, and when it switched."""
        c = self.choice
        return {"mode": c.mode, "k": c.k, "watched": self.watched, "speed": dict(self.speed), "target_threads": c.target_threads, "draft_threads": c.draft_threads,
                "window": c.window, "expected_tokens_per_s": c.expected_tokens_per_s,
                "live": self.live().model_dump(), "switches": [list(x) for x in self.switches]}

    # ------------------------------------------------------------ decision
    def _decide(self, history_len: int, remaining: int) -> Choice | None:
        live, old = self.live(), self.choice.assumed
        hit_moved = abs(live.hit_rate - old.hit_rate) if live.hit_rate is not None and old.hit_rate is not None else 0.0
        moved = max(abs(live.alpha - old.alpha), hit_moved,
                    abs(live.ngram_alpha - old.ngram_alpha), abs(live.ngram_proposal_rate - old.ngram_proposal_rate))
        modelled = self.profile.rates(self.config, live)
        speed_moved = False
        if self._plan_tokens >= MIN_SPEED_TOKENS:  # how the current plan runs against what the model said
            m = self.choice.mode
            expected = next((c.expected_tokens_per_s for c in modelled if _same_plan(c, self.choice)), None)
            if expected:
                factor = min(max(self._plan_tokens * 1000.0 / self._plan_ms / expected, 0.5), 1.5)
                speed_moved = m in self.speed and abs(factor - self.speed[m]) > self.drift
                self.speed[m] = factor
        if (moved <= self.drift and not self.watching and not speed_moved) or remaining < 2:
            return None
        self.watching = False
        costs = {c.split: c for c in self.profile.costs}

        def time_left_ms(c: Choice) -> float:
            """Expected ms to finish with plan c: the remaining tokens, plus the draft's catch-up."""
            t = remaining * 1000.0 / c.expected_tokens_per_s
            if c.mode in ("sd", "ssd"):
                t += costs[(c.target_threads, c.draft_threads)].catch_up_ms(max(0, history_len - self.draft_seen))
            return t

        # A mode not yet run here is assumed to miss the model as the ones that ran did (all pay the
        # same per-round overheads), so measuring one mode never flatters the others.
        usual = sum(self.speed.values()) / len(self.speed) if self.speed else 1.0
        rates = [c.model_copy(update=dict(expected_tokens_per_s=c.expected_tokens_per_s * self.speed.get(c.mode, usual)))
                 for c in modelled]
        best = pick(rates, time_left_ms, AR_MARGIN)
        now = next((c for c in rates if _same_plan(c, self.choice)), None)
        keep = now is not None and time_left_ms(best) >= time_left_ms(now) * (1 - self.hysteresis)
        log.debug("round %d: alpha %.2f hit %s ngram %.2f/%.2f; now %s k=%d %.0f ms left, best %s k=%d %.0f ms",
                  self.rounds, live.alpha, "-" if live.hit_rate is None else f"{live.hit_rate:.2f}", live.ngram_alpha,
                  live.ngram_proposal_rate, self.choice.mode, self.choice.k, time_left_ms(now) if now else -1,
                  best.mode, best.k, time_left_ms(best))
        if now is None or _same_plan(best, now) or keep:
            self.choice = self.choice.model_copy(update=dict(assumed=live))  # same plan, fresh assumptions
            return None
        self.choice = best
        self.switches.append((self.rounds, best.mode, best.k))
        self._plan_ms, self._plan_tokens, self._plan_rounds = 0.0, 0, 0
        return best


def _same_plan(a: Choice, b: Choice) -> bool:
    return (a.mode, a.k, a.target_threads, a.draft_threads) == (b.mode, b.k, b.target_threads, b.draft_threads)
