"""The scripted engine of the faces' tests (CLI, chat, TUI): no model, the Engine's
surface (config, configure, prompt_tokens, generate, target/draft models, close)
and the real event types (TokenEvent, Round, LiveStats, FinishEvent).

The reply's words (each with its leading space) are its tokens. They come out
in rounds that cycle through a script of Steps; the finish stats are a real
Meter's Stats, with every figure that a clock would give (wall time, speed,
time to first token) computed from the script instead, so screenshots are
stable. Two scripts: PATTERN (the default) shows every provenance: a
pre-speculation hit, an accepted draft, an n-gram backup; ONE_WORD emits a word
per round, all pre-speculation hits, for tests that act between words
(before_token)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, NamedTuple

from ssd_edge.config import EngineConfig
from ssd_edge.errors import ContextFullError
from ssd_edge.events import FinishEvent, LiveStats, Round, TokenEvent
from ssd_edge.interface import ModelInfo
from ssd_edge.memory import MemoryUse
from ssd_edge.metrics import Meter

REPLY = ("Speculative decoding lets a small draft model propose tokens that the target verifies "
         "in one batch. SSD goes further: while the target verifies, the draft already prepares "
         "the next round for the likely outcomes.")


class Step(NamedTuple):
    speculator: str   # who proposed: prespec, draft, ngram
    prespec: str      # the pre-speculation lookup: hit, partial, miss
    drafted: int
    accepted: int
    emitted: int      # words this round emits (the last of them the target's own)
    wall_ms: float


PATTERN = (Step("prespec", "hit", 3, 2, 3, 120.0), Step("draft", "miss", 3, 1, 2, 260.0),
           Step("ngram", "miss", 3, 1, 2, 200.0))
ONE_WORD = (Step("prespec", "hit", 2, 2, 1, 12.0),)
STATES = ("ssd", "ssd", "backup")  # LiveStats.state by round, cycling


def default_config(**kw: Any) -> EngineConfig:
    return EngineConfig.build(**{"target": dict(path="fake-target.gguf"), "draft": dict(path="fake-draft.gguf"),
                                 "mode": "ssd", **kw})


class ScriptedModel:
    """Words as tokens: each encode() adds its words to the vocabulary."""

    def __init__(self, name: str, n_layer: int) -> None:
        self.name, self.n_layer = name, n_layer
        self.vocab: list[bytes] = []
        self.closed = False

    def encode(self, text: str) -> list[int]:
        """Words with their leading space, one token each."""
        out = []
        for i, word in enumerate(text.split(" ")):
            self.vocab.append((" " if i else "").encode() + word.encode())
            out.append(len(self.vocab) - 1)
        return out

    def piece(self, token: int) -> bytes:
        return self.vocab[token]

    def info(self) -> ModelInfo:
        return ModelInfo(path=f"/models/{self.name}.gguf", description=f"{self.name} Q4_K - Medium",
                         n_params=135_000_000, size_bytes=98_000_000, n_vocab=49152, n_layer=self.n_layer,
                         n_ctx_train=8192, gpu_layers=0, kv_bytes_per_cell=30720)

    def close(self) -> None:
        self.closed = True


class ScriptedEngine:
    """An Engine that plays `reply` by `script`.

    fail: raised when generate() starts (or, with fail_after=n, before round n);
    gate: the stream waits on it after each round (a test looks in between);
    before_token(i): runs before the round that starts with word i (may raise or signal).
    The prompt costs one token per word plus 4 per message; a prompt that does not fit
    in n_ctx raises ContextFullError, and an answer that fills it stops with "context".
    """

    def __init__(self, config: EngineConfig | None = None, reply: str = REPLY, *,
                 script: tuple[Step, ...] = PATTERN, fail: Exception | None = None,
                 fail_after: int | None = None, gate: threading.Event | None = None) -> None:
        self.config = config or default_config()
        self.reply, self.script = reply, script
        self.fail, self.fail_after, self.gate = fail, fail_after, gate
        self.before_token: Callable[[int], None] | None = None
        self.target = ScriptedModel("fake-target", 30)
        self.draft = ScriptedModel("fake-draft", 24) if self.config.draft is not None else None
        self.configured: list[dict[str, Any]] = []
        self.requests: list[list[dict[str, str]]] = []
        self.closed = False

    def configure(self, **changes: Any) -> EngineConfig:
        """Like Engine.configure: validated through EngineConfig.build (ConfigError on bad values)."""
        cfg = self.config.model_dump()
        for key, value in changes.items():
            section = "sampling" if key == "temperature" else "spec" if key == "k" else None
            (cfg[section] if section else cfg)[key] = value
        self.config = EngineConfig.build(**cfg)
        self.configured.append(dict(changes))
        return self.config

    def prompt_tokens(self, prompt: str | None = None, messages: Any = None) -> list[int]:
        n = sum(len(m["content"].split()) + 4 for m in messages) if messages is not None else len(prompt.split())
        return list(range(n))

    def cached_prefix(self, tokens: Any) -> int:
        """Like Pair.cached_prefix: a scripted engine keeps no cache."""
        return 0

    def generate(self, prompt: str | None = None, *, messages: Any = None, tokens: Any = None,
                 max_tokens: int = 256, cancel: threading.Event | None = None, **_: Any):
        n_ctx = self.config.n_ctx
        n_prompt = len(tokens) if tokens is not None else len(self.prompt_tokens(prompt, messages))
        if n_prompt >= n_ctx:
            raise ContextFullError(f"the prompt has {n_prompt} tokens and does not fit in the context of "
                                   f"{n_ctx} (raise -c/--ctx-size)")
        self.requests.append(list(messages or []))
        if self.fail is not None and self.fail_after is None:
            raise self.fail
        cancel = cancel or threading.Event()
        words = self.target.encode(self.reply)
        meter = Meter(self.config.mode, self.config.spec.k, 64)
        meter.n_prompt = n_prompt
        out: list[int] = []
        wall = first_wall = 0.0
        reason, message, rnd = "eos", None, 0
        while len(out) < len(words):
            i = len(out)
            if self.before_token:
                self.before_token(i)
            if cancel.is_set():
                reason = "cancelled"
                break
            if n_prompt + i >= n_ctx:
                reason, message = "context", f"the context of {n_ctx} tokens is full"
                break
            if i >= max_tokens:
                reason = "length"
                break
            if self.fail_after is not None and rnd == self.fail_after:
                raise self.fail
            step = self.script[rnd % len(self.script)]
            new = words[i:min(i + step.emitted, len(words), max_tokens, n_ctx - n_prompt)]
            accepted = max(0, step.accepted - (step.emitted - len(new)))  # a round cut short accepted less
            r = Round(rnd, "ssd", step.speculator, step.prespec, step.drafted, accepted, step.wall_ms,
                      step.wall_ms * 0.8, 0.0)
            meter.record(r, len(new))
            out += new
            wall += step.wall_ms
            first_wall = first_wall or step.wall_ms
            live = LiveStats(tokens=len(out), tokens_per_s=1e3 * len(out) / wall, acceptance=meter.acceptance(),
                             hit_rate=meter.hit_rate(), draft_util=0.55, target_util=0.85,
                             branch_cells=8 * (rnd % 4), budget_cells=64, mode=self.config.mode,
                             state=STATES[rnd % len(STATES)])
            drafted_words = min(accepted, len(new))
            prov = tuple([step.speculator] * drafted_words + ["target"] * (len(new) - drafted_words))
            yield TokenEvent(self._text(new), tuple(new), prov, r, live)
            rnd += 1
            if self.gate is not None:  # a test holds the stream here until it has looked
                while not self.gate.wait(0.01) and not cancel.is_set():
                    pass
        stats = meter.stats()
        if wall:  # the clock's figures, from the script
            rate = 1e3 * len(out) / wall
            stats = dataclasses.replace(stats, wall_s=wall / 1e3, ttft_s=first_wall / 1e3, tokens_per_s=rate,
                                        end_to_end_tokens_per_s=rate)
        yield FinishEvent(self._text(out), tuple(out), reason, stats, message, "")

    @property
    def model_info(self) -> tuple[ModelInfo | None, ModelInfo | None]:
        return self.target.info(), self.draft.info() if self.draft is not None else None

    def memory(self) -> MemoryUse:
        """Fixed figures (a 0.1 GB pair at its context), so what the panel shows is stable."""
        mib = 1 << 20
        draft = self.draft is not None
        return MemoryUse(target_weights=100 * mib, draft_weights=60 * mib if draft else 0, target_kv=12 * mib,
                         draft_kv=6 * mib if draft else 0, compute=80 * mib, on_device=0, other=50 * mib,
                         rss=240 * mib)

    def piece(self, token: int) -> bytes:
        return self.target.piece(token)

    def _text(self, tokens: list[int]) -> str:
        return b"".join(self.target.piece(t) for t in tokens).decode()

    def close(self) -> None:
        self.closed = True


def factory(**kwargs: Any):
    """An engine_factory (for the TUI) that builds ScriptedEngines and remembers the last one."""
    def make(config: EngineConfig, models_dir: str | None) -> ScriptedEngine:
        make.engine = ScriptedEngine(config, **kwargs)
        return make.engine

    make.engine = None
    return make
