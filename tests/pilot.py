"""A fake Engine and Pilot helpers for the TUI tests: no model, a scripted reply, and the real
event types (TokenEvent, Round, LiveStats, FinishEvent). Its figures are
computed from the script, not from a clock, so screenshots are stable.

Rounds cycle through the speculators: a pre-speculation hit (2 tokens
accepted), an accepted draft (1), an n-gram backup (1), each ending with the
target's own token, so every provenance shows up."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from ssd_edge.interface import ModelInfo
from ssd_edge.config import EngineConfig
from ssd_edge.events import FinishEvent, LiveStats, Round, TokenEvent
from tui.app import SSDEdgeApp
from tui.widgets.chat import PromptInput

REPLY = ("Speculative decoding lets a small draft model propose tokens that the target verifies "
         "in one batch. SSD goes further: while the target verifies, the draft already prepares "
         "the next round for the likely outcomes.")
PATTERN = [("prespec", 2, "hit", 120.0), ("draft", 1, "miss", 260.0), ("ngram", 1, "miss", 200.0)]


class FakeModel:
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


class FakeEngine:
    def __init__(self, config: EngineConfig, reply: str = REPLY, *, fail: Exception | None = None,
                 fail_after: int | None = None, gate: threading.Event | None = None) -> None:
        self.config = config
        self.reply = reply
        self.fail, self.fail_after, self.gate = fail, fail_after, gate
        self.target = FakeModel("fake-target", 30)
        self.draft = FakeModel("fake-draft", 24) if config.draft is not None else None
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

    def generate(self, prompt: str | None = None, *, messages: Any = None, max_tokens: int = 256,
                 cancel: threading.Event | None = None, **_: Any):
        self.requests.append(list(messages or []))
        if self.fail is not None and self.fail_after is None:
            raise self.fail
        cancel = cancel or threading.Event()
        tokens = self.target.encode(self.reply)
        tokens = tokens[:max_tokens]
        out: list[int] = []
        drafted = accepted = hits = lookups = 0
        wall = 0.0
        reason, i, rnd = "eos" if len(tokens) < max_tokens else "length", 0, 0
        while i < len(tokens):
            if cancel.is_set():
                reason = "cancelled"
                break
            if self.fail_after is not None and rnd == self.fail_after:
                raise self.fail
            kind, a, outcome, wall_ms = PATTERN[rnd % len(PATTERN)]
            new = tokens[i:i + a + 1]
            prov = tuple([kind] * (len(new) - 1) + ["target"])
            drafted += 3
            accepted += len(new) - 1
            lookups += 1
            hits += outcome == "hit"
            wall += wall_ms
            out += new
            r = Round(rnd, "ssd", kind, outcome, 3, len(new) - 1, wall_ms, wall_ms * 0.8, 0.0)
            live = LiveStats(tokens=len(out), tokens_per_s=1e3 * len(out) / wall, acceptance=accepted / drafted,
                             hit_rate=hits / lookups, draft_util=0.55, target_util=0.85,
                             branch_cells=8 * (rnd % 4), budget_cells=64, mode=self.config.mode,
                             state=["ssd", "ssd", "backup"][rnd % 3])
            yield TokenEvent(b"".join(self.target.piece(t) for t in new).decode(), tuple(new), prov, r, live)
            i += len(new)
            rnd += 1
            if self.gate is not None:  # a test holds the stream here until it has looked
                while not self.gate.wait(0.01) and not cancel.is_set():
                    pass
        text = b"".join(self.target.piece(t) for t in out).decode()
        stats = {"mode": self.config.mode, "tokens": len(out), "rounds": rnd,
                 "tokens_per_s": 1e3 * len(out) / wall if wall else 0.0, "acceptance_rate": accepted / drafted,
                 "latency_ms_p50": 100.0,
                 "prespec": {"hit_rate": hits / lookups, "latency_ms_hit_p50": 40.0, "latency_ms_miss_p50": 180.0}}
        yield FinishEvent(text, tuple(out), reason, stats, None, "")

    def close(self) -> None:
        self.closed = True


def factory(**kwargs: Any):
    """An engine_factory that builds FakeEngines and remembers the last one."""
    def make(config: EngineConfig, models_dir: str | None) -> FakeEngine:
        make.engine = FakeEngine(config, **kwargs)
        return make.engine

    make.engine = None
    return make


# ---------------------------------------------------------------- pilot helpers

CLOCK = 1_700_000_000.0
SIZE = (140, 44)


def config(**kw) -> EngineConfig:
    return EngineConfig.build(**{"target": dict(path="fake-target.gguf"), "draft": dict(path="fake-draft.gguf"),
                                 "mode": "ssd", **kw})


def make_app(engine_factory=None, **kw) -> SSDEdgeApp:
    return SSDEdgeApp(kw.pop("cfg", None) or config(), engine_factory=engine_factory or factory(),
                      clock=lambda: CLOCK, **kw)


async def wait_for(pilot, condition, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        if loop.time() > end:
            raise AssertionError("condition not reached")
        await pilot.pause(0.02)


async def press_button(pilot, selector: str) -> None:
    """Press a dialog button (not a click: a notification toast may lie over it)."""
    pilot.app.screen.query_one(selector).press()
    await pilot.pause()


async def send(pilot, app: SSDEdgeApp, text: str, finish: bool = True) -> None:
    await wait_for(pilot, lambda: app.phase == "ready")
    app.query_one(PromptInput).value = text
    await pilot.press("enter")
    if finish:
        await wait_for(pilot, lambda: app.phase == "ready")
