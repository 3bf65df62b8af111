"""The engine: load a target (and a draft), then propose -> verify -> commit.

    for event in engine.generate("def fib(n):", max_tokens=64):
        print(event.text, end="")

Modes:  ar      the target alone, one token per step
        sd      the draft model drafts k tokens, the target verifies them in one batch
        lookup  the n-gram drafter (no model) drafts, the target verifies
        ssd     sd, plus pre-speculation of the next round while the target verifies (prespec.py)
        auto    chosen from the device's calibration profile (calibrate.py)

Every mode emits exactly the target's distribution; greedy (temperature 0)
emits exactly the target's greedy tokens (up to near-ties between batched and
one-token logits; see tests/test_lossless.py).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from .autopilot import Autopilot
from .backend import Context, Model, check_same_vocab
from .catalog import resolve_model
from .config import EngineConfig, SamplingConfig, split_threads, usable_cores
from .drafters import EMPTY, Draft, ModelDrafter, NgramDrafter
from .errors import ConfigError, ContextFullError
from .events import FinishEvent, Round, StopReason, TokenEvent
from .interface import Aborted, TextStream
from .kvseq import Cancelled, KVSeq
from .metrics import Meter
from .policy import Ema, PrespecPolicy
from .prespec import PrespecWorker
from .sampling import probs
from .verify import verify_greedy, verify_sampled

log = logging.getLogger(__name__)

Event = TokenEvent | FinishEvent
PROVENANCE = {"none": "target", "draft": "draft", "prespec": "prespec", "ngram": "ngram"}


class Proposal(NamedTuple):
    draft: Draft
    speculator: str          # none, draft, prespec, ngram
    prespec: str | None      # SSD lookups: hit, partial, miss


@dataclass(frozen=True)
class Completion:
    text: str
    tokens: tuple[int, ...]
    stop_reason: StopReason
    stats: dict[str, Any]


# ---------------------------------------------------------------- speculation strategies

class _Plain:
    state = "ar"

    def propose(self, history: list[int], k: int) -> Proposal:
        return Proposal(EMPTY, "none", None)

    def verifying(self, history: list[int], draft: Draft, k_next: int) -> None: ...

    def observe(self, proposal: Proposal, accepted: int, verify_s: float, draft_s: float, ms_per_token: float) -> None: ...

    def close(self) -> None: ...


class _Lookup(_Plain):
    state = "lookup"

    def __init__(self, ngram: NgramDrafter) -> None:
        self.ngram = ngram

    def propose(self, history: list[int], k: int) -> Proposal:
        return Proposal(self.ngram.propose(history, k), "ngram", None)


class _Draft(_Plain):
    state = "sd"

    def __init__(self, drafter: ModelDrafter, cancelled: Callable[[], bool]) -> None:
        self.drafter = drafter
        self.cancelled = cancelled

    def propose(self, history: list[int], k: int) -> Proposal:
        return Proposal(self.drafter.propose(history, k, self.cancelled), "draft", None)


class _SSD(_Plain):
    """Pre-speculation with a draft-model primary and an n-gram backup."""

    def __init__(self, worker: PrespecWorker, policy: PrespecPolicy, ngram: NgramDrafter, meter: Meter) -> None:
        self.worker = worker
        self.policy = policy
        self.ngram = ngram
        self.meter = meter

    @property
    def state(self) -> str:
        return "ssd" if self.policy.state == "ssd" else self.policy.state

    def propose(self, history: list[int], k: int) -> Proposal:
        res = self.worker.lookup(history, k)  # a partial is extended as far as plan_round says
        if res.status in ("hit", "partial"):
            self.policy.observe_lookup(res.status)
            draft = res.draft.head(self.policy.plan_round(len(res.draft), k))
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

    def observe(self, proposal: Proposal, accepted: int, verify_s: float, draft_s: float, ms_per_token: float) -> None:
        d = len(proposal.draft)
        self.policy.observe_verify(d, accepted, proposal.speculator)
        self.policy.observe_costs(d, verify_s * 1e3, draft_s * 1e3 / d if proposal.speculator == "draft" and d else None)
        self.policy.observe_round(ms_per_token)
        self.meter.state = "backup" if proposal.speculator == "ngram" else self.state

    def close(self) -> None:
        self.worker.close()


class _Shadow:
    """The draft model reading along on its own thread while the target decodes alone (auto's
    watch): it reads the prompt, then each committed token, and guesses the next one, so the
    draft's real acceptance is measured at no cost to the target, and a switch into sd/ssd
    finds the draft caught up. llama_decode releases the GIL."""

    def __init__(self, kv: KVSeq, prompt: list[int], cancel: threading.Event) -> None:
        self.kv = kv
        self.cancel = cancel
        self.guesses: dict[int, int] = {}   # position -> the draft's greedy token there
        self._want: list[int] | None = list(prompt)
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self.thread = threading.Thread(target=self._run, name="ssd-edge-draft-shadow", daemon=True)
        self.thread.start()

    def push(self, history: Sequence[int]) -> None:
        """The history now committed; the shadow reads it when free (intermediate ones are skipped)."""
        with self._cond:
            self._want = list(history)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._want is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                want, self._want = self._want, None
                self._busy = True
            try:
                row = self.kv.feed(want, 1, self.cancel.is_set)
                self.guesses[len(want)] = int(row[-1].argmax())
            except (Cancelled, Aborted):
                pass
            except Exception:  # only an optimisation: a switch into sd/ssd reads the history again
                log.exception("the draft model could not read along")
                with self._cond:
                    self._closed = True
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def guess(self, position: int) -> int | None:
        return self.guesses.pop(position, None)

    def settle(self) -> int:
        """Wait until the latest history is read and stop; the number of tokens the draft holds."""
        with self._cond:
            while (self._want is not None or self._busy) and not self._closed:
                self._cond.wait()
            self._closed = True
            self._cond.notify_all()
        self.thread.join()
        return len(self.kv.tokens)

    def stop(self) -> None:
        """Abandon the reading (the generation ended): abort the decode in flight."""
        abort = getattr(self.kv.ctx, "abort", None)  # the tests' fake contexts have none
        with self._cond:
            self._closed = True
            self._want = None
            self._cond.notify_all()
            if abort is not None and self._busy:
                abort.set()
        self.thread.join()
        if abort is not None:
            abort.clear()


def top1(rows: np.ndarray, s: SamplingConfig) -> np.ndarray:
    """The target's probability of its likeliest token, per row (at temperature 1 when greedy)."""
    x = rows.astype(np.float64) / (s.temperature if s.temperature > 0 else 1.0)
    x -= x.max(axis=1, keepdims=True)
    return 1.0 / np.exp(x).sum(axis=1)


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


# ---------------------------------------------------------------- the engine

class Engine:
    """Owns the models and their contexts; runs one generation at a time."""

    def __init__(self, config: EngineConfig, *, models_dir: str | None = None) -> None:
        if config.draft is None and config.mode in ("sd", "ssd"):
            raise ConfigError(f"mode '{config.mode}' needs a draft model (-md)")
        target = Model(resolve_model(config.target.path, models_dir), config.target.n_gpu_layers, config.verbose)
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
        # bytes one draft KV cell takes (K and V over all layers): the budget in bytes for monitoring
        self.draft_cell_bytes = draft.info().kv_bytes_per_cell if hasattr(draft, "info") else 0
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
        if mode != "auto":
            return mode
        if self.auto_profile() is not None:
            return self.profile.choose(self.config).mode
        return "ssd" if self.draft is not None else "lookup"

    def auto_profile(self):
        """This device's calibration profile for the loaded pair (`ssd-edge calibrate`), or None."""
        if self.profile is None and not self._profile_looked_up:
            self._profile_looked_up = True
            from . import profile
            try:
                self.profile = profile.load(self.target.path, self.draft.path if self.draft is not None else None)
            except OSError:  # a model without a file (the tests' fakes)
                self.profile = None
            if self.profile is None:
                log.info("no calibration profile for this device and pair (run ssd-edge calibrate); "
                         "auto falls back to %s", "ssd" if self.draft is not None else "lookup")
        return self.profile

    def _threads_for(self, mode: str, cfg: EngineConfig) -> EngineConfig:
        """cfg with the thread split that suits `mode` on this machine (split_threads)."""
        t, d = split_threads(mode, self.draft is not None, usable_cores())
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
            text = self.target.render_chat(messages)
            return self.target.tokenize(text, add_special=True, parse_special=True)
        if prompt is None:
            raise ConfigError("give a prompt or chat messages")
        return self.target.tokenize(prompt, add_special=True, parse_special=False)

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
        requested = mode or self.config.mode
        mode = self.resolve_mode(requested)
        if mode in ("sd", "ssd") and self.draft is None:
            raise ConfigError(f"mode '{mode}' needs a draft model (-md)")
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this engine is already generating; one generation at a time")
        try:
            yield from self._run(prompt_ids, max_tokens, mode, stop, cancel or threading.Event(),
                                 sampling or self.config.sampling, auto=requested == "auto")
        finally:
            self._lock.release()

    def _strategy(self, mode: str, s: SamplingConfig, rng: np.random.Generator, meter: Meter,
                  cancelled: Callable[[], bool], cfg: EngineConfig | None = None) -> _Plain:
        cfg = cfg or self.config
        ngram = NgramDrafter(cfg.spec.ngram_min, cfg.spec.ngram_max)
        if mode == "ar":
            return _Plain()
        if mode == "lookup":
            return _Lookup(ngram)
        assert self.draft_kv is not None
        p = cfg.prespec
        drafter = ModelDrafter(self.draft_kv, s, rng, cfg.spec.p_min, meter.draft_busy,
                               p.saguaro_top, p.saguaro_factor if mode == "ssd" else 1.0)
        if mode == "sd":
            return _Draft(drafter, cancelled)
        policy = PrespecPolicy(p, cfg.spec.k, self._plain_step_ms(cfg.target.threads), self._verify_curve(cfg.target.threads))
        worker = PrespecWorker(drafter, policy, p, meter, self.n_draft_seqs, cancelled)
        self._worker = worker  # for tests and monitoring
        return _SSD(worker, policy, ngram, meter)

    def _run(self, prompt: list[int], max_tokens: int, mode: str, stop: Sequence[str], cancel: threading.Event,
             s: SamplingConfig, auto: bool = False) -> Iterator[Event]:
        # auto with a profile: the autopilot picks mode, k, threads and window, and may switch mid-way
        pilot = Autopilot.start(self.profile, self.config) if auto and self.profile is not None else None
        cfg = pilot.run_config if pilot is not None else self.config
        mode = cfg.mode if pilot is not None else mode
        if pilot is None and cfg.threads_follow_mode:
            cfg = self._threads_for(mode, cfg)
        self._set_threads(cfg)
        k_max = cfg.spec.k if mode != "ar" else 0
        meter = Meter("auto" if pilot is not None else mode, k_max,
                      cfg.prespec.budget_cells if mode == "ssd" or pilot is not None else 0)
        meter.state = mode
        meter.n_prompt = len(prompt)
        meter.cell_bytes = self.draft_cell_bytes
        target_rng, draft_rng = (np.random.default_rng(x) for x in np.random.SeedSequence(s.seed).spawn(2))
        text = _Text(self.target, stop)
        history = list(prompt)
        out: list[int] = []
        reason: StopReason | None = None
        message: str | None = None
        strategy = self._strategy(mode, s, draft_rng, meter, cancel.is_set, cfg)
        shadow = self._shadow(prompt, cfg, cancel) if pilot is not None and pilot.prefill_draft else None
        try:
            while reason is None:
                if cancel.is_set():
                    reason = "cancelled"
                    break
                room = cfg.n_ctx - len(history)  # the target's KV will hold history + draft
                if room < 1:
                    reason, message = "context", f"the context of {cfg.n_ctx} tokens is full"
                    break
                k = max(0, min(k_max, room - 1, max_tokens - len(out) - 1))
                t_round = time.perf_counter()
                if pilot is not None:
                    pilot.round_start(history)
                prop = strategy.propose(history, k) if k > 0 else Proposal(EMPTY, "none", None)
                draft = prop.draft if len(prop.draft) >= max(cfg.spec.k_min, 1) else EMPTY
                t_verify = time.perf_counter()
                strategy.verifying(history, draft, k_max)
                rows = self.target_kv.feed(history + list(draft.tokens), len(draft) + 1, cancel.is_set)
                verify_s = time.perf_counter() - t_verify
                meter.target_busy.add(verify_s)
                if not draft.tokens and len(history) > len(prompt):  # a plain step (not the prompt's prefill)
                    self._step_ms.setdefault(cfg.target.threads, Ema(None)).add(verify_s * 1e3)
                if s.greedy:
                    a, b = verify_greedy(draft.tokens, rows.argmax(axis=1))
                else:
                    a, b = verify_sampled(draft.tokens, draft.q, probs(rows, s), target_rng)
                meter.first_token()
                kind = PROVENANCE[prop.speculator if len(draft) else "none"]
                new, prov = [], []
                for t, pv in zip([*draft.tokens[:a], b], [kind] * a + ["target"]):
                    if self.target.is_eog(t):
                        reason = "eos"
                        break
                    new.append(t)
                    prov.append(pv)
                    text.push(t)
                    if text.stopped:
                        reason = "stop"
                        break
                    if len(out) + len(new) >= max_tokens:
                        reason = "length"
                        break
                if pilot is not None:
                    pilot.target_confidence(top1(rows[:a + 1], s))
                    if shadow is not None and (guess := shadow.guess(len(history))) is not None:
                        pilot.draft_guessed(guess == (draft.tokens[0] if a else b))
                history.extend([*draft.tokens[:a], b])
                if shadow is not None:
                    shadow.push(history)
                out.extend(new)
                wall_ms = (time.perf_counter() - t_round) * 1e3
                rnd = Round(len(meter.rounds), strategy.state if mode == "ssd" else mode, prop.speculator
                            if len(draft) else "none", prop.prespec, len(draft), a, wall_ms, verify_s * 1e3,
                            (t_verify - t_round) * 1e3)
                strategy.observe(prop, a, verify_s, t_verify - t_round, wall_ms / max(1, a + 1))
                meter.record(rnd, len(new))
                switch = pilot is not None and pilot.round_end(rnd, history, max_tokens - len(out)) is not None
                if shadow is not None and not switch and not pilot.watching:  # the watch chose to stay in ar:
                    shadow.stop()                                            # the target decodes alone again
                    pilot.draft_read(len(self.draft_kv.tokens))
                    shadow = None
                if switch and reason is None:
                    if shadow is not None:
                        pilot.draft_read(shadow.settle())
                        shadow = None
                    self._end_strategy(strategy)
                    cfg, mode = pilot.run_config, pilot.choice.mode
                    k_max = cfg.spec.k if mode != "ar" else 0
                    self._set_threads(cfg)
                    strategy = self._strategy(mode, s, draft_rng, meter, cancel.is_set, cfg)
                    meter.state = mode
                yield TokenEvent(text.take(), tuple(new), tuple(prov), rnd, meter.live())
        except Cancelled:
            reason = "cancelled"
        except ContextFullError as e:
            reason, message = "context", str(e)
        finally:
            if shadow is not None:
                shadow.stop()
            self._end_strategy(strategy)
        tail = text.finish()
        stats = meter.summary()
        if pilot is not None:
            stats["auto"] = pilot.report()
        yield FinishEvent(text.text, tuple(out), reason or "length", stats, message, tail)

    def _shadow(self, prompt: list[int], cfg: EngineConfig, cancel: threading.Event) -> _Shadow | None:
        """The draft reading along beside the target (_Shadow), where the two fit on the cores side by side."""
        if self.draft_kv is None or cfg.draft is None or cfg.target.threads + cfg.draft.threads > usable_cores():
            return None
        return _Shadow(self.draft_kv, prompt, cancel)

    def _verify_curve(self, threads: int) -> list[float] | None:
        """The profile's ms for a target decode of 1, 2, ... tokens at `threads`, if calibrated."""
        prof = self.auto_profile() if self.draft is not None else None
        costs = [c for c in prof.costs if c.target_threads == threads] if prof is not None else []
        return list(costs[0].target_ms) if costs else None

    def _plain_step_ms(self, threads: int) -> float | None:
        """One target step's cost at `threads`: as timed in earlier rounds, else from the profile."""
        if threads in self._step_ms:
            return self._step_ms[threads].value
        curve = self._verify_curve(threads)
        return curve[0] if curve else None

    def _end_strategy(self, strategy: _Plain) -> None:
        strategy.close()
        if self._worker is not None:  # the worker may have moved the draft's main sequence
            self.draft_kv = self._worker.drafter.kv
            self._worker = None

    def close(self) -> None:
        for obj in (self.draft_ctx, self.target_ctx, self.draft, self.target):
            if obj is not None:
                obj.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
