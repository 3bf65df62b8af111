"""The loaded pair: the target and the draft model, their contexts and KV sequences, the memory
budget they were fitted to, loading and release; and what the faces ask of the loaded models.

    Pair(config)         the target loaded (fitted to --memory-budget where given); the draft's file
                         checked, the model itself loaded by load_draft() when a mode first drafts
    load_draft()         the draft model and its unified-KV context (the main sequence plus one per
                         pre-speculation branch), checked against the target's vocabulary
    release_draft()      the draft's weights and KV cache freed between generations

The engine (engine.py) is a Pair that runs generations. Everything here runs between generations,
on the thread that owns the engine, except the read-only facts fixed at load (model_info, piece).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Sequence, TypeVar

from .config import EngineConfig
from .errors import ConfigError, ContextFullError
from .events import Prefilled
from .interface import ModelInfo
from .llama.backend import Context, Model, check_gguf_file, check_same_vocab
from .llama.kvseq import Cancelled, KVSeq
from .llama.timing import DecodeTimer
from .memory import BudgetPlan, MemoryUse, ModelCost, fit_budget, measure as measure_memory, rss_bytes
from .models.catalog import resolve_model
from .planning import rounds as planned
from .structured.template import ChatTemplate
from .structured.tools import needs_template, render as render_with_tools

log = logging.getLogger(__name__)
P = TypeVar("P", bound="Pair")  # a Pair or the Engine that extends it


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



def _info_of(model: Any) -> ModelInfo | None:
    return model.info() if model is not None and hasattr(model, "info") else None


class Pair:
    """The target (and the draft) as loaded, with their contexts and KV sequences."""

    def __init__(self, config: EngineConfig, models_dir: str | None = None) -> None:
        """The target loaded, fitted to config.memory_budget where given (self.config is the fitted
        config); the draft's file resolved and checked, its model not loaded yet (load_draft)."""
        if config.draft is None and config.mode in ("sd", "ssd"):
            raise ConfigError(f"mode '{config.mode}' needs a draft model (-md)")
        draft_path = Path(resolve_model(config.draft.path, models_dir)) if config.draft is not None else None
        if draft_path is not None:
            check_gguf_file(draft_path)  # a wrong draft is named now, not at the first round that drafts
        self.rss_base = rss_bytes()  # the process without the models (memory.py's "other")
        config, self.budget_plan, *loaded = _load_target(config, models_dir, draft_path, self.rss_base)
        self._attach(config, *loaded)
        self._draft_path = draft_path if config.draft is not None else None

    @classmethod
    def from_parts(cls: type[P], config: EngineConfig, target: Any, target_ctx: Any, draft: Any = None,
                   draft_ctx: Any = None) -> P:
        """A pair over models and contexts built elsewhere (the tests' fake backend)."""
        self = cls.__new__(cls)
        self.rss_base, self.budget_plan = rss_bytes(), None
        self._attach(config, target, target_ctx)
        self._draft_path = Path(draft.path) if draft is not None else None
        if draft is not None:
            self._attach_draft(draft, draft_ctx)
        return self

    def _attach(self, config: EngineConfig, target: Any, target_ctx: Any) -> None:
        self._lock = threading.Lock()  # held by the one generation (or prefill) running on the pair
        self.config = config
        self.target, self.target_ctx = target, target_ctx
        self.target_kv = KVSeq(target_ctx)
        self.target_kv.reuse = config.cache_reuse  # (fixed at load: configure() does not change it)
        # the draft's context is sized once, for the settings the engine loads with (configure keeps to them)
        self.n_draft_seqs = config.prespec.fanout_max + 1
        self.budget_cells_max = config.prespec.budget_cells
        self.draft = self.draft_ctx = self.draft_kv = None
        self.draft_cell_bytes = 0
        # read once here (the loading thread): a face asks model_info, never the models themselves
        self._info: tuple[ModelInfo | None, ModelInfo | None] = (_info_of(target), None)

    def _attach_draft(self, draft: Any, draft_ctx: Any) -> None:
        self.draft, self.draft_ctx = draft, draft_ctx
        self.draft_kv = KVSeq(draft_ctx, 0)
        # --cache-reuse for the draft too: its first read of a generation moves what the last one left, as the
        # target's does (only one sequence holds cells then: SSD's worker leaves its draft on sequence 0 alone)
        self.draft_kv.reuse = self.config.cache_reuse
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

    def abandon_draft(self) -> None:
        """Let go of a draft that a hung SSD worker still holds (it is never closed under that thread): a
        mode that drafts loads the model again; an engine given as parts has none to load."""
        self.draft = self.draft_ctx = self.draft_kv = None
        self._info = (self._info[0], None)
        log.warning("SSD's draft side hangs: its draft model is left to it%s",
                    "" if self._draft_path is None else f"; {self._draft_path.name} is loaded again when used")

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

    def render_chat(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None) -> str:
        """The target's chat template applied to `messages`, with the assistant's turn opened. Plain
        role/text chats go through llama.cpp's renderer; with `tools` (OpenAI's), or tool calls and
        results in the history, the GGUF's Jinja template renders them (structured/tools.py)."""
        if not tools and not needs_template(messages):
            return self.target.render_chat(messages)
        return render_with_tools(self.chat_template(), self.target.render_chat, messages, tools)

    def chat_template(self) -> ChatTemplate | None:
        """The target's Jinja chat template (None: the file has none, or a fake model)."""
        text = self.target.chat_template() if hasattr(self.target, "chat_template") else None
        if not text:
            return None
        return ChatTemplate(text, *self.target.bos_eos_text())

    def grammar_tokenizer(self) -> Any:
        """llguidance's tokenizer of the target's vocabulary (the draft shares it), built on first use
        and kept while the target stays loaded (structured/tokenizer.py: under a second for 152k tokens)."""
        tok = getattr(self, "_grammar_tokenizer", None)
        if tok is None or tok[0] is not self.target:
            from .structured.tokenizer import for_model

            tok = self._grammar_tokenizer = (self.target, for_model(self.target))
        return tok[1]

    def piece(self, token: int) -> bytes:
        """The bytes of one token of the target's vocabulary (special tokens: empty)."""
        return self.target.piece(token)

    def cached_prefix(self, tokens: Sequence[int]) -> int:
        """How many of the prompt `tokens` the target's cache holds now and a generation keeps (all but the
        last at most: its row is read again): their common prefix, and with --cache-reuse the chunks it
        moves. Between generations."""
        return self.target_kv.held_for(tokens) if tokens else 0

    def check_prompt(self, tokens: Sequence[int]) -> None:
        """A prompt the target's context can read and still answer: not empty, shorter than n_ctx."""
        if not tokens:
            raise ConfigError("the prompt is empty")
        if len(tokens) >= self.config.n_ctx:
            raise ContextFullError(f"the prompt has {len(tokens)} tokens and does not fit in the context of "
                                   f"{self.config.n_ctx} (raise -c/--ctx-size)")

    def prefill(self, tokens: Sequence[int], cancel: threading.Event | None = None) -> Prefilled:
        """Read the prompt `tokens` into the target's cache and generate nothing (an editor's warm-up): the
        cached prefix is kept, the rest decoded a batch at a time, `cancel` checked between batches. The
        next generation whose prompt starts with these tokens reads only what follows them."""
        self.check_prompt(tokens)
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this engine is already generating; one generation at a time")
        try:
            if self.config.threads_follow_mode:  # the target alone reads: every core, as mode ar's split gives it
                self.use_threads(planned.threads_for("ar", self.config, self.has_draft, None).target.threads)
            cached, t0 = self.cached_prefix(tokens), time.perf_counter()
            try:
                self.target_kv.feed(list(tokens), 1, cancel.is_set if cancel is not None else None)
            except Cancelled:
                return Prefilled(len(tokens), cached, time.perf_counter() - t0, cancelled=True)
            return Prefilled(len(tokens), cached, time.perf_counter() - t0)
        finally:
            self._lock.release()

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

    def __enter__(self: P) -> P:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
