"""The engine: a loaded pair (pair.py) that runs generations, round by round: plan -> propose ->
verify -> commit -> observe, over one Generation (generation.py).

    for event in engine.generate("def fib(n):", max_tokens=64):
        print(event.text, end="")

Modes:  ar      the target alone, one token per step
        sd      the draft model drafts k tokens, the target verifies them in one batch
        lookup  the n-gram drafter (no model) drafts, the target verifies
        ssd     sd, plus pre-speculation of the next round while the target verifies (speculation/prespec/)
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
from typing import Any, Iterator, Sequence

from .config import EngineConfig, SamplingConfig
from .coupling import Draws, fresh_seed
from .errors import ConfigError, ContextFullError
from .events import FinishEvent, Round, Stats, StopReason, TokenEvent, TokenLogprob
from .generation import Generation
from .llama.kvseq import Cancelled, KVSeq
from .metrics import Ema, Meter
from .pair import Pair
from .planning import rounds as planned
from .sampling import native_path
from .stops import StopRule
from .structured.constraint import Constraint, compile as compile_constraint
from .structured.calls import Tools
from .structured.rows import TOP_LOGPROBS_MAX
from .structured.shaping import Shaping
from .verify import verify

log = logging.getLogger(__name__)

Event = TokenEvent | FinishEvent
PROVENANCE = {"none": "target", "draft": "draft", "prespec": "prespec", "ngram": "ngram", "grammar": "grammar"}


@dataclass(frozen=True)
class Completion:
    text: str
    tokens: tuple[int, ...]
    stop_reason: StopReason
    stats: Stats
    logprobs: tuple[TokenLogprob, ...] | None = None
    tool_calls: tuple[dict[str, Any], ...] | None = None  # under constraint=Tools(...): the calls (OpenAI's form)


class Engine(Pair):
    """A loaded pair (pair.py: the models, their contexts, load and release, what the faces ask of
    them) that runs one generation at a time."""

    def __init__(self, config: EngineConfig, *, models_dir: str | None = None, profiles: bool = True) -> None:
        """profiles=False: the planner never reads this device's calibration profile and plans from what
        each generation times alone (tests that must see the draft paths, whatever a profile says).

        The draft model is loaded only when a generation may use it (load_draft): not for ar or
        lookup, and not for auto where this device's profile says no draft could beat plain steps
        (a compute-bound CPU), so those run in the target's memory alone. A mode that needs it later
        loads it first, between generations (Stats.draft_load_s)."""
        super().__init__(config, models_dir)
        self._profile_looked_up = not profiles
        try:
            if self.uses_draft(self.config.mode):
                self.load_draft()
        except BaseException:
            self.close()
            raise

    def _attach(self, config: EngineConfig, target: Any, target_ctx: Any) -> None:
        super()._attach(config, target, target_ctx)
        self.profile = None  # this device's calibration profile (planning/profile.py); loaded on first use
        self._profile_looked_up = False
        self._step_ms: dict[int, Ema] = {}  # target threads -> ms of a plain target step, over generations
        self._trees: dict[str, Any] = {}  # mode -> its TreeChoice: whether SSD's tree pays here, over generations
        self.thread_choice = planned.ThreadChoice()  # the target's threads for plain steps, by live timings

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


    @property
    def plans_with_profile(self) -> bool:
        """Whether the configured mode prices its rounds with this device's calibration profile: auto
        with a draft model (`ssd-edge calibrate`, or the measuring on first use), the target on this
        device (a profile measures a target here, not one across --rpc servers)."""
        return self.has_draft and self.config.mode == "auto" and not self.config.target.rpc


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
                tools = kwargs.get("constraint")
                if isinstance(tools, Tools):  # the text is the answer's content, the calls apart
                    content, calls = tools.read(ev.text, self.chat_template())
                    return Completion(content, ev.tokens, ev.stop_reason, ev.stats, ev.logprobs, tuple(calls))
                return Completion(ev.text, ev.tokens, ev.stop_reason, ev.stats, ev.logprobs)
        raise AssertionError("generate() ended without a FinishEvent")  # pragma: no cover

    def generate(self, prompt: str | None = None, *, messages: Sequence[dict[str, str]] | None = None,
                 tokens: Sequence[int] | None = None, max_tokens: int = 256, mode: str | None = None,
                 stop: Sequence[str | StopRule] = (), cancel: threading.Event | None = None,
                 sampling: SamplingConfig | None = None, constraint: Constraint | None = None,
                 logprobs: int | None = None) -> Iterator[Event]:
        """Yield a TokenEvent per round as tokens are committed, then one FinishEvent.

        constraint: what the answer must look like (structured.JsonSchema, JsonObject, Regex, Grammar, or
        Tools: OpenAI's tools, rendered into the chat's prompt, the answer held to tool_choice's calls);
        every mode then gives mode ar's tokens under it. logprobs: each kept token's log-probability and
        that many alternatives (0..20; TokenEvent.logprobs, FinishEvent.logprobs). A constraint that does
        not compile raises ConstraintError here, before anything runs."""
        if max_tokens < 1:
            raise ConfigError("max_tokens must be at least 1")
        if logprobs is not None and not 0 <= logprobs <= TOP_LOGPROBS_MAX:
            raise ConfigError(f"logprobs is from 0 to {TOP_LOGPROBS_MAX} alternatives, not {logprobs}")
        if isinstance(constraint, Tools):  # the tools go into the chat's prompt, the call grammar onto the answer
            if messages is None:
                raise ConfigError("tools need chat messages: their prompt is the model's chat template with the tools")
            offered = list(constraint.tools) if constraint.offered else None
            tokens = self.tokenize(self.render_chat(messages, offered), parse_special=True)
            constraint = constraint.grammar(self.chat_template())
        compiled = compile_constraint(constraint, self.grammar_tokenizer()) if constraint is not None else None
        prompt_ids = list(tokens) if tokens is not None else self.prompt_tokens(prompt, messages)
        self.check_prompt(prompt_ids)
        mode = mode or self.config.mode
        if mode in ("sd", "ssd") and not self.has_draft:
            raise ConfigError(f"mode '{mode}' needs a draft model (-md)")
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this engine is already generating; one generation at a time")
        try:
            loaded_s = self.load_draft() if self.draft is None and self.uses_draft(mode) else None
            s = sampling or self.config.sampling
            shaping = Shaping(s, compiled, self.grammar_tokenizer() if compiled else None, self.target.is_eog,
                              self.target)
            yield from self._run(prompt_ids, max_tokens, mode, stop, cancel or threading.Event(), shaping.draws(s),
                                 loaded_s, shaping, logprobs)
        finally:
            self._lock.release()

    def _rounds(self, mode: str, cfg: EngineConfig, gen: Generation) -> planned.Rounds:
        """The generation's planner and proposers, priced by the profile and earlier generations."""
        step = self._step_ms.get(cfg.target.threads)
        return planned.build(mode, cfg, gen.sampling, gen.seed, gen.meter, gen.cancel.is_set, draft_kv=self.draft_kv,
                             n_draft_seqs=self.n_draft_seqs, step_ms=step.value if step is not None else None,
                             profile=self.auto_profile() if mode in ("ssd", "auto") and self.has_draft else None,
                             shaping=gen.shaping, n_prompt=gen.n_prompt, tree=self._tree(mode), target=self.target_kv.ctx,
                             target_info=self.model_info[0])

    def _tree(self, mode: str) -> Any:
        """The mode's TreeChoice (speculation/policy.py), kept over generations; None where nothing
        pre-speculates (so a mode without speculation imports none of it)."""
        if mode not in ("ssd", "auto"):
            return None
        from .speculation.policy import TreeChoice

        return self._trees.setdefault(mode, TreeChoice())

    def _run(self, prompt: list[int], max_tokens: int, mode: str, stop: Sequence[str | StopRule], cancel: threading.Event,
             s: SamplingConfig, draft_load_s: float | None = None, shaping: Shaping | None = None,
             logprobs: int | None = None) -> Iterator[Event]:
        """One generation; draft_load_s: the draft model was loaded for it first, in that many seconds."""
        cfg = self.config
        if cfg.threads_follow_mode:
            cfg = planned.threads_for(mode, cfg, self.has_draft, self.auto_profile() if mode == "auto" else None)
        self.use_threads(cfg.target.threads, cfg.draft.threads if cfg.draft is not None else None)
        live = planned.live_threads(self.thread_choice, mode, cfg, self.draft is not None, self.use_threads)
        at = live.now
        meter = Meter(mode, planned.caps(mode, cfg.spec.k)[0], cfg.prespec.budget_cells if mode in ("ssd", "auto") else 0)
        meter.n_prompt, meter.cell_bytes, meter.state = len(prompt), self.draft_cell_bytes, mode
        gen = Generation(self.target, prompt, max_tokens, cfg.n_ctx, stop, cancel, s,
                         s.seed if s.seed is not None else fresh_seed(), meter,
                         self._step_ms.setdefault(cfg.target.threads, Ema(None)), shaping, logprobs)
        rounds = self._rounds(mode, cfg, gen)
        try:
            while gen.can_go_on():
                t_round = time.perf_counter()
                remaining = gen.remaining
                prop = rounds.propose(gen.history, min(gen.room, remaining) - 1, remaining)
                alone = not prop.draft.tokens and len(gen.history) > gen.n_prompt and (prop.run_s or rounds.worker is None)
                at = live.before(plain=bool(alone), turns=rounds.prompt_alone) if live.choice else at
                done = _plain_run(self.target_kv, gen, prop, t_round, at) if prop.run_s else None
                if done is None:  # a round verified the usual way (a plain run the target cannot make: no more)
                    rounds.runs = rounds.runs and not prop.run_s
                    done = _verify_round(self.target_kv, gen, rounds, prop, t_round, at)
                rnd, kept = done
                if live.choice and rnd.index and not rnd.drafted and not rounds.busy:  # plain steps after the prompt's
                    live.after(at, rnd.steps, rnd.verify_ms)
                meter.state = rounds.state
                yield gen.event(rnd, kept)
        except Cancelled:
            gen.reason = "cancelled"
        except ContextFullError as e:
            gen.reason, gen.message = "context", str(e)
        finally:
            if not rounds.close():
                self.abandon_draft()
        yield gen.finish(meter.stats(seed=None if s.greedy else gen.seed, auto=rounds.report(),
                                     draft_load_s=draft_load_s, memory=self.memory().to_dict(),
                                     devices=self.devices(), native=native_path()))


# The target's rounds over a generation, as Engine._run runs them: a proposal verified in one batch, or
# plain steps in one call of the target's context. Each returns the round as data (events.Round), run at
# `threads` where the engine set them, and the tokens the answer keeps.

def _verify_round(target_kv: KVSeq, gen: Generation, rounds: planned.Rounds, prop: planned.Proposal, t_round: float,
                  threads: tuple[int, int | None] | None) -> tuple[Round, list[int]]:
    """The target verifies the proposal's draft after the history in one batch: its draws (argmax,
    or coupled Gumbel-max over each row's candidates when sampling: coupling.py) are made as
    verify() reads them, and a drafted token is accepted iff it equals the draw at its position."""
    draft, history, meter = prop.draft, gen.history, gen.meter
    rounds.verifying(history, draft)  # (the planning for the worker is the round's, not the verify's time)
    t_verify = time.perf_counter()
    if gen.rows is not None:
        gen.rows.round(draft.tokens)  # its rows follow the history, then the draft
    rows = target_kv.feed(history + list(draft.tokens), len(draft) + 1, gen.cancel.is_set)
    verify_s = time.perf_counter() - t_verify
    meter.target_busy_s += verify_s
    if not draft.tokens and len(history) > gen.n_prompt and not rounds.busy:  # a plain step, after the prompt, alone
        gen.step_ms.add(verify_s * 1e3)
    a, b = verify(draft.tokens, Draws(rows, gen.drawer, len(history)))
    meter.first_token()
    tokens = (*draft.tokens[:a], b)
    kept = gen.commit(tokens)
    wall_ms = (time.perf_counter() - t_round) * 1e3
    rounds.observe(prop, history, a, verify_s, wall_ms / (a + 1), rows[:a + 1])
    f = min(prop.forced, a)  # accepted tokens a grammar forced: the draft's first
    return Round(len(meter.rounds), rounds.served, prop.speculator, prop.prespec, len(draft), a, wall_ms,
                 verify_s * 1e3, (t_verify - t_round) * 1e3, tokens,
                 ("grammar",) * f + (PROVENANCE.get(prop.speculator, prop.speculator),) * (a - f) + ("target",),
                 beside=rounds.beside, threads=threads), kept


def _plain_run(target_kv: KVSeq, gen: Generation, prop: planned.Proposal, t_round: float,
               threads: tuple[int, int | None] | None) -> tuple[Round, list[int]] | None:
    """Plain steps after the history in one call of the target's context, for about prop.run_s
    (KVSeq.steps), at most the room the context and the answer leave; as one round of as many
    steps as the answer took (to the one that ended it: an end of generation is drawn, not kept;
    steps past a stop string ran, and are the history's to forget). None where the context cannot.
    The tokens are the rounds' own: the same draws from the same rows (native.steps is
    coupling.Drawer's C path; tests hold the two equal)."""
    if gen.rows is not None:
        gen.rows.round()  # the C loop hands its row hook each token it draws
    got = target_kv.steps(gen.history, min(gen.room, gen.remaining), prop.run_s, gen.drawer)
    if got is None:
        return None
    drawn, in_decode_s = got
    n = len(drawn)
    gen.meter.target_busy_s += in_decode_s
    gen.step_ms.add(in_decode_s * 1e3 / n)
    kept = gen.commit(drawn)
    made = min(n, len(kept) + (gen.reason == "eos"))
    return Round(len(gen.meter.rounds), "ar", "none", None, 0, 0, (time.perf_counter() - t_round) * 1e3,
                 in_decode_s * 1e3, 0.0, tuple(drawn), ("target",) * n, made, threads=threads), kept
