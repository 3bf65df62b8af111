"""Where a command's two models come from, settled before anything is loaded.

  - `-hf ORG/REPO[:QUANT]` / `-hfd ...` (llama.cpp's flags) pull the model into the Hub cache,
    or find it there (HF_HUB_OFFLINE=1), and stand for -m / -md with its file;
  - a Hub target without -md/-hfd gets the smallest present draft that fits it, or none, and
    the command says which, once;
  - the pair's vocabularies are compared from the GGUF headers (models/vocab.py): a draft that
    does not fit is refused with one line before either model is loaded.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from .. import paths
from ..errors import ConfigError, ModelNotFoundError
from ..models import catalog, downloads, hub, pairing, vocab
from ..settings import Settings
from .reporting import stderr


def hub_models(model: str | None, model_draft: str | None, hf: str | None, hfd: str | None, no_draft: bool,
               models_dir: Path, err: Console) -> tuple[str | None, str | None]:
    """(-m, -md) once -hf/-hfd are pulled: paths of their files, the default draft of a Hub target
    filled in. Unchanged when neither flag is given."""
    if hf and model:
        raise ConfigError("-m/--model and -hf/--hf-repo both name the target: give one")
    if hfd and model_draft:
        raise ConfigError("-md/--model-draft and -hfd/--hf-repo-draft both name the draft: give one")
    if hfd and no_draft:
        raise ConfigError("-hfd/--hf-repo-draft and --no-draft contradict each other: give one")
    if hf:
        model = str(downloads.pull_hub_one(_hub_name(hf), models_dir, False, None, err).path)
    if hfd:
        model_draft = str(downloads.pull_hub_one(_hub_name(hfd), models_dir, False, None, err).path)
    elif hf and not model_draft and not no_draft:
        drafts = pairing.drafts_for(Path(model), models_dir)  # type: ignore[arg-type]
        if drafts:
            model_draft = str(drafts[0].path)
            err.print(f"draft: {escape(drafts[0].name)}, the smallest draft here that fits {escape(hf)} "
                      f"({drafts[0].size / 1e6:,.0f} MB; -md/-hfd choose another)")
        else:
            err.print(f"no draft here fits {escape(hf)}: running without one (`ssd-edge models pair "
                      f"hf:{escape(hf.removeprefix('hf:'))}` lists drafts that fit, -hfd pulls one)")
    return model, model_draft


def _hub_name(text: str) -> str:
    return text if hub.is_hub_name(text) else hub.PREFIX + text


def check_pair(target: str, draft: str | None, models_dir: Path) -> vocab.Fit | None:
    """Refuse a draft whose vocabulary does not fit the target's (VocabMismatchError, one line),
    reading both headers only. A model not here yet is left to the loader (the TUI offers a pull)."""
    if draft is None:
        return None
    try:
        paths = catalog.resolve_model(target, models_dir), catalog.resolve_model(draft, models_dir)
    except ModelNotFoundError:
        return None
    return vocab.check(*paths)


def with_hub_models(s: Settings) -> Settings:
    """Settings whose -hf/-hfd are pulled (or found in the cache) and stand for -m/-md."""
    if not (s["hf_repo"] or s["hf_repo_draft"]):
        return s
    model, draft = hub_models(s["model"], s["model_draft"], s["hf_repo"], s["hf_repo_draft"], bool(s["no_draft"]),
                              s.models_dir, stderr())
    return replace(s, values={**s.values, "model": model, "model_draft": draft})


def flags_with_hub_models(flags: dict[str, Any]) -> dict[str, Any]:
    """bench and calibrate (their flags only): -hf/-hfd pulled and standing for -m/-md."""
    if not (flags.get("hf_repo") or flags.get("hf_repo_draft")):
        return flags
    model, draft = hub_models(flags["model"], flags["model_draft"], flags["hf_repo"], flags["hf_repo_draft"], False,
                              paths.models_dir(flags["models_dir"]), stderr())
    return {**flags, "model": model, "model_draft": draft}
