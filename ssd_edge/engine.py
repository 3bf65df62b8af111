"""The engine: load a target (and a draft), then propose -> verify -> commit.

    for event in engine.generate("def fib(n):", max_tokens=64):
        print(event.text, end="")

Modes:  ar      the target alone, one token per step
        sd      the draft model drafts k tokens, the target verifies them in one batch
        lookup  the n-gram drafter (no model) drafts, the target verifies
        ssd     sd, plus pre-speculation of the next round while the target verifies (speculation/prespec.py)
        auto    each round, whichever of a plain step, the n-gram lookup, a draft or a
                pre-speculated branch is expected fastest; the default

One planner decides every mode's rounds (planning/planner.py: a fixed mode is the planner held
to one proposer); planning/rounds.py makes what it decides. Every mode emits exactly the target's tokens: its greedy tokens at temperature 0,
and when sampling, its coupled draws (coupling.py), which follow its distribution
and are the same for the same seed in every mode (up to near-ties between batched
and one-token logits; see tests/lossless_check.py).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Sequence

from .config import EngineConfig, SamplingConfig
from .coupling import Drawer, Draws, fresh_seed
from .errors import ConfigError, ContextFullError
from .events import FinishEvent, Round, Stats, StopReason, TokenEvent
from .interface import ModelInfo
from .llama.backend import Context, Model, check_gguf_file, check_same_vocab
from .llama.kvseq import Cancelled, KVSeq
from .llama.timing import DecodeTimer
from .memory import BudgetPlan, MemoryUse, ModelCost, fit_budget, measure as measure_memory, rss_bytes
from .metrics import Ema, Meter
from .models.catalog import resolve_model
from .planning import rounds as planned
from .text import StopText
from .verify import verify

log = logging.getLogger(__name__)

Event = TokenEvent | FinishEvent
# Mode ar's steps after the prompt run in one C call each (KVSeq.steps) for at most about this long, so
# that an event carries a tenth of a second of tokens (3 on a CPU at 30 ms a step, 60 on a GPU at 1.7):
# the stream stays live, a cancel is seen within it, and the engine's Python runs once per call instead
# of once per token, with caches that a CPU decode left cold.
PLAIN_CHUNK_S = 0.1
PROVENANCE = {"none": "target", "draft": "draft", "prespec": "prespec", "ngram": "ngram"}


class _Committed(NamedTuple):
    tokens: list[int]
    reason: StopReason | None  # why the generation ends after this round, if it does


@dataclass(frozen=True)
class Completion:
    text: str
    tokens: tuple[int, ...]
    stop_reason: StopReason
    stats: Stats


def _load_target(config: EngineConfig, models_dir: str | None, draft_path: Path | None, base: int
                 ) -> tuple[EngineConfig, BudgetPlan | None, Model, Context]:
    """The target and its context (the model closed again if the context fails), and the config they
    were made with: under --memory-budget, fitted once the target's weights are known."""
    t = config.target
    target = Model(resolve_model(t.path, models_dir), t.n_gpu_layers, config.verbose, rpc=t.rpc,
                   rpc_timeout_s=t.rpc_timeout_s, mmap=t.mmap, mlock=t.mlock)
    try:
        plan = None
        if config.memory_budget is not None:
            config, plan = _fit_budget(config, target, draft_path, base)
            t = config.target
        return config, plan, target, Context(target, config.n_ctx, config.n_batch, t.threads,
                                             cache_type_k=t.cache_type_k, cache_type_v=t.cache_type_v,
                                             flash_attn=t.flash_attn)
    except BaseException:
        target.close()
        raise


def _fit_budget(config: EngineConfig, target: Model, draft_path: Path | None, base: int
                ) -> tuple[EngineConfig, BudgetPlan]:
    """config changed to fit --memory-budget (memory.fit_budget): the target's weights as loaded, the
    draft's read by loading it for a moment (its weights and cell size), the rest from the models' shapes."""
    budget = config.memory_budget
    assert budget is not None
    info = target.info()
    tcost = ModelCost(target.buffers.weights or info.size_bytes, info.kv_bytes_per_cell, info.n_vocab)
    dcost = None
    if draft_path is not None and config.draft is not None and "draft" in planned.MENUS[config.mode].kinds:
        d = config.draft
        draft = Model(draft_path, d.n_gpu_layers, config.verbose, mmap=d.mmap, mlock=d.mlock)
        try:
            dinfo = draft.info()
            dcost = ModelCost(draft.buffers.weights or dinfo.size_bytes, dinfo.kv_bytes_per_cell, dinfo.n_vocab)
        finally:
            draft.close()
    try:
        plan = fit_budget(budget, base=base, target=tcost, draft=dcost, n_ctx=config.n_ctx, n_batch=config.n_batch,
                          kv=config.target.cache_type_k, budget_cells=config.prespec.budget_cells,
                          draft_extra=_draft_extra(config), draft_required=config.mode in ("sd", "ssd"))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    cfg = config.model_dump()
    cfg.update(n_ctx=plan.n_ctx)
    cfg["prespec"]["budget_cells"] = plan.budget_cells
    for role in ("target", "draft"):
        if cfg[role] is not None and plan.kv != config.target.cache_type_k:
            cfg[role].update(cache_type_k=plan.kv, cache_type_v=plan.kv, flash_attn="on")  # a quantized V needs it
    if not plan.draft and dcost is not None:
        cfg["draft"] = None
    log.info("%s", plan.describe(budget))
    return EngineConfig.build(**cfg), plan


def _draft_extra(config: EngineConfig) -> int:
    """The draft context's cells beyond the history and the branch budget: the longest draft the worker
    reads after the history, twice, and a margin."""
    return 2 * (config.spec.k or planned.NGRAM_CAP) + 16


def _load_draft(config: EngineConfig, path: Path, target: Model, n_seqs: int, budget_cells: int
                ) -> tuple[Model, Context]:
    """The draft and its context, checked against the target's vocabulary. Its KV cache is unified:
    the main sequence plus one per branch (n_seqs in all); cells for the history, the branch budget,
    the longest draft the worker reads after the history, and a margin."""
    d = config.draft
    assert d is not None
    draft = Model(path, d.n_gpu_layers, config.verbose, mmap=d.mmap, mlock=d.mlock)
    try:
        check_same_vocab(target, draft)
        n_ctx = config.n_ctx + budget_cells + _draft_extra(config)
        return draft, Context(draft, n_ctx, config.n_batch, d.threads, n_seqs, cache_type_k=d.cache_type_k,
                              cache_type_v=d.cache_type_v, flash_attn=d.flash_attn)
    except BaseException:
        draft.close()
        raise


# ---------------------------------------------------------------- the engine

def _info_of(model: Any) -> ModelInfo | None:
    return model.info() if model is not None and hasattr(model, "info") else None


class Engine:
    """Owns the models and their contexts; runs one generation at a time."""

    def __init__(self, config: EngineConfig, *, models_dir: str | None = None, profiles: bool = True) -> None:
        """profiles=False: the planner never reads this device's calibration profile and plans from what
        each generation times alone (tests that must see the draft paths, whatever a profile says).

        The draft model is loaded only when a generation may use it (load_draft): not for ar or
        lookup, and not for auto where this device's profile says no draft could beat plain steps
        (a compute-bound CPU), so those run in the target's memory alone. A mode that needs it later
        loads it first, between generations (Stats.draft_load_s)."""
        if config.draft is None and config.mode in ("sd", "ssd"):
            raise ConfigError(f"mode '{config.mode}' needs a draft model (-md)")
        draft_path = Path(resolve_model(config.draft.path, models_dir)) if config.draft is not None else None
        if draft_path is not None:
            check_gguf_file(draft_path)  # a wrong draft is named now, not at the first round that drafts
        self.rss_base = rss_bytes()  # the process without the models (memory.py's "other")
        config, self.budget_plan, *loaded = _load_target(config, models_dir, draft_path, self.rss_base)
        self._attach(config, *loaded)
        self._draft_path = draft_path if config.draft is not None else None
        self._profile_looked_up = not profiles
        try:
            if self.uses_draft(config.mode):
                self.load_draft()
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_parts(cls, config: EngineConfig, target: Any, target_ctx: Any, draft: Any = None,
                   draft_ctx: Any = None) -> "Engine":
        """An engine over models and contexts built elsewhere (the tests' fake backend)."""
        self = cls.__new__(cls)
        self.rss_base, self.budget_plan = rss_bytes(), None
        self._attach(config, target, target_ctx)
        self._draft_path = Path(draft.path) if draft is not None else None
        if draft is not None:
            self._attach_draft(draft, draft_ctx)
        return self

    def _attach(self, config: EngineConfig, target: Any, target_ctx: Any) -> None:
        self.config = config
        self.target, self.target_ctx = target, target_ctx
        self.target_kv = KVSeq(target_ctx)
        # the draft's context is sized once, for the settings the engine loads with (configure keeps to them)
        self.n_draft_seqs = config.prespec.fanout_max + 1
        self.budget_cells_max = config.prespec.budget_cells
        self.draft = self.draft_ctx = self.draft_kv = None
        self.draft_cell_bytes = 0
        # read once here (the loading thread): a face asks model_info, never the models themselves
        self._info: tuple[ModelInfo | None, ModelInfo | None] = (_info_of(target), None)
        self._lock = threading.Lock()
        self.profile = None  # this device's calibration profile (planning/profile.py); loaded on first use
        self._profile_looked_up = False
        self._step_ms: dict[int, Ema] = {}  # target threads -> ms of a plain target step, over generations

    def _attach_draft(self, draft: Any, draft_ctx: Any) -> None:
        self.draft, self.draft_ctx = draft, draft_ctx
        self.draft_kv = KVSeq(draft_ctx, 0)
        self.n_draft_seqs = draft_ctx.n_seq_max
        self._info = (self._info[0], _info_of(draft))
        # bytes one draft KV cell takes (K and V over all layers): the budget in bytes for monitoring
        self.draft_cell_bytes = self._info[1].kv_bytes_per_cell if self._info[1] is not None else 0

    def load_draft(self) -> float:
        """Load the configured draft model now if it is not loaded; the seconds it took (0: it was)."""
        if self.draft is not None or self._draft_path is None:
            return 0.0
        t0 = time.perf_counter()
        self._attach_draft(*_load_draft(self.config, self._draft_path, self.target, self.n_draft_seqs,
                                        self.budget_cells_max))
        took = time.perf_counter() - t0
        log.info("loaded the draft model %s in %.2f s", self._draft_path.name, took)
        return took

    def release_draft(self) -> None:
        """Free the draft model and its KV cache (between generations); a mode that drafts loads it again."""
        if self.draft is None:
            return
        ctx, model = self.draft_ctx, self.draft
        self.draft = self.draft_ctx = self.draft_kv = None
        self._info = (self._info[0], None)
        self.draft_cell_bytes = 0
        for obj in (ctx, model):
            obj.close()
        log.info("released the draft model %s", self._draft_path.name if self._draft_path else "")

    def uses_draft(self, mode: str | None = None) -> bool:
        """Whether a generation in `mode` may draft with the draft model: sd and ssd always, ar and
        lookup never, auto unless this device's profile says no draft could beat plain steps at the
        threads auto runs with (planning.rounds.draft_can_pay). mode None: the configured mode."""
        mode = mode or self.config.mode
        if self._draft_path is None or "draft" not in planned.MENUS[mode].kinds:
            return False
        if mode != "auto":
            return True
        cfg = self.config
        if cfg.threads_follow_mode:
            cfg = planned.threads_for("auto", cfg, True, self.auto_profile())
        return planned.draft_can_pay(cfg, self.auto_profile())

    # ------------------------------------------------------------ settings
    def configure(self, **changes: Any) -> EngineConfig:
        """Change settings between generations, e.g. configure(mode="sd", k=6, temperature=0.7)."""
        new = self.config.with_changes(**changes)
        if new.mode in ("sd", "ssd") and not self.has_draft:
            raise ConfigError(f"mode '{new.mode}' needs a draft model, and none is loaded")
        if new.n_ctx != self.config.n_ctx:
            raise ConfigError("n_ctx is fixed when the engine loads")
        if self.has_draft and new.prespec.fanout_max + 1 > self.n_draft_seqs:
            raise ConfigError(f"fanout_max is at most {self.n_draft_seqs - 1} for the loaded draft context")
        if self.has_draft and new.prespec.budget_cells > self.budget_cells_max:
            raise ConfigError("budget_cells cannot grow past the value the engine loaded with")
        self.config = new
        return new

    def auto_profile(self):
        """This device's calibration profile for the loaded pair (`ssd-edge calibrate`), or None."""
        if self.profile is None and not self._profile_looked_up:
            self._profile_looked_up = True
            from .planning import profile

            self.profile = profile.load_for(self.config, *self.model_paths)
        return self.profile

    # ------------------------------------------------------------ generation
    def prompt_tokens(self, prompt: str | None = None, messages: Sequence[dict[str, str]] | None = None) -> list[int]:
        if messages is not None:
            return self.tokenize(self.render_chat(messages), parse_special=True)
        if prompt is None:
            raise ConfigError("give a prompt or chat messages")
        return self.tokenize(prompt)

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
        mode = mode or self.config.mode
        if mode in ("sd", "ssd") and not self.has_draft:
            raise ConfigError(f"mode '{mode}' needs a draft model (-md)")
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this engine is already generating; one generation at a time")
        try:
            loaded_s = self.load_draft() if self.draft is None and self.uses_draft(mode) else None
            yield from self._run(prompt_ids, max_tokens, mode, stop, cancel or threading.Event(),
                                 sampling or self.config.sampling, loaded_s)
        finally:
            self._lock.release()

    def _rounds(self, mode: str, cfg: EngineConfig, s: SamplingConfig, seed: int, meter: Meter,
                cancel: threading.Event) -> planned.Rounds:
        """The generation's planner and proposers, priced by the profile and earlier generations."""
        step = self._step_ms.get(cfg.target.threads)
        return planned.build(mode, cfg, s, seed, meter, cancel.is_set, draft_kv=self.draft_kv,
                             n_draft_seqs=self.n_draft_seqs, step_ms=step.value if step is not None else None,
                             profile=self.auto_profile() if mode in ("ssd", "auto") and self.has_draft else None)

    def _run(self, prompt: list[int], max_tokens: int, mode: str, stop: Sequence[str], cancel: threading.Event,
             s: SamplingConfig, draft_load_s: float | None = None) -> Iterator[Event]:
        """One generation; draft_load_s: the draft model was loaded for it first, in that many seconds."""
        cfg = self.config
        if cfg.threads_follow_mode:
            cfg = planned.threads_for(mode, cfg, self.has_draft, self.auto_profile() if mode == "auto" else None)
        self.use_threads(cfg.target.threads, cfg.draft.threads if cfg.draft is not None else None)
        meter = Meter(mode, planned.caps(mode, cfg.spec.k)[0], cfg.prespec.budget_cells if mode in ("ssd", "auto") else 0)
        meter.n_prompt, meter.cell_bytes, meter.state = len(prompt), self.draft_cell_bytes, mode
        seed = s.seed if s.seed is not None else fresh_seed()
        text = StopText(self.target, stop)
        history, out = list(prompt), []
        reason: StopReason | None = None
        message: str | None = None
        rounds = self._rounds(mode, cfg, s, seed, meter, cancel)
        step_ms = self._step_ms.setdefault(cfg.target.threads, Ema(None))
        drawer = Drawer(s, seed)
        stepping = rounds.plain  # mode ar: plain steps in one C call each where the target can (_steps)
        try:
            while reason is None:
                room = cfg.n_ctx - len(history)  # the target's KV will hold history + draft
                if cancel.is_set() or room < 1:
                    reason, message = ("cancelled", None) if cancel.is_set() else \
                        ("context", f"the context of {cfg.n_ctx} tokens is full")
                    break
                if stepping and len(history) > len(prompt):  # ar after the prompt: steps in one C call
                    chunk = self._steps(history, room, max_tokens - len(out), drawer, step_ms, meter, text)
                    stepping = chunk is not None  # if not, this target cannot (--rpc, priced, top-k off): rounds
                    if chunk is not None:
                        new, rnd, steps = chunk
                        reason = new.reason
                        out.extend(new.tokens)
                        yield TokenEvent(text.take(), tuple(new.tokens), ("target",) * len(new.tokens), rnd,
                                         meter.live(), steps)
                        continue
                t_round = time.perf_counter()
                prop = rounds.propose(history, min(room - 1, max_tokens - len(out) - 1), max_tokens - len(out))
                draft = prop.draft
                t_verify = time.perf_counter()
                rounds.verifying(history, draft)
                rows = self.target_kv.feed(history + list(draft.tokens), len(draft) + 1, cancel.is_set)
                verify_s = time.perf_counter() - t_verify
                meter.target_busy_s += verify_s
                if not draft.tokens and len(history) > len(prompt) and not rounds.busy:  # a plain step, alone
                    step_ms.add(verify_s * 1e3)
                # The target's own draws (argmax, or coupled Gumbel-max over each row's candidates when
                # sampling: coupling.py), made as verify reads them; a drafted token is accepted iff it
                # equals the draw at its position.
                targets = Draws(rows, drawer, len(history))
                a, b = verify(draft.tokens, targets)
                meter.first_token()
                new = self._commit([*draft.tokens[:a], b], max_tokens - len(out), text)
                reason = new.reason
                prov = ([PROVENANCE[prop.speculator]] * a + ["target"])[:len(new.tokens)]
                history.extend([*draft.tokens[:a], b])
                out.extend(new.tokens)
                wall_ms = (time.perf_counter() - t_round) * 1e3
                rounds.observe(prop, history, a, verify_s, wall_ms / (a + 1), rows[:a + 1])
                rnd = Round(len(meter.rounds), rounds.served, prop.speculator, prop.prespec, len(draft), a, wall_ms,
                            verify_s * 1e3, (t_verify - t_round) * 1e3)
                meter.state = rounds.state
                meter.record(rnd, len(new.tokens))
                yield TokenEvent(text.take(), tuple(new.tokens), tuple(prov), rnd, meter.live())
        except Cancelled:
            reason = "cancelled"
        except ContextFullError as e:
            reason, message = "context", str(e)
        finally:
            rounds.close()
        tail = text.finish()
        stats = meter.stats(seed=None if s.greedy else seed, auto=rounds.report(), draft_load_s=draft_load_s,
                            memory=self.memory().to_dict(), devices=self.devices())
        yield FinishEvent(text.text, tuple(out), reason or "length", stats, message, tail)

    def _steps(self, history: list[int], room: int, remaining: int, drawer: Drawer, step_ms: Ema, meter: Meter,
               text: StopText) -> tuple[_Committed, Round, int] | None:
        """Plain steps after `history` (extended by the tokens drawn) in one call of the target's context,
        up to PLAIN_CHUNK_S of them (KVSeq.steps), at most `room` (the context's) and `remaining` (the
        answer's), each recorded as the round it is; the steps' tokens up to an end of generation, a stop
        string or `remaining`, the last step's round, and how many rounds they stand for. None where the
        context cannot: the loop then steps a round at a time. The tokens are the rounds' own: the same
        draws from the same rows (native.steps is coupling.Drawer's C path; tests hold the two equal)."""
        t0 = time.perf_counter()
        got = self.target_kv.steps(history, min(room, remaining), PLAIN_CHUNK_S, drawer)
        if got is None:
            return None
        drawn, in_decode_s = got
        n = len(drawn)
        meter.target_busy_s += in_decode_s
        step_ms.add(in_decode_s * 1e3 / n)
        new = self._commit(drawn, remaining, text)
        history.extend(drawn)
        wall_ms, verify_ms = (time.perf_counter() - t0) * 1e3 / n, in_decode_s * 1e3 / n
        kept = len(new.tokens)
        # the rounds a round at a time would have made: to the one that ended the answer (an end of
        # generation is drawn, not kept); steps past a stop string ran, and are the loop's to forget
        made = min(n, kept + (new.reason == "eos"))
        for i in range(made):
            rnd = Round(len(meter.rounds), "ar", "none", None, 0, 0, wall_ms, verify_ms, 0.0)
            meter.record(rnd, int(i < kept))
        return new, rnd, made

    def _commit(self, tokens: list[int], room: int, text: StopText) -> _Committed:
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

    # ------------------------------------------------------------ for the faces and the measuring
    # What the CLI, the TUI, the bench and calibrate ask of the loaded models: through these, never
    # through the engine's contexts or KV sequences. Those that touch a context (reset, use_threads,
    # decode_timer) run between generations; the others only read what loading fixed (the
    # vocabulary, the files, model_info): the TUI calls piece() between a generation's events.

    @property
    def has_draft(self) -> bool:
        """Whether a draft model is configured (loaded, or loaded when a mode first needs it)."""
        return self._draft_path is not None

    @property
    def draft_loaded(self) -> bool:
        return self.draft is not None

    @property
    def plans_with_profile(self) -> bool:
        """Whether the configured mode prices its rounds with this device's calibration profile: auto
        with a draft model (`ssd-edge calibrate`, or the measuring on first use), the target on this
        device (a profile measures a target here, not one across --rpc servers)."""
        return self.has_draft and self.config.mode == "auto" and not self.config.target.rpc

    @property
    def model_paths(self) -> tuple[Path, Path | None]:
        """The target's and the draft's files (None: no draft)."""
        return Path(self.target.path), Path(self.draft.path) if self.draft is not None else self._draft_path

    @property
    def model_info(self) -> tuple[ModelInfo | None, ModelInfo | None]:
        """The target's and the draft's metadata, read at load (None: no draft, a draft not loaded yet,
        or a fake model)."""
        return self._info

    n_vocab = property(lambda self: self.target.n_vocab)

    def devices(self) -> dict[str, str] | None:
        """Where each loaded model's layers run (ModelInfo.device; the target's '... via RPC' on --rpc
        servers); None for fake models, which have no metadata."""
        target, draft = self._info
        if target is None:
            return None
        where = target.device + (" via RPC" if self.config.target.rpc and target.gpu_layers else "")
        return {"target": where, **({"draft": draft.device} if draft is not None else {})}

    def memory(self) -> MemoryUse:
        """Where the memory goes now: weights, KV caches and compute buffers by model, and the rest
        of the process (memory.py; the figures are llama.cpp's own allocations)."""
        return measure_memory(self)

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
    def threads(self) -> tuple[int, int | None]:  # the target's and the draft's contexts' thread counts now
        return self.target_ctx.threads, self.draft_ctx.threads if self.draft_ctx is not None else None

    def use_threads(self, target: int | None = None, draft: int | None = None) -> None:  # None: as it is
        for ctx, n in ((self.target_ctx, target), (self.draft_ctx, draft)):
            if ctx is not None and n is not None and getattr(ctx, "threads", n) != n:
                ctx.set_threads(n)

    def decode_timer(self) -> DecodeTimer:  # timing decodes on the pair (the draft loaded first), for calibration
        self.load_draft()
        return DecodeTimer(self.target_kv, self.draft_kv)

    def close(self) -> None:
        for obj in (self.draft_ctx, self.target_ctx, self.draft, self.target):
            if obj is not None:
                obj.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
