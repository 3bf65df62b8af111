"""The engine: load a target (and a draft), then propose -> verify -> commit.

    for event in engine.generate("def fib(n):", max_tokens=64):
        print(event.text, end="")

Modes:  ar      the target alone, one token per step
        sd      the draft model drafts k tokens, the target verifies them in one batch
        lookup  the n-gram drafter (no model) drafts, the target verifies
        ssd     sd, plus pre-speculation of the next round while the target verifies (speculation/prespec.py)
        auto    each round, whichever of a plain step, the n-gram lookup, a draft or a
                pre-speculated branch is expected fastest (auto/planner.py); the default

Every mode emits exactly the target's tokens: its greedy tokens at temperature 0,
and when sampling, its coupled draws (coupling.py), which follow its distribution
and are the same for the same seed in every mode (up to near-ties between batched
and one-token logits; see tests/lossless_check.py).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, NamedTuple, Sequence

import numpy as np

from .config import EngineConfig, SamplingConfig, split_threads, usable_cores
from .coupling import fresh_seed, gumbel_picks
from .errors import ConfigError, ContextFullError
from .events import FinishEvent, Round, Stats, StopReason, TokenEvent
from .interface import ModelInfo, TextStream
from .llama.backend import Context, Model, check_same_vocab, gpu_offload_supported
from .llama.kvseq import Cancelled, KVSeq, common_prefix
from .metrics import Ema, Meter
from .models.catalog import resolve_model
from .sampling import probs
from .speculation.drafters import EMPTY, Draft, ModelDrafter, NgramDrafter
from .verify import verify

if TYPE_CHECKING:  # imported where ssd or auto needs them (Engine._strategy): ar, lookup and sd load none
    from .auto.planner import Decision, Planner
    from .speculation.policy import PrespecPolicy
    from .speculation.prespec import PrespecWorker

log = logging.getLogger(__name__)

Event = TokenEvent | FinishEvent
PROVENANCE = {"none": "target", "draft": "draft", "prespec": "prespec", "ngram": "ngram"}


class Proposal(NamedTuple):
    draft: Draft
    speculator: str          # none, draft, prespec, ngram
    prespec: str | None      # SSD lookups: hit, partial, miss


class _Committed(NamedTuple):
    tokens: list[int]
    reason: StopReason | None  # why the generation ends after this round, if it does


@dataclass(frozen=True)
class Completion:
    text: str
    tokens: tuple[int, ...]
    stop_reason: StopReason
    stats: Stats


# ---------------------------------------------------------------- speculation strategies
#
# A strategy makes each round's proposal. The fixed modes always propose the same way; `auto`
# (_Planned) asks the round planner which proposer serves this round. Every strategy's proposal is
# verified the same way in Engine._run, so none of them can change what the target commits.

class _Plain:
    state = "ar"

    def propose(self, history: list[int], k: int, remaining: int = 64) -> Proposal:
        return Proposal(EMPTY, "none", None)

    def verifying(self, history: list[int], draft: Draft, k_next: int) -> None: ...

    def observe(self, prop: Proposal, history: list[int], accepted: int, verify_s: float, draft_s: float,
                ms_per_token: float, top1: np.ndarray) -> None: ...

    def report(self) -> dict[str, Any] | None:
        return None

    def close(self) -> None: ...


class _Lookup(_Plain):
    state = "lookup"

    def __init__(self, ngram: NgramDrafter) -> None:
        self.ngram = ngram

    def propose(self, history: list[int], k: int, remaining: int = 64) -> Proposal:
        return Proposal(self.ngram.propose(history, k), "ngram", None)


class _Draft(_Plain):
    state = "sd"

    def __init__(self, drafter: ModelDrafter, cancelled: Callable[[], bool]) -> None:
        self.drafter = drafter
        self.cancelled = cancelled

    def propose(self, history: list[int], k: int, remaining: int = 64) -> Proposal:
        return Proposal(self.drafter.propose(history, k, self.cancelled), "draft", None)


class _SSD(_Plain):
    """Pre-speculation with a draft-model primary and an n-gram backup (fixed mode ssd)."""

    def __init__(self, worker: PrespecWorker, policy: PrespecPolicy, ngram: NgramDrafter, meter: Meter) -> None:
        self.worker = worker
        self.policy = policy
        self.ngram = ngram
        self.meter = meter

    @property
    def state(self) -> str:
        return "ssd" if self.policy.state == "ssd" else self.policy.state

    def propose(self, history: list[int], k: int, remaining: int = 64) -> Proposal:
        res = self.worker.lookup(history, k)
        if res.status in ("hit", "partial"):
            self.policy.observe_lookup(res.status)
            ready = k if res.finished else len(res.draft)  # a branch --draft-p-min ended counts as complete
            m = self.policy.plan_round(ready, k)
            draft = res.draft.head(m) if res.finished or m <= len(res.draft) else self.worker.extend(history, m)
            return Proposal(draft if len(draft) else EMPTY, "prespec" if len(draft) else "none", res.status)
        if res.status == "miss":
            self.policy.observe_lookup("miss")
            backup = self.ngram.propose(history, k)
            if self.policy.use_backup(len(backup), k):
                return Proposal(backup, "ngram", "miss")
        status = "miss" if res.status == "miss" else None
        m = self.policy.plan_round(0, k)
        if m == 0:  # a plain target step; the worker prepares the next round meanwhile
            return Proposal(EMPTY, "none", status)
        return Proposal(self.worker.draft_now(history, m), "draft", status)

    def verifying(self, history: list[int], draft: Draft, k_next: int) -> None:
        self.worker.verifying(history, draft, k_next)

    def observe(self, prop: Proposal, history: list[int], accepted: int, verify_s: float, draft_s: float,
                ms_per_token: float, top1: np.ndarray) -> None:
        d = len(prop.draft)
        self.policy.observe_verify(d, accepted, prop.speculator)
        self.policy.observe_costs(d, verify_s * 1e3, draft_s * 1e3 / d if prop.speculator == "draft" and d else None)
        self.policy.observe_round(ms_per_token)
        self.meter.state = "backup" if prop.speculator == "ngram" else self.state

    def close(self) -> None:
        self.worker.close()


class _Planned(_Plain):
    """Mode auto: each round the planner (auto/planner.py) picks among a plain step, the n-gram lookup,
    a just-in-time draft and, where the draft runs beside the target, a pre-speculated branch.
    A round's mode says which served it: ar (plain), lookup (n-gram), sd (draft), ssd (branch)."""

    SERVED = {"plain": "ar", "ngram": "lookup", "draft": "sd", "prepared": "ssd"}

    def __init__(self, planner: Planner, drafter: ModelDrafter | None, worker: PrespecWorker | None,
                 cancelled: Callable[[], bool], meter: Meter) -> None:
        self.planner = planner
        self.drafter = drafter
        self.worker = worker
        self.cancelled = cancelled
        self.meter = meter
        self.decision: Decision | None = None
        self.prefilled = False  # the first round reads the prompt: a plain step, every core on it
        self.busy = False       # whether the worker drafts beside the verify now running

    @property
    def state(self) -> str:
        return self.SERVED[self.decision.kind] if self.decision is not None else "ar"

    def propose(self, history: list[int], k: int, remaining: int = 64) -> Proposal:
        from .auto.planner import Offer

        if not self.prefilled:  # the first token as fast as ar; a worker reads the prompt meanwhile
            self.decision = None
            return Proposal(EMPTY, "none", None)
        ngram = self.planner.ask_ngram(history)
        lookup = self.worker.lookup(history, k) if self.worker is not None else None
        status = lookup.status if lookup is not None and lookup.status != "none" else None
        if status is not None:
            self.worker.policy.observe_lookup(status)  # the worker's window and rollback follow its hit rate
        hit = lookup is not None and lookup.status in ("hit", "partial")
        kv = self.drafter.kv if self.drafter is not None else None
        unread = max(0, len(history) - common_prefix(kv.tokens, history) - 1) if kv is not None else 0
        offer = Offer(k, remaining, ngram=len(ngram), draft=self.drafter is not None, draft_unread=unread,
                      prepared=len(lookup.draft) if hit else None, prepared_done=hit and lookup.finished)
        d = self.decision = self.planner.plan(offer)
        if status is not None:  # the worker prepared this round: did the plan use what it found?
            self.planner.observe_lookup(d.kind == "prepared")
        if d.kind == "plain":
            return Proposal(EMPTY, "none", status)
        if d.kind == "ngram":
            return Proposal(Draft(ngram[:d.m], "ngram", match=self.planner.ngram_match), "ngram", status)
        if d.kind == "prepared":
            done = lookup.finished or d.m <= len(lookup.draft)  # a finished branch verifies min(m, its length)
            draft = lookup.draft.head(d.m) if done else self.worker.extend(history, d.m)
            return Proposal(draft, "prespec", status)
        if self.worker is not None:
            return Proposal(self.worker.draft_now(history, d.m), "draft", status)
        return Proposal(self.drafter.propose(history, d.m, self.cancelled), "draft", status)

    def verifying(self, history: list[int], draft: Draft, k_next: int) -> None:
        # The worker prepares the next round only where that is expected to save more than it slows
        # this verify (planner.prespec_pays); otherwise the target verifies alone. The prompt is read
        # in the first round either way: the draft must catch up some time.
        self.busy = self.worker is not None and (
            not self.prefilled or self.planner.prespec_pays(k_next, len(draft) + 1))
        if self.busy:
            self.worker.verifying(history, draft, k_next)

    def observe(self, prop: Proposal, history: list[int], accepted: int, verify_s: float, draft_s: float,
                ms_per_token: float, top1: np.ndarray) -> None:
        if not self.prefilled:  # the prompt's prefill: its time says nothing of a step
            self.prefilled = True
            self.planner.observe_prefill(top1.tolist())
            self.planner.observe_history(history)
            return
        kind = self.decision.kind if self.decision is not None else "plain"
        self.planner.observe(kind, len(prop.draft), accepted, verify_s * 1e3, top1.tolist(), busy=self.busy)
        if self.worker is not None:  # what the worker ranks outcomes by
            self.worker.policy.observe_verify(len(prop.draft), accepted, prop.speculator)
            self.worker.policy.observe_round(ms_per_token)
        self.planner.observe_history(history)
        if kind == "draft" and self.drafter is not None and self.drafter.timing is not None:
            self.planner.observe_draft(*self.drafter.timing)
        self.meter.state = self.state

    def report(self) -> dict[str, Any]:
        return {**self.planner.report(), "concurrent": self.worker is not None}

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


def top1(rows: np.ndarray, s: SamplingConfig) -> np.ndarray:
    """The target's probability of its likeliest token, per row (at temperature 1 when greedy)."""
    # float32 throughout: a planning estimate, computed every round over the whole vocabulary, where
    # float64 cost 1 ms a row (2% of a 1.5B model's step on 2 cores)
    x = rows * np.float32(1.0 / (s.temperature if s.temperature > 0 else 1.0))
    x -= x.max(axis=1, keepdims=True)
    np.exp(x, out=x)
    return 1.0 / x.sum(axis=1, dtype=np.float64)


# ---------------------------------------------------------------- text and stops

class _Text:
    """Committed tokens -> text deltas, holding back what could still be a stop string."""

    def __init__(self, model: Model, stop: Sequence[str]) -> None:
        self.stream = TextStream(model)
        self.stop = [s for s in stop if s]
        self.text = ""
        self.sent = 0
        self.stopped = False

    def push(self, token: int) -> None:
        self.text += self.stream.push(token)
        # cut at the earliest occurrence of any stop string (one may end inside another)
        hits = [i for s in self.stop if (i := self.text.find(s, max(0, self.sent - len(s)))) >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            self.stopped = True

    def take(self) -> str:
        hold = 0
        if not self.stopped:
            for s in self.stop:
                for n in range(min(len(s) - 1, len(self.text) - self.sent), 0, -1):
                    if self.text.endswith(s[:n]):
                        hold = max(hold, n)
                        break
        out = self.text[self.sent: len(self.text) - hold]
        self.sent += len(out)
        return out

    def finish(self) -> str:
        """The text not yet handed out (held-back stop-string prefixes, a last partial character)."""
        if not self.stopped:
            self.text += self.stream.flush()
        out = self.text[self.sent:]
        self.sent = len(self.text)
        return out


def _offloaded(cfg: EngineConfig) -> bool:
    """Whether the target's layers run off this CPU: on a local GPU, or on --rpc servers (which, on another
    machine, a draft decoding here does not slow)."""
    return cfg.target.n_gpu_layers != 0 and (bool(cfg.target.rpc) or gpu_offload_supported())


# ---------------------------------------------------------------- the engine

class Engine:
    """Owns the models and their contexts; runs one generation at a time."""

    def __init__(self, config: EngineConfig, *, models_dir: str | None = None, profiles: bool = True) -> None:
        """profiles=False: mode auto never reads this device's calibration profile and plans from what
        each generation times alone (tests that must see the draft paths, whatever a profile says)."""
        if config.draft is None and config.mode in ("sd", "ssd"):
            raise ConfigError(f"mode '{config.mode}' needs a draft model (-md)")
        target = Model(resolve_model(config.target.path, models_dir), config.target.n_gpu_layers, config.verbose,
                       rpc=config.target.rpc, rpc_timeout_s=config.target.rpc_timeout_s)
        target_ctx = Context(target, config.n_ctx, config.n_batch, config.target.threads)
        draft = draft_ctx = None
        try:
            if config.draft is not None:
                draft = Model(resolve_model(config.draft.path, models_dir), config.draft.n_gpu_layers, config.verbose)
                check_same_vocab(target, draft)
                # Unified KV: the main sequence plus one per branch; cells for the budget and a margin.
                n_ctx = config.n_ctx + config.prespec.budget_cells + 2 * config.spec.k + 16
                draft_ctx = Context(draft, n_ctx, config.n_batch, config.draft.threads, config.prespec.fanout_max + 1)
        except BaseException:
            for obj in (draft_ctx, draft, target_ctx, target):
                if obj is not None:
                    obj.close()
            raise
        self._attach(config, target, target_ctx, draft, draft_ctx)
        self._profile_looked_up = not profiles

    @classmethod
    def from_parts(cls, config: EngineConfig, target: Any, target_ctx: Any, draft: Any = None,
                   draft_ctx: Any = None) -> "Engine":
        """An engine over models and contexts built elsewhere (the tests' fake backend)."""
        self = cls.__new__(cls)
        self._attach(config, target, target_ctx, draft, draft_ctx)
        return self

    def _attach(self, config: EngineConfig, target: Any, target_ctx: Any, draft: Any, draft_ctx: Any) -> None:
        self.config = config
        self.target, self.target_ctx = target, target_ctx
        self.target_kv = KVSeq(target_ctx)
        self.draft, self.draft_ctx = draft, draft_ctx
        self.draft_kv = KVSeq(draft_ctx, 0) if draft_ctx is not None else None
        self.n_draft_seqs = draft_ctx.n_seq_max if draft_ctx is not None else 0
        self.budget_cells_max = config.prespec.budget_cells  # the draft context was sized for this many
        # read once here (the loading thread): a face asks model_info, never the models themselves
        self._info = tuple(m.info() if m is not None and hasattr(m, "info") else None for m in (target, draft))
        # bytes one draft KV cell takes (K and V over all layers): the budget in bytes for monitoring
        self.draft_cell_bytes = self._info[1].kv_bytes_per_cell if self._info[1] is not None else 0
        self._lock = threading.Lock()
        self._worker: PrespecWorker | None = None
        self.profile = None  # a calibration profile (profile.Profile), for mode auto; loaded on first use
        self._step_ms: dict[int, Ema] = {}  # target threads -> ms of a one-token target step (a running mean)
        self._profile_looked_up = False

    # ------------------------------------------------------------ settings
    def configure(self, **changes: Any) -> EngineConfig:
        """Change settings between generations, e.g. configure(mode="sd", k=6, temperature=0.7)."""
        cfg = self.config.model_dump()
        for key, value in changes.items():
            if key in ("mode", "n_ctx"):
                cfg[key] = value
            elif key in SamplingConfig.model_fields:
                cfg["sampling"][key] = value
            elif key in cfg["spec"]:
                cfg["spec"][key] = value
            elif key in cfg["prespec"]:
                cfg["prespec"][key] = value
            else:
                raise ConfigError(f"unknown setting '{key}'")
        new = EngineConfig.build(**cfg)
        if new.mode in ("sd", "ssd") and self.draft is None:
            raise ConfigError(f"mode '{new.mode}' needs a draft model, and none is loaded")
        if new.n_ctx != self.config.n_ctx:
            raise ConfigError("n_ctx is fixed when the engine loads")
        if self.draft is not None and new.prespec.fanout_max + 1 > self.n_draft_seqs:
            raise ConfigError(f"fanout_max is at most {self.n_draft_seqs - 1} for the loaded draft context")
        if self.draft is not None and new.prespec.budget_cells > self.budget_cells_max:
            raise ConfigError("budget_cells cannot grow past the value the engine loaded with")
        self.config = new
        return new

    def resolve_mode(self, mode: str) -> str:
        """The mode a generation runs: as asked (auto plans each round itself, with or without a draft)."""
        return mode

    def auto_profile(self):
        """This device's calibration profile for the loaded pair (`ssd-edge calibrate`), or None."""
        if self.profile is None and not self._profile_looked_up:
            self._profile_looked_up = True
            if self.config.target.rpc:  # profiles measure a target on this device, not one across a network
                log.info("target on rpc servers: auto plans from what each generation measures")
                return None
            from .auto import profile
            try:
                self.profile = profile.load(self.target.path, self.draft.path if self.draft is not None else None)
            except OSError:  # a model without a file (the tests' fakes)
                self.profile = None
            if self.profile is None:
                log.info("no calibration profile for this device and pair (ssd-edge calibrate): "
                         "auto plans from what each generation measures")
        return self.profile

    def _threads_for(self, mode: str, cfg: EngineConfig) -> EngineConfig:
        """cfg with the thread split that suits `mode` on this machine. auto runs the draft beside the
        target only where the calibration profile says that beats alternating with every core each
        (without a profile: split_threads's rule of thumb)."""
        cores = usable_cores()
        t, d = split_threads(mode, self.draft is not None, cores)
        prof = self.auto_profile() if mode == "auto" and self.draft is not None else None
        if prof is not None:
            full = cfg.model_copy(update={"target": cfg.target.model_copy(update={"threads": cores}),
                                          "draft": cfg.draft.model_copy(update={"threads": cores})})
            try:
                best = prof.choose(full)
            except ValueError:  # no costs measured at these thread counts
                best = None
            if best is not None and best.mode == "ssd" and best.target_threads + best.draft_threads <= cores:
                t, d = best.target_threads, best.draft_threads
            elif best is not None:
                t, d = cores, cores
        update: dict[str, Any] = {"target": cfg.target.model_copy(update={"threads": t})}
        if cfg.draft is not None:
            update["draft"] = cfg.draft.model_copy(update={"threads": d})
        return cfg.model_copy(update=update)

    def _set_threads(self, cfg: EngineConfig) -> None:
        """Give each context the thread count of `cfg` (auto may pick a split other than the config's)."""
        for ctx, m in ((self.target_ctx, cfg.target), (self.draft_ctx, cfg.draft)):
            if ctx is not None and m is not None and getattr(ctx, "threads", m.threads) != m.threads:
                ctx.set_threads(m.threads)

    # ------------------------------------------------------------ prompts
    def prompt_tokens(self, prompt: str | None = None, messages: Sequence[dict[str, str]] | None = None) -> list[int]:
        if messages is not None:
            return self.tokenize(self.render_chat(messages), parse_special=True)
        if prompt is None:
            raise ConfigError("give a prompt or chat messages")
        return self.tokenize(prompt)

    # ------------------------------------------------------------ generation
    def complete(self, prompt: str | None = None, **kwargs: Any) -> Completion:
        """Run a generation to the end and return its text and stats."""
        for ev in self.generate(prompt, **kwargs):
            if isinstance(ev, FinishEvent):
                return Completion(ev.text, ev.tokens, ev.stop_reason, ev.stats)
        raise AssertionError("generate() ended without a FinishEvent")  # pragma: no cover

    def generate(self, prompt: str | None = None, *, messages: Sequence[dict[str, str]] | None = None,
                 tokens: Sequence[int] | None = None, max_tokens: int = 256, mode: str | None = None,
                 stop: Sequence[str] = (), cancel: threading.Event | None = None,
                 sampling: SamplingConfig | None = None) -> Iterator[Event]:
        """Yield a TokenEvent per round as tokens are committed, then one FinishEvent."""
        if max_tokens < 1:
            raise ConfigError("max_tokens must be at least 1")
        prompt_ids = list(tokens) if tokens is not None else self.prompt_tokens(prompt, messages)
        if not prompt_ids:
            raise ConfigError("the prompt is empty")
        if len(prompt_ids) >= self.config.n_ctx:
            raise ContextFullError(f"the prompt has {len(prompt_ids)} tokens and does not fit in the context of "
                                   f"{self.config.n_ctx} (raise -c/--ctx-size)")
        mode = self.resolve_mode(mode or self.config.mode)
        if mode in ("sd", "ssd") and self.draft is None:
            raise ConfigError(f"mode '{mode}' needs a draft model (-md)")
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this engine is already generating; one generation at a time")
        try:
            yield from self._run(prompt_ids, max_tokens, mode, stop, cancel or threading.Event(),
                                 sampling or self.config.sampling)
        finally:
            self._lock.release()

    # ------------------------------------------------------------ for the faces and the measuring
    # What the CLI, the TUI, the bench and calibrate ask of the loaded models: through these, never
    # through the engine's contexts or KV sequences. Those that touch a context (reset, use_threads,
    # the timings) run between generations; the others only read what loading fixed (the vocabulary,
    # the files, model_info): the TUI calls piece() between a generation's events, on its thread.

    @property
    def has_draft(self) -> bool:
        return self.draft is not None

    @property
    def plans_with_profile(self) -> bool:
        """Whether the configured mode prices its rounds with this device's calibration profile: auto
        with a draft model (`ssd-edge calibrate`, or the measuring on first use), the target on this
        device (a profile measures a target here, not one across --rpc servers)."""
        return self.draft is not None and self.config.mode == "auto" and not self.config.target.rpc

    @property
    def model_paths(self) -> tuple[Path, Path | None]:
        """The target's and the draft's files (None: no draft)."""
        return Path(self.target.path), Path(self.draft.path) if self.draft is not None else None

    @property
    def model_info(self) -> tuple[ModelInfo | None, ModelInfo | None]:
        """The target's and the draft's metadata, read when the engine loaded (None: no draft, or a
        model that cannot tell, as the tests' fakes)."""
        return self._info

    @property
    def n_vocab(self) -> int:
        return self.target.n_vocab

    def tokenize(self, text: str, *, parse_special: bool = False) -> list[int]:
        """`text` in the target's vocabulary, with its start token; parse_special: read special tokens'
        text (`<|im_start|>`) as those tokens."""
        return self.target.tokenize(text, add_special=True, parse_special=parse_special)

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        """The target's chat template applied to `messages`, with the assistant's turn opened."""
        return self.target.render_chat(messages)

    def piece(self, token: int) -> bytes:
        """The bytes of one token of the target's vocabulary (special tokens: empty)."""
        return self.target.piece(token)

    def reset(self) -> None:
        """Forget what the KV caches hold: the next generation reads its prompt from scratch."""
        for kv in (self.target_kv, self.draft_kv):
            if kv is not None:
                kv.truncate(0)

    @property
    def threads(self) -> tuple[int, int | None]:
        """The thread counts the target's and the draft's contexts run at now."""
        return self.target_ctx.threads, self.draft_ctx.threads if self.draft_ctx is not None else None

    def use_threads(self, target: int | None = None, draft: int | None = None) -> None:
        """Run the target's and the draft's contexts at these thread counts (None: as they are). A
        generation sets its own split only where the config's threads_follow_mode is on."""
        if target is not None:
            self.target_ctx.set_threads(target)
        if draft is not None and self.draft_ctx is not None:
            self.draft_ctx.set_threads(draft)

    def time_prefill(self, model: Literal["target", "draft"], prefix: Sequence[int]) -> float:
        """ms per token of reading `prefix` into `model`'s empty cache (which then holds it)."""
        kv = self._kv(model)
        kv.truncate(0)
        t0 = time.perf_counter()
        kv.feed(prefix)
        return (time.perf_counter() - t0) * 1e3 / len(prefix)

    def time_decode(self, model: Literal["target", "draft"], prefix: Sequence[int], batch: Sequence[int],
                    reps: int = 1) -> float:
        """Median ms of one decode of `batch` (every row's logits) by `model` after `prefix`, which
        the cache is made to hold first (untimed); the batch is dropped after each repetition."""
        kv = self._kv(model)
        kv.feed(prefix)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            kv.feed([*prefix, *batch], len(batch))
            times.append((time.perf_counter() - t0) * 1e3)
            kv.truncate(len(prefix))
        return statistics.median(times)

    def time_decode_beside(self, prefix: Sequence[int], batch: Sequence[int], seconds: float
                           ) -> tuple[float, float]:
        """Median ms of a target decode of `batch` and of a one-token draft step while the other model
        decodes at the same time (a thread drives the draft's context, this one the target's), over
        about `seconds`; both after `prefix`."""
        target, draft = self.target_kv, self._kv("draft")
        target.feed(prefix)
        draft.feed(prefix)
        stop = threading.Event()
        draft_ms: list[float] = []

        def draft_loop() -> None:  # the draft's context and KVSeq are this thread's until it is joined
            while not stop.is_set():
                t0 = time.perf_counter()
                draft.step(batch[0])
                draft_ms.append((time.perf_counter() - t0) * 1e3)
                draft.truncate(len(prefix))

        worker = threading.Thread(target=draft_loop, name="time-draft-beside", daemon=True)
        target_ms: list[float] = []
        worker.start()
        try:
            t_end = time.perf_counter() + seconds
            while time.perf_counter() < t_end or len(target_ms) < 2:
                target_ms.append(self.time_decode("target", prefix, batch))
        finally:
            stop.set()
            worker.join()
        return statistics.median(target_ms), statistics.median(draft_ms[1:] or draft_ms)

    def _kv(self, model: Literal["target", "draft"]) -> KVSeq:
        kv = self.target_kv if model == "target" else self.draft_kv
        if kv is None:
            raise ConfigError("no draft model is loaded")
        return kv

    def _strategy(self, mode: str, s: SamplingConfig, seed: int, meter: Meter, cancelled: Callable[[], bool],
                  cfg: EngineConfig) -> _Plain:
        ngram = NgramDrafter(cfg.spec.ngram_min, cfg.spec.ngram_max)
        if mode == "ar":
            return _Plain()
        if mode == "lookup":
            return _Lookup(ngram)
        p = cfg.prespec
        drafter = None
        if self.draft_kv is not None:
            drafter = ModelDrafter(self.draft_kv, s, seed, cfg.spec.p_min, meter.draft_busy,
                                   p.saguaro_top, p.saguaro_factor if mode == "ssd" else 1.0)
        if mode == "sd":
            return _Draft(drafter, cancelled)
        from .auto.planner import Planner  # ssd's and auto's modules, imported by those modes alone
        from .speculation.policy import PrespecPolicy
        from .speculation.prespec import PrespecWorker

        if mode == "auto":
            worker = None
            if drafter is not None and self.runs_beside(cfg) and p.budget_cells > 0:
                policy = PrespecPolicy(p, cfg.spec.k, self._plain_step_ms(cfg.target.threads),
                                       self._verify_curve(cfg.target.threads))
                worker = self._worker = PrespecWorker(drafter, policy, p, meter, self.n_draft_seqs, cancelled)
            planner = Planner(cfg.spec.k, k_min=cfg.spec.k_min, verify_curve=self._verify_curve(cfg.target.threads),
                              draft_curve=self._draft_curve(cfg.draft.threads) if cfg.draft else None,
                              step_ms=self._plain_step_ms(cfg.target.threads), ngram=ngram,
                              contention=self._contention(cfg) if worker is not None else None)
            return _Planned(planner, drafter, worker, cancelled, meter)
        policy = PrespecPolicy(p, cfg.spec.k, self._plain_step_ms(cfg.target.threads), self._verify_curve(cfg.target.threads))
        worker = self._worker = PrespecWorker(drafter, policy, p, meter, self.n_draft_seqs, cancelled)
        return _SSD(worker, policy, ngram, meter)

    def _run(self, prompt: list[int], max_tokens: int, mode: str, stop: Sequence[str], cancel: threading.Event,
             s: SamplingConfig) -> Iterator[Event]:
        cfg = self._threads_for(mode, self.config) if self.config.threads_follow_mode else self.config
        self._set_threads(cfg)
        k_max = cfg.spec.k if mode != "ar" else 0
        meter = Meter(mode, k_max, cfg.prespec.budget_cells if mode in ("ssd", "auto") else 0)
        meter.n_prompt, meter.cell_bytes, meter.state = len(prompt), self.draft_cell_bytes, mode
        seed = s.seed if s.seed is not None else fresh_seed()
        text = _Text(self.target, stop)
        history, out = list(prompt), []
        reason: StopReason | None = None
        message: str | None = None
        strategy = self._strategy(mode, s, seed, meter, cancel.is_set, cfg)
        try:
            while reason is None:
                room = cfg.n_ctx - len(history)  # the target's KV will hold history + draft
                if cancel.is_set() or room < 1:
                    reason, message = ("cancelled", None) if cancel.is_set() else \
                        ("context", f"the context of {cfg.n_ctx} tokens is full")
                    break
                k = max(0, min(k_max, room - 1, max_tokens - len(out) - 1))
                t_round = time.perf_counter()
                prop = strategy.propose(history, k, max_tokens - len(out)) if k > 0 else Proposal(EMPTY, "none", None)
                draft = self._min_draft(prop.draft, cfg.spec.k_min)
                prop = prop._replace(draft=draft)  # what is verified (--draft-min may have cut it)
                t_verify = time.perf_counter()
                strategy.verifying(history, draft, k_max)
                rows = self.target_kv.feed(history + list(draft.tokens), len(draft) + 1, cancel.is_set)
                verify_s = time.perf_counter() - t_verify
                meter.target_busy.add(verify_s)
                if not draft.tokens and len(history) > len(prompt):  # a plain step (not the prompt's prefill)
                    self._step_ms.setdefault(cfg.target.threads, Ema(None)).add(verify_s * 1e3)
                # The target's own draws (argmax, or coupled Gumbel-max when sampling: coupling.py);
                # a drafted token is accepted iff it equals the draw at its position.
                targets = rows.argmax(axis=1) if s.greedy else gumbel_picks(probs(rows, s), seed, len(history))
                a, b = verify(draft.tokens, targets)
                meter.first_token()
                new = self._commit([*draft.tokens[:a], b], max_tokens - len(out), text)
                reason = new.reason
                kind = PROVENANCE[prop.speculator if len(draft) else "none"]
                prov = ([kind] * a + ["target"])[:len(new.tokens)]
                history.extend([*draft.tokens[:a], b])
                out.extend(new.tokens)
                wall_ms = (time.perf_counter() - t_round) * 1e3
                rnd = Round(len(meter.rounds), strategy.state if mode in ("ssd", "auto") else mode,
                            prop.speculator if len(draft) else "none", prop.prespec, len(draft), a, wall_ms,
                            verify_s * 1e3, (t_verify - t_round) * 1e3)
                strategy.observe(prop, history, a, verify_s, t_verify - t_round, wall_ms / max(1, a + 1),
                                 top1(rows[:a + 1], s))
                meter.record(rnd, len(new.tokens))
                yield TokenEvent(text.take(), tuple(new.tokens), tuple(prov), rnd, meter.live())
        except Cancelled:
            reason = "cancelled"
        except ContextFullError as e:
            reason, message = "context", str(e)
        finally:
            self._end_strategy(strategy)
        tail = text.finish()
        stats = meter.stats(seed=None if s.greedy else seed, auto=strategy.report())
        yield FinishEvent(text.text, tuple(out), reason or "length", stats, message, tail)

    @staticmethod
    def _min_draft(draft: Draft, k_min: int) -> Draft:
        """--draft-min: a draft shorter than k_min is not verified (a plain step instead). Cutting what
        was drawn because of its length is safe here because committed tokens never depend on the
        proposal (coupling.py); the length itself is decided before each token is drawn."""
        return draft if len(draft) >= max(k_min, 1) else EMPTY

    def _commit(self, tokens: list[int], room: int, text: "_Text") -> "_Committed":
        """The round's tokens up to an end of generation, a stop string or max_tokens."""
        new: list[int] = []
        for t in tokens:
            if self.target.is_eog(t):
                return _Committed(new, "eos")
            new.append(t)
            text.push(t)
            if text.stopped:
                return _Committed(new, "stop")
            if len(new) >= room:
                return _Committed(new, "length")
        return _Committed(new, None)

    def runs_beside(self, cfg: EngineConfig) -> bool:
        """Whether the draft can pre-speculate beside the target without taking its compute: the target
        on a GPU, or the two models' threads fit on this machine's cores side by side. On shared cores
        the two alternating (each with every core) beat them running at once (FIELD_NOTES: a target
        step takes 173 ms on 1 thread beside the draft, 105 ms alone on 2)."""
        if self.draft is None or cfg.draft is None:
            return False
        if _offloaded(cfg):
            return True
        return cfg.target.threads + cfg.draft.threads <= usable_cores()

    def _verify_curve(self, threads: int) -> list[float] | None:
        """The profile's ms for a target decode of 1, 2, ... tokens at `threads`, if calibrated."""
        prof = self.auto_profile() if self.draft is not None else None
        costs = [c for c in prof.costs if c.target_threads == threads] if prof is not None else []
        return list(costs[0].target_ms) if costs else None

    def _draft_curve(self, threads: int) -> list[float] | None:
        """The profile's ms for a draft decode of 1, 2, ... tokens at `threads`, if calibrated."""
        prof = self.auto_profile() if self.draft is not None else None
        costs = [c for c in prof.costs if c.draft_threads == threads] if prof is not None else []
        return list(costs[0].draft_ms) if costs else None

    def _contention(self, cfg: EngineConfig) -> float | None:
        """The profile's slowdown of the target's verify with the draft decoding beside it, at this
        thread split: 1 for a GPU target, which a CPU draft does not slow; None where not calibrated."""
        if _offloaded(cfg):
            return 1.0
        prof = self.auto_profile() if self.draft is not None else None
        if prof is None or cfg.draft is None:
            return None
        costs = [c for c in prof.costs if (c.target_threads, c.draft_threads) == (cfg.target.threads, cfg.draft.threads)]
        return costs[0].target_overlap if costs else None

    def _plain_step_ms(self, threads: int) -> float | None:
        """One target step's cost at `threads`: as timed in earlier rounds, else from the profile."""
        if threads in self._step_ms:
            return self._step_ms[threads].value
        curve = self._verify_curve(threads)
        return curve[0] if curve else None

    def _end_strategy(self, strategy: _Plain) -> None:
        strategy.close()  # the worker's draft sequence is draft_kv itself (moved back to 0 by close)
        self._worker = None

    def close(self) -> None:
        for obj in (self.draft_ctx, self.target_ctx, self.draft, self.target):
            if obj is not None:
                obj.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
