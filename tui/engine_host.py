"""The engine's life in the app: build it in a worker (with load progress),
offer to pull models that are not downloaded yet, switch models, and change
settings between replies. A mixin of SSDEdgeApp (tui/app.py)."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from textual.widgets import ProgressBar

from ssd_edge.config import EngineConfig, ModelConfig
from ssd_edge.errors import ConfigError

from .loader import load_engine, missing_models, model_label, pull_models
from .messages import EngineFailed, EngineLoaded, PullFinished, PullProgress
from .screens import MissingModelsScreen
from .widgets.panel import LivePanel

if TYPE_CHECKING:  # pragma: no cover
    from .app import SSDEdgeApp


class EngineHost:
    def start_load(self: "SSDEdgeApp", config: EngineConfig, old_engine: Any = None) -> None:
        self.phase, self.config, self._load_started = "loading", config, self.clock()
        self.sub_title = model_label(config)
        panel = self.query_one(LivePanel)
        panel.show_models(None, config, "loading…")
        panel.show_settings(config, self.live)
        self.set_status(f"Loading {model_label(config)}…")
        bar = self.query_one("#progress", ProgressBar)
        bar.update(total=None)
        bar.display = True

        def body() -> None:
            if old_engine is not None:
                old_engine.close()
            load_engine(self.engine_factory, config, self.models_dir, self.post_message)

        self.jobs["load"] = self.run_worker(body, thread=True, group="engine", exit_on_error=False)

    def _tick(self: "SSDEdgeApp") -> None:
        if self.phase == "loading":
            self.set_status(f"Loading {model_label(self.config)}… {self.clock() - self._load_started:.0f} s")

    def on_engine_loaded(self: "SSDEdgeApp", msg: EngineLoaded) -> None:
        self.engine, self.phase, self.fallback = msg.engine, "ready", None
        self.config = getattr(msg.engine, "config", self.config)
        self.query_one("#progress").display = False
        panel = self.query_one(LivePanel)
        panel.show_models(self.engine.model_info, self.config)
        panel.show_settings(self.config, self.live)
        self.set_status(f"Ready · {self.config.mode} · loaded in {self.clock() - self._load_started:.0f} s")

    def on_engine_failed(self: "SSDEdgeApp", msg: EngineFailed) -> None:
        self.phase, self.exit_code = "failed", msg.exit_code
        self.query_one("#progress").display = False
        self.query_one(LivePanel).show_models(None, self.config, "not loaded")
        if msg.missing:
            self.set_status("Models are missing: pull them, or pick others (F6)", error=True)
            self.push_screen(MissingModelsScreen(msg.missing, msg.error, self.fallback is not None),
                             partial(self._missing_choice, msg.missing))
        elif self.fallback is not None:
            self.notify(msg.error, title="Could not load the models; back to the previous ones", severity="error",
                        timeout=10)
            config, self.fallback = self.fallback, None
            self.start_load(config)
        else:
            self.set_status(f"{msg.error}  ·  F6 picks other models · Ctrl+Q quits", error=True)

    def _missing_choice(self: "SSDEdgeApp", models: list, choice: str | None) -> None:
        if choice == "pull":
            self.start_pull(models)
        elif choice == "pick":
            self.action_pick_models()
        elif choice == "back" and self.fallback is not None:
            config, self.fallback = self.fallback, None
            self.start_load(config)
        else:
            self.exit(return_code=self.exit_code)

    def start_pull(self: "SSDEdgeApp", models: list) -> None:
        self.phase = "pulling"
        bar = self.query_one("#progress", ProgressBar)
        bar.update(total=sum(m.size for m in models), progress=0)
        bar.display = True
        self.set_status("Pulling " + ", ".join(m.name for m in models) + "…")
        body = partial(pull_models, models, self.models_dir, self.pull, self.pull_cancel, self.post_message)
        self.jobs["pull"] = self.run_worker(body, thread=True, group="pull", exit_on_error=False)

    def on_pull_progress(self: "SSDEdgeApp", msg: PullProgress) -> None:
        self.query_one("#progress", ProgressBar).update(total=msg.total, progress=msg.done)
        self.set_status(f"{msg.label}  ·  {msg.done / 1e9:.2f} / {msg.total / 1e9:.2f} GB")

    def on_pull_finished(self: "SSDEdgeApp", msg: PullFinished) -> None:
        self.query_one("#progress").display = False
        missing = missing_models(self.config, self.models_dir)
        if msg.error or missing:
            self.phase = "failed"
            error = msg.error or "the pull ended but models are still missing"
            self.set_status(error, error=True)
            self.push_screen(MissingModelsScreen(missing, error, self.fallback is not None),
                             partial(self._missing_choice, missing))
        else:
            self.start_load(self.config)

    def switch_models(self: "SSDEdgeApp", target: str, draft: str | None) -> None:
        """Rebuild the engine on other models (the chat stays)."""
        cfg = self.config
        t = cfg.target.model_copy(update={"path": target})
        d = None
        if draft is not None:
            d = (cfg.draft or ModelConfig(path=draft, threads=cfg.target.threads)).model_copy(update={"path": draft})
        mode = cfg.mode if d is not None or cfg.mode not in ("sd", "ssd") else "lookup"
        if mode != cfg.mode:
            self.notify(f"no draft model: mode {cfg.mode} -> {mode}")
        old, self.engine = self.engine, None
        self.fallback = cfg if old is not None else None
        self.start_load(cfg.model_copy(update={"target": t, "draft": d, "mode": mode}), old_engine=old)

    def configure(self: "SSDEdgeApp", changes: dict[str, Any]) -> str | None:
        """Apply mode / k / temperature / max tokens; an error line, or None when applied (or queued)."""
        changes = dict(changes)
        max_tokens = changes.pop("max_tokens", self.max_tokens)
        if max_tokens < 1:
            return "max tokens must be at least 1"
        if self.engine is None:
            return "no model is loaded yet"
        if self.phase == "generating":
            self.pending.update(changes, max_tokens=max_tokens)
            self.notify("applies when this reply ends")
            return None
        try:
            self.config = self.engine.configure(**changes)
        except ConfigError as e:
            return str(e)
        self.max_tokens = max_tokens
        self.query_one(LivePanel).show_settings(self.config, self.live)
        self.set_status(f"Ready · {self.config.mode} · k {self.config.spec.k} · "
                        f"temperature {self.config.sampling.temperature:g}")
        return None
