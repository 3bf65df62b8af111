"""Building the engine and pulling missing models, off the UI thread.

The engine factories (the default one, and one that measures the device the
first time mode auto meets a pair) run in the load worker. load_engine and
pull_models are worker bodies: they block, and report only by posting
messages (`post`), so the UI can show progress and turn failures into
friendly states instead of tracebacks.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable

from textual.message import Message

from ssd_edge.config import EngineConfig
from ssd_edge.errors import ModelNotFoundError, SSDEdgeError
from ssd_edge.models.catalog import CatalogModel, load_catalog, model_path

from .messages import EngineFailed, EngineLoaded, PullFinished, PullProgress
from .stream import describe_error

log = logging.getLogger(__name__)

EngineFactory = Callable[[EngineConfig, "str | None"], Any]
Post = Callable[[Message], Any]


def default_engine_factory(config: EngineConfig, models_dir: str | None) -> Any:
    from ssd_edge.engine import Engine  # imported here: loading llama.cpp is the worker's job

    return Engine(config, models_dir=models_dir)


def calibrating_engine_factory(config: EngineConfig, models_dir: str | None) -> Any:
    """The default factory, and the first time mode auto meets the pair on this device, its
    measurement (a longer "loading…"; `ssd-edge calibrate` shows the details)."""
    engine = default_engine_factory(config, models_dir)
    if not engine.plans_with_profile:
        return engine
    from ssd_edge.bench.calibrate import calibrate_first_use, needs_first_use

    try:
        if needs_first_use(engine):
            log.info("first use of this pair on this device: calibrating for mode auto")
            calibrate_first_use(engine)
    except BaseException:
        engine.close()
        raise
    return engine


class PullCancelled(Exception):
    """Raised from the progress callback to stop a pull (the app is quitting)."""


def missing_models(config: EngineConfig, models_dir: str | None) -> list[CatalogModel]:
    """Catalog models named by the config whose files are not downloaded yet."""
    try:
        catalog = load_catalog()
    except (OSError, ValueError) as e:
        log.warning("cannot read the catalog: %s", e)
        return []
    names = set(catalog.names())
    out = []
    for mc in (config.target, config.draft):
        if mc is not None and mc.path in names:
            model = catalog.get(mc.path)
            if model not in out and not model_path(model, Path(models_dir) if models_dir else None).exists():
                out.append(model)
    return out


def model_label(config: EngineConfig) -> str:
    names = [Path(mc.path).name for mc in (config.target, config.draft) if mc is not None]
    return " + ".join(names)


def load_engine(factory: EngineFactory, config: EngineConfig, models_dir: str | None, post: Post) -> None:
    try:
        engine = factory(config, models_dir)
    except ModelNotFoundError as e:
        post(EngineFailed(str(e), e.exit_code, missing_models(config, models_dir)))
    except SSDEdgeError as e:
        post(EngineFailed(str(e), e.exit_code, []))
    except Exception as e:  # llama.cpp or the OS: still a line in the UI, with the traceback in the log
        log.exception("engine load failed")
        post(EngineFailed(describe_error(e), 1, []))
    else:
        post(EngineLoaded(engine))


def pull_models(models: list[CatalogModel], models_dir: str | None, pull: Callable[..., Any],
                cancel: threading.Event, post: Post) -> None:
    total = sum(m.size for m in models)
    done = 0

    def progress(label: str, nbytes: int) -> None:
        nonlocal done
        if cancel.is_set():
            raise PullCancelled()
        done += nbytes
        post(PullProgress(label, done, total))

    try:
        before = 0
        for model in models:
            pull(model, Path(models_dir) if models_dir else None, progress=progress)
            before += model.size
            done = before  # a model already there (verified) reports no bytes
            post(PullProgress(f"{model.name}: done", done, total))
    except PullCancelled:
        post(PullFinished("pull cancelled; nothing half-written was kept"))
    except SSDEdgeError as e:
        post(PullFinished(str(e)))
    except Exception as e:
        log.exception("pull failed")
        post(PullFinished(describe_error(e)))
    else:
        post(PullFinished(None))
