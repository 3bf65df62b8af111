"""A round's proposal, for every mode: the planner decides, the proposers make it.

    propose(history)      ask the worker what it prepared, ask the n-gram lookup, plan, then make
                          the draft the plan names (a plain step, an n-gram copy, a prepared branch
                          cut or extended, or a draft drafted now)
    verifying(history, d) the target starts verifying d: the worker prepares the next round beside
                          it where the planner says so
    observe(...)          the round's outcome and timings, back to the planner and the SSD policy

Whatever is proposed, the engine verifies it the same way (engine.py), so nothing here can change
what the target commits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import numpy as np

from ..config import EngineConfig, SamplingConfig, split_threads, usable_cores
from ..llama.kvseq import KVSeq, common_prefix
from ..metrics import Meter
from ..sampling import head_probs
from ..speculation.drafters import EMPTY, Draft, ModelDrafter, NgramDrafter
from .costs import Costs
from .planner import DRAFT_CAP, FIXED_K, MENUS, NGRAM_CAP, SERVED, Decision, Offer, Planner

__all__ = ["Costs", "NGRAM_CAP", "Proposal", "Rounds", "build", "caps", "draft_can_pay", "runs_beside", "threads_for"]

if TYPE_CHECKING:  # imported by the modes that pre-speculate (ssd, auto beside the target) alone
    from ..speculation.policy import PrespecPolicy
    from ..speculation.prespec import LookupResult, PrespecWorker
    from .profile import Profile


class Proposal(NamedTuple):
    draft: Draft
    speculator: str          # none, draft, prespec, ngram
    prespec: str | None      # SSD lookups: hit, partial, miss


NOTHING = Proposal(EMPTY, "none", None)


def verifiable(draft: Draft, k_min: int) -> Draft:
    """--draft-min: a draft shorter than k_min is not verified (a plain step instead). Cutting what
    was drawn because of its length is safe: committed tokens never depend on the proposal
    (coupling.py), and the length itself was decided before each token was drawn."""
    return draft if len(draft) >= max(k_min, 1) else EMPTY


def caps(mode: str, k: int | None) -> tuple[int, int]:
    """(draft model, n-gram) most tokens a round drafts: --draft-max when given; else the fixed
    modes' FIXED_K, and for a planned mode as far as the device's verify curve pays (the caps)."""
    if k is not None:
        return k, k
    return (DRAFT_CAP, NGRAM_CAP) if MENUS[mode].planned else (FIXED_K, FIXED_K)


class Rounds:
    """Each round's proposal and its bookkeeping, for one generation."""

    def __init__(self, mode: str, planner: Planner, k_min: int, sampling: SamplingConfig,
                 drafter: ModelDrafter | None = None, worker: PrespecWorker | None = None,
                 policy: PrespecPolicy | None = None, cancelled: Callable[[], bool] | None = None) -> None:
        self.mode = mode
        self.planner = planner
        self.k_min = k_min
        self.sampling = sampling
        self.drafter = drafter
        self.worker = worker
        self.policy = policy
        self.cancelled = cancelled
        self.decision: Decision | None = None
        self.busy = False  # whether the worker drafts beside the verify now running
        self.plain = planner.menu.kinds == {"plain"}  # mode ar: every round a plain step, nothing to plan

    @property
    def served(self) -> str:
        """The mode that served the last round: ar (plain), lookup (n-gram), sd (draft), ssd (branch)."""
        return SERVED[self.decision.kind] if self.decision is not None else "ar"

    @property
    def state(self) -> str:
        """What runs now, for the gauges: the mode served, ssd's `backup` (an n-gram round in ssd), or
        the SSD policy's rolled-back or sla-cut."""
        if self.policy is not None and self.policy.state != "ssd":
            return self.policy.state
        if self.mode == "ssd" and self.served == "lookup":
            return "backup"
        return self.served

    def propose(self, history: list[int], room: int, remaining: int) -> Proposal:
        """The draft to verify after `history`, at most `room` tokens."""
        if room < 1 or self.plain:
            self.decision = None
            return NOTHING
        looked = self._lookup(history, room)
        status = looked.status if looked is not None and looked.status != "none" else None
        hit = status in ("hit", "partial")
        # ssd's n-gram backup is asked only when a streak of misses offers it (nothing else reads it there)
        offered = self.mode != "ssd" or (self.policy is not None and self.policy.backup_ready)
        ngram = self.planner.ask_ngram(history) if offered and "ngram" in self.planner.menu.kinds else EMPTY
        # what the draft has not read of the history (it drafts after reading it); after a hit the
        # branch holds it all, and the worker may be making the branch its main sequence right now
        kv = self.drafter.kv if self.drafter is not None and not hit else None
        unread = max(0, len(history) - common_prefix(kv.tokens, history) - 1) if kv is not None else 0
        d = self.decision = self.planner.plan(Offer(
            room, remaining, ngram=len(ngram), draft=self.drafter is not None, draft_unread=unread,
            prepared=len(looked.draft) if hit else None, prepared_done=hit and looked.finished))
        if status is not None:  # the worker prepared this round: did the plan use it?
            self.planner.observe_lookup(d.kind == "prepared")
        draft = verifiable(self._make(d, history, ngram, looked, room), self.k_min)
        return Proposal(draft, draft.speculator if len(draft) else "none", status)

    def _lookup(self, history: list[int], room: int) -> LookupResult | None:
        if self.worker is None:
            return None
        looked = self.worker.lookup(history, min(self.planner.caps["prepared"], room))
        if looked.status != "none" and self.policy is not None:
            cap = self.planner.caps["draft"]
            acceptance = sum(self.planner.alpha("draft", i) for i in range(cap)) / cap
            self.policy.observe_lookup(looked.status, acceptance)  # the window and rollback follow the hit rate
        return looked

    def _make(self, d: Decision, history: list[int], ngram: Draft, looked: LookupResult | None,
              room: int) -> Draft:
        if d.kind == "ngram":
            return ngram.head(d.m)
        if d.kind == "prepared":
            assert looked is not None and self.worker is not None
            if looked.finished or d.m <= len(looked.draft):  # a finished branch verifies min(m, its length)
                return looked.draft.head(d.m)
            return self.worker.extend(history, d.m)
        if d.kind == "draft":  # planned: as long as the draft's confidence pays for, up to the cap
            go_on = self.planner.go_on(d)
            m = d.m if go_on is None else min(self.planner.caps["draft"], room)
            guess = ngram.tokens[:d.guess]
            if self.worker is not None:
                return self.worker.draft_now(history, m, go_on, guess)
            assert self.drafter is not None
            return self.drafter.propose(history, m, self.cancelled, go_on, guess)
        return EMPTY

    def verifying(self, history: list[int], draft: Draft) -> None:
        """The target starts verifying `draft`: the worker prepares the next round beside it where the
        SSD policy lets it and the planner expects that to pay."""
        self.busy = (self.worker is not None and self.policy is not None and self.policy.prespec_enabled
                     and self.planner.worker_runs(len(draft) + 1))
        if self.busy:
            snapshot = self.policy.snapshot(self.planner.p_accept(len(draft)), self.planner.branch_depth())
            self.worker.verifying(history, draft, snapshot)

    def observe(self, prop: Proposal, history: list[int], accepted: int, verify_s: float, ms_per_token: float,
                rows: np.ndarray) -> None:
        """The round is verified: `rows` are the target's logit rows at the committed positions."""
        if self.plain:  # no proposer to price: nothing reads a plain-only planner's observations
            return
        kind = self.decision.kind if self.decision is not None else "plain"
        # the target's confidence stands in for the draft's acceptance: read only where there is a draft
        confidence = top1(rows, self.sampling) if self.planner.wants_confidence and self.drafter is not None else ()
        self.planner.observe(kind, len(prop.draft), accepted, verify_s * 1e3, confidence, busy=self.busy)
        self.planner.observe_history(history)
        if kind == "draft" and self.drafter is not None and self.drafter.timing is not None:
            self.planner.observe_draft(*self.drafter.timing)
        if self.policy is not None:
            self.policy.observe_round(ms_per_token)

    def report(self) -> dict[str, Any] | None:
        """Mode auto's planner report (Stats.auto); None in the other modes."""
        if self.mode != "auto":
            return None
        return {**self.planner.report(), "concurrent": self.worker is not None}

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()  # the worker's draft sequence is the engine's draft KV (moved back to 0)


def top1(rows: np.ndarray, s: SamplingConfig) -> dict[int, float]:
    """The target's probability of its likeliest token at the first and the last of a round's committed
    rows (index -> probability), at the sampling temperature (1 when greedy), over each row's largest
    logits (sampling.head_probs). Two rows, not all: a pass over a row costs 0.05-0.1 ms where it comes
    cold from a GPU's step, most of a round's host time at 8 rows; the planner's confidence is an average
    and its calibration a ratio, which a sample of each round's rows estimates as well."""
    t = s.temperature if s.temperature > 0 else 1.0
    return {i: float(head_probs(rows[i], t).p[0]) for i in sorted({0, len(rows) - 1})} if len(rows) else {}


def offloaded(cfg: EngineConfig) -> bool:
    """Whether the target's layers run off this CPU: on a local GPU, or on --rpc servers (which, on
    another machine, a draft decoding here does not slow)."""
    from ..llama.backend import gpu_offload_supported

    return cfg.target.n_gpu_layers != 0 and (bool(cfg.target.rpc) or gpu_offload_supported())


def runs_beside(cfg: EngineConfig) -> bool:
    """Whether the draft can pre-speculate beside the target without taking its compute: the target
    off this CPU, or the two models' threads fit on its cores side by side (on shared cores the
    two alternating, each with every core, beat them running at once: FIELD_NOTES)."""
    if cfg.draft is None:
        return False
    return offloaded(cfg) or cfg.target.threads + cfg.draft.threads <= usable_cores()


def draft_can_pay(cfg: EngineConfig, profile: Profile | None) -> bool:
    """Whether mode auto could ever draft with the draft model at cfg's threads: unless this device's
    profile prices a draft accepted as often as on predictable text (EXPLORE_ALPHA) below plain steps
    (Planner.upside < 1: a compute-bound CPU). Without a profile, or with the target off this CPU
    (not what the profile measured), it could."""
    if cfg.draft is None:
        return False
    if profile is None or cfg.target.rpc:
        return True
    costs = profile.cost_model(cfg.target.threads, cfg.draft.threads, offloaded=offloaded(cfg))
    return Planner(MENUS["auto"], costs, draft_cap=caps("auto", cfg.spec.k)[0], k_min=cfg.spec.k_min).upside() >= 1.0


def threads_for(mode: str, cfg: EngineConfig, has_draft: bool, profile: Profile | None) -> EngineConfig:
    """`cfg` with the thread split that suits `mode` here (EngineConfig.threads_follow_mode): in auto
    the draft beside the target on cores of its own where the profile says the target loses nothing
    by it (Profile.split), else the two taking turns with every core each; without a profile,
    split_threads's rule of thumb."""
    cores = usable_cores()
    t, d = split_threads(mode, has_draft, cores)
    if profile is not None and mode == "auto" and has_draft:
        t, d = profile.split(cores) or (cores, cores)
    update: dict[str, Any] = {"target": cfg.target.model_copy(update={"threads": t})}
    if cfg.draft is not None:
        update["draft"] = cfg.draft.model_copy(update={"threads": d})
    return cfg.model_copy(update=update)


def build(mode: str, cfg: EngineConfig, sampling: SamplingConfig, seed: int, meter: Meter,
          cancelled: Callable[[], bool], *, draft_kv: KVSeq | None, n_draft_seqs: int,
          step_ms: float | None = None, profile: Profile | None = None) -> Rounds:
    """The rounds of one generation in `mode`, priced by this device's profile where there is one
    and a plain step as earlier generations timed it (step_ms)."""
    menu = MENUS[mode]
    beside = runs_beside(cfg)
    t, d = cfg.target.threads, cfg.draft.threads if cfg.draft is not None else None
    if profile is not None:
        costs = profile.cost_model(t, d, offloaded=offloaded(cfg), step_ms=step_ms)
    else:
        costs = Costs(step_ms=step_ms, contention=1.0 if beside and offloaded(cfg) else None)
    draft_cap, ngram_cap = caps(mode, cfg.spec.k)
    planner = Planner(menu, costs, draft_cap=draft_cap, ngram_cap=ngram_cap, k_min=cfg.spec.k_min,
                      ngram=NgramDrafter(cfg.spec.ngram_min, cfg.spec.ngram_max),
                      draft_prior=profile.acceptance.alpha if profile is not None else 0.7)
    p = cfg.prespec
    drafter = None
    drafts = draft_kv is not None and "draft" in menu.kinds
    runs_worker = drafts and (menu.worker == "always" or (menu.worker == "earned" and beside)) and p.budget_cells != 0
    if drafts:  # (a draft's candidates are for the worker's outcome ranking alone)
        drafter = ModelDrafter(draft_kv, sampling, seed, cfg.spec.p_min, meter.draft_busy,
                               p.saguaro_top, p.saguaro_factor if mode == "ssd" else 1.0, candidates=runs_worker)
    if not runs_worker:
        return Rounds(mode, planner, cfg.spec.k_min, sampling, drafter, cancelled=cancelled)
    from ..speculation.policy import PrespecPolicy  # the modes that pre-speculate import these alone
    from ..speculation.prespec import PrespecWorker

    worker = PrespecWorker(drafter, p, meter, n_draft_seqs, cancelled)
    return Rounds(mode, planner, cfg.spec.k_min, sampling, drafter, worker, PrespecPolicy(p), cancelled)
