"""A generation's rounds, set up for its mode: build() wires the planner and the proposers
(planner.py: Rounds runs them each round), priced by this device's profile where there is one;
caps(), threads_for(), runs_beside() and draft_can_pay() answer what a mode's set-up asks before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ..config import EngineConfig, SamplingConfig, split_threads, usable_cores
from ..interface import ModelInfo
from ..llama.kvseq import KVSeq
from ..metrics import Meter
from ..speculation.drafters import ModelDrafter, NgramDrafter
from ..structured.rows import DraftRows, ForcedRuns
from ..structured.shaping import Shaping
from .acceptance import DraftAcceptance, NgramAcceptance
from .costs import Costs
from .planner import (DRAFT_CAP, FIXED_K, MENUS, NGRAM_CAP, PLAIN_RUN_S, Planner, Proposal, Rounds,  # noqa: F401
                      verifiable)
from .prepared import PreparedProposer  # noqa: F401
from .proposers import LONG_COPY, DraftProposer, NgramProposer, top1, upside  # noqa: F401
from .threads import LiveThreads, ThreadChoice

__all__ = ["Costs", "NGRAM_CAP", "PLAIN_RUN_S", "Proposal", "Rounds", "ThreadChoice", "build", "caps", "draft_can_pay",
           "live_threads", "runs_beside", "threads_for", "top1", "verifiable"]

if TYPE_CHECKING:
    from ..speculation.policy import TreeChoice
    from .profile import Profile


def caps(mode: str, k: int | None) -> tuple[int, int]:
    """(draft model, n-gram) most tokens a round drafts: --draft-max when given; else the fixed
    modes' FIXED_K, and for a planned mode as far as the device's verify curve pays (the caps)."""
    if k is not None:
        return k, k
    return (DRAFT_CAP, NGRAM_CAP) if MENUS[mode].planned else (FIXED_K, FIXED_K)


def offloaded(cfg: EngineConfig) -> bool:
    """Whether the target's layers run off this CPU: on a local GPU, or on --rpc servers (which, on
    another machine, a draft decoding here does not slow)."""
    from ..llama.backend import gpu_offload_supported

    return cfg.target.n_gpu_layers != 0 and (bool(cfg.target.rpc) or gpu_offload_supported())


def on_device(cfg: EngineConfig, info: ModelInfo | None = None) -> bool:
    """Whether the target's verifies run on a device of their own, which a draft decoding beside them
    does not slow (the planner's contention is then 1 from the start): offloaded(cfg), or a target whose
    layers are there as loaded (`info`, its ModelInfo: the priced pair's, whose decodes wait a GPU's
    prices)."""
    return offloaded(cfg) or (info is not None and info.gpu_layers > 0)


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


def follows_machine(cfg: EngineConfig) -> bool:
    """Whether a generation's threads follow this machine's live timings: no thread count given
    (threads_follow_mode), and the target on this CPU's cores, more than one (a GPU's or a server's step
    does not depend on them)."""
    return cfg.threads_follow_mode and not offloaded(cfg) and usable_cores() > 1


def live_threads(choice: ThreadChoice, mode: str, cfg: EngineConfig, drafts: bool,
                 use: Callable[[int | None, int | None], None]) -> LiveThreads:
    """A generation's threads at cfg's split (threads_for's; the draft's where it `drafts` in `mode`),
    following the engine's ThreadChoice (threads.py: live timings decide) where they follow the machine
    (follows_machine)."""
    drafts = drafts and cfg.draft is not None and "draft" in MENUS[mode].kinds
    split = (cfg.target.threads, cfg.draft.threads if drafts and cfg.draft is not None else None)
    follows = follows_machine(cfg)
    if follows:
        choice.adopt(split[0], usable_cores())
    return LiveThreads(choice if follows else None, split, runs_beside(cfg), use)


def ssd_offers(policy: Any) -> Callable[[Any], bool]:
    """Whether ssd's fixed menu is offered the round's n-gram copy (tried after a prepared branch, before
    drafting now): the SSD policy's backup after a streak of misses, or at once where the copy's match runs
    LONG_COPY tokens back (the prompt's own text again, as an editor's middle repeats what surrounds it)."""
    return lambda copy: copy.match >= LONG_COPY or policy is not None and policy.backup_ready


def build(mode: str, cfg: EngineConfig, sampling: SamplingConfig, seed: int, meter: Meter,
          cancelled: Callable[[], bool], *, draft_kv: KVSeq | None, n_draft_seqs: int,
          step_ms: float | None = None, profile: Profile | None = None, shaping: Shaping | None = None,
          n_prompt: int = 0, tree: TreeChoice | None = None, target: Any = None,
          target_info: ModelInfo | None = None) -> Rounds:
    """The rounds of one generation in `mode`, priced by this device's profile where there is one
    and a plain step as earlier generations timed it (step_ms). shaping: the generation's constraint,
    bias and penalties (structured/shaping.py), applied to the draft's rows as to the target's; a
    grammar's forced runs go first in every round of a mode that drafts (n_prompt: where the answer
    begins in a history). tree: whether SSD's tree pays, as earlier generations found (the engine's).
    target: the target's context, whose decodes wake SSD's worker as they start (prespec/handoff.py);
    target_info: its model's ModelInfo as loaded, where it has one (on_device reads it)."""
    rounds = _build(mode, cfg, sampling, seed, meter, cancelled, draft_kv, n_draft_seqs, step_ms, profile,
                    DraftRows(shaping.cursor(), n_prompt) if shaping is not None else None, tree, target,
                    on_device(cfg, target_info))
    if shaping is not None and shaping.matcher is not None and not rounds.plain:
        rounds.forced = ForcedRuns(shaping.cursor(), n_prompt)
    return rounds


def _build(mode: str, cfg: EngineConfig, sampling: SamplingConfig, seed: int, meter: Meter,
           cancelled: Callable[[], bool], draft_kv: KVSeq | None, n_draft_seqs: int, step_ms: float | None,
           profile: Profile | None, shape: DraftRows | None, tree: TreeChoice | None = None,
           target: Any = None, device: bool = False) -> Rounds:
    menu = MENUS[mode]
    beside = runs_beside(cfg)
    t, d = cfg.target.threads, cfg.draft.threads if cfg.draft is not None else None
    if profile is not None:
        costs = profile.cost_model(t, d, offloaded=device, step_ms=step_ms)
    else:
        costs = Costs(step_ms=step_ms, contention=1.0 if beside and device else None)
    draft_cap, ngram_cap = caps(mode, cfg.spec.k)
    k_min, p, planned = cfg.spec.k_min, cfg.prespec, menu.planned
    planner = Planner(menu, costs, k_min=k_min, span=ngram_cap)
    ngram = None
    if "ngram" in menu.kinds:
        ngram = NgramProposer(NgramAcceptance(NgramDrafter(cfg.spec.ngram_min, cfg.spec.ngram_max), ngram_cap),
                              ngram_cap, planned)
    drafts = draft_kv is not None and "draft" in menu.kinds
    runs_worker = drafts and (menu.worker == "always" or (menu.worker == "earned" and beside)) and p.budget_cells != 0
    if not drafts:
        return Rounds(mode, planner, [x for x in (ngram,) if x is not None], k_min)
    assert draft_kv is not None
    # (a draft's candidates are for the worker's outcome ranking alone)
    drafter = ModelDrafter(draft_kv, sampling, seed, cfg.spec.p_min, meter.draft_busy,
                           p.saguaro_top, p.saguaro_factor if mode == "ssd" else 1.0, candidates=runs_worker, shape=shape)
    acceptance = DraftAcceptance(draft_cap, profile.acceptance.alpha if profile is not None else 0.7)
    worker = policy = prepared = None
    if runs_worker:
        from ..speculation.policy import PrespecPolicy  # the modes that pre-speculate import these alone
        from ..speculation.prespec import PrespecWorker

        worker, policy = PrespecWorker(drafter, p, meter, n_draft_seqs, cancelled, target), PrespecPolicy(p, tree)
        prepared = PreparedProposer(worker, policy, acceptance, costs, draft_cap, k_min, planned,
                                    always=menu.worker == "always", prompt_alone=follows_machine(cfg))
    if ngram is not None and mode == "ssd":
        ngram.offered = ssd_offers(policy)
    draft = DraftProposer(drafter, acceptance, costs, draft_cap, k_min, planned, worker, ngram, prepared, cancelled)
    return Rounds(mode, planner, [x for x in (prepared, ngram, draft) if x is not None], k_min, prepared, worker,
                  policy)
