"""A round's proposal, for every mode: the planner decides, the proposers make it.

    propose(history)      every proposer of the mode makes its offer (the worker says what it
                          prepared, the n-gram lookup what it would copy, the draft what it would
                          cost), the planner decides, the chosen proposer makes the draft (a plain
                          step, an n-gram copy, a prepared branch cut or extended, a draft drafted now;
                          in mode ar after the prompt, a plain run of steps in one call)
    verifying(history, d) the target starts verifying d: the worker prepares the next round beside
                          it where the SSD policy and its own pricing say so
    observe(...)          the round's outcome and timings, back to the planner, every proposer and
                          the SSD policy

build() makes a generation's planner and proposers for its mode. Whatever is proposed, the engine
verifies it the same way (engine.py), so nothing here can change what the target commits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

import numpy as np

from ..config import EngineConfig, SamplingConfig, split_threads, usable_cores
from ..llama.kvseq import KVSeq
from ..metrics import Meter
from ..speculation.drafters import EMPTY, Draft, ModelDrafter, NgramDrafter
from ..speculation.proposer import PLAIN, Ask, Decision, Proposer, Verified
from .acceptance import DraftAcceptance, NgramAcceptance
from .costs import Costs
from .planner import DRAFT_CAP, FIXED_K, MENUS, NGRAM_CAP, Planner
from .proposers import DraftProposer, NgramProposer, PreparedProposer, top1, upside

__all__ = ["Costs", "NGRAM_CAP", "PLAIN_RUN_S", "Proposal", "Rounds", "build", "caps", "draft_can_pay", "runs_beside",
           "threads_for", "top1"]

if TYPE_CHECKING:  # imported by the modes that pre-speculate (ssd, auto beside the target) alone
    from ..speculation.policy import PrespecPolicy
    from ..speculation.prespec import PrespecWorker
    from .profile import Profile

SERVED = {"plain": "ar", "ngram": "lookup", "draft": "sd", "prepared": "ssd"}  # the mode each kind's rounds are


# Mode ar's steps after the prompt run in one C call each (KVSeq.steps) for at most about this long, so
# that a round carries a tenth of a second of tokens (3 on a CPU at 30 ms a step, 60 on a GPU at 1.7):
# the stream stays live, a cancel is seen within it, and the engine's Python runs once per call instead
# of once per token, with caches that a CPU decode left cold.
PLAIN_RUN_S = 0.1


class Proposal(NamedTuple):
    draft: Draft
    speculator: str          # none, draft, prespec, ngram
    prespec: str | None      # SSD lookups: hit, partial, miss
    run_s: float = 0.0       # a plain run: nothing drafted, plain steps for about this long in one call


NOTHING = Proposal(EMPTY, "none", None)
PLAIN_RUN = Proposal(EMPTY, "none", None, PLAIN_RUN_S)


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
    """Each round's proposal and its bookkeeping, for one generation: the one place that runs the
    Proposer protocol (asks the offers, has the planner decide, asks the chosen proposer for its
    draft, and hands every verified round to the planner and each proposer)."""

    def __init__(self, mode: str, planner: Planner, proposers: Sequence[Proposer], k_min: int,
                 prepared: PreparedProposer | None = None, worker: PrespecWorker | None = None,
                 policy: PrespecPolicy | None = None) -> None:
        self.mode = mode
        self.planner = planner
        self.proposers = list(proposers)  # in the order a fixed mode tries them
        self.k_min = k_min
        self.prepared = prepared
        self.worker = worker
        self.policy = policy
        self.decision: Decision | None = None
        self.plain = planner.menu.kinds == {"plain"}  # mode ar: every round a plain step, nothing to plan
        self.runs = self.plain  # mode ar after the prompt: plain runs, while the target's context can make them
        self.prefilled = False  # the prompt's round has been observed

    @property
    def busy(self) -> bool:
        """Whether the worker drafts beside the verify now running."""
        return self.prepared is not None and self.prepared.busy

    @property
    def served(self) -> str:
        """The mode that served the last round: ar (plain), lookup (n-gram), sd (draft), ssd (branch)."""
        return SERVED.get(self.decision.kind, self.decision.kind) if self.decision is not None else "ar"

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
        """The draft to verify after `history`, at most `room` tokens (mode ar: a plain step, and after
        the prompt a plain run)."""
        if room < 1 or self.plain:
            self.decision = None
            return PLAIN_RUN if self.runs and self.prefilled else NOTHING
        ask = Ask(history, room, remaining)
        offers = [(p, o) for p in self.proposers if (o := p.offer(ask)) is not None]
        d = self.decision = self.planner.plan([(p.kind, o) for p, o in offers], room)
        chosen = next((p for p, _ in offers if p.kind == d.kind), None)
        draft = verifiable(chosen.propose(history, d) if chosen is not None else EMPTY, self.k_min)
        status = self.prepared.status if self.prepared is not None else None
        return Proposal(draft, draft.speculator if len(draft) else "none", status)

    def verifying(self, history: list[int], draft: Draft) -> None:
        """The target starts verifying `draft`: the worker prepares the next round beside it where the
        SSD policy lets it and that is expected to pay."""
        if self.prepared is not None:
            self.prepared.verifying(history, draft, self.decision or PLAIN)

    def observe(self, prop: Proposal, history: list[int], accepted: int, verify_s: float, ms_per_token: float,
                rows: np.ndarray) -> None:
        """The round is verified: `rows` are the target's logit rows at the committed positions."""
        self.prefilled = True
        if self.plain:  # no proposer to price: nothing reads a plain-only planner's observations
            return
        v = Verified(self.decision or PLAIN, prop.draft, accepted, history, rows, verify_s * 1e3, self.busy)
        self.planner.observe(v)
        for p in self.proposers:
            p.observe(v)
        if self.policy is not None:
            self.policy.observe_round(ms_per_token)

    def report(self) -> dict[str, Any] | None:
        """Mode auto's planner report (Stats.auto): the planner's and each proposer's; None in the other modes."""
        if self.mode != "auto":
            return None
        out = self.planner.report()
        for p in self.proposers:
            out.update(p.report() if hasattr(p, "report") else {})
        return {**out, "concurrent": self.worker is not None}

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()  # the worker's draft sequence is the engine's draft KV (moved back to 0)


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
    (proposers.upside < 1: a compute-bound CPU). Without a profile, or with the target off this CPU
    (not what the profile measured), it could."""
    if cfg.draft is None:
        return False
    if profile is None or cfg.target.rpc:
        return True
    costs = profile.cost_model(cfg.target.threads, cfg.draft.threads, offloaded=offloaded(cfg))
    return upside(costs, caps("auto", cfg.spec.k)[0], cfg.spec.k_min) >= 1.0


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
    k_min, p, planned = cfg.spec.k_min, cfg.prespec, menu.planned
    planner = Planner(menu, costs, k_min=k_min, span=ngram_cap)
    ngram = None
    if "ngram" in menu.kinds:
        ngram = NgramProposer(NgramAcceptance(NgramDrafter(cfg.spec.ngram_min, cfg.spec.ngram_max), ngram_cap),
                              ngram_cap)
    drafts = draft_kv is not None and "draft" in menu.kinds
    runs_worker = drafts and (menu.worker == "always" or (menu.worker == "earned" and beside)) and p.budget_cells != 0
    if not drafts:
        return Rounds(mode, planner, [x for x in (ngram,) if x is not None], k_min)
    assert draft_kv is not None
    # (a draft's candidates are for the worker's outcome ranking alone)
    drafter = ModelDrafter(draft_kv, sampling, seed, cfg.spec.p_min, meter.draft_busy,
                           p.saguaro_top, p.saguaro_factor if mode == "ssd" else 1.0, candidates=runs_worker)
    acceptance = DraftAcceptance(draft_cap, profile.acceptance.alpha if profile is not None else 0.7)
    worker = policy = prepared = None
    if runs_worker:
        from ..speculation.policy import PrespecPolicy  # the modes that pre-speculate import these alone
        from ..speculation.prespec import PrespecWorker

        worker, policy = PrespecWorker(drafter, p, meter, n_draft_seqs, cancelled), PrespecPolicy(p)
        prepared = PreparedProposer(worker, policy, acceptance, costs, draft_cap, k_min, planned,
                                    always=menu.worker == "always")
    if ngram is not None and mode == "ssd":  # ssd's n-gram backup: only while a streak of misses offers it
        ngram.offered = (lambda: policy.backup_ready) if policy is not None else (lambda: False)
    draft = DraftProposer(drafter, acceptance, costs, draft_cap, k_min, planned, worker, ngram, prepared, cancelled)
    return Rounds(mode, planner, [x for x in (prepared, ngram, draft) if x is not None], k_min, prepared, worker,
                  policy)
