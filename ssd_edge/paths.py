"""Where ssd-edge keeps files: model weights, calibration profiles, chat history.

All of it lives under one user cache directory (platformdirs), which the
environment variable SSD_EDGE_HOME overrides; the model folder alone can be
overridden with SSD_EDGE_MODELS or a --models-dir flag."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def home() -> Path:
    env = os.environ.get("SSD_EDGE_HOME")
    return Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("ssd-edge"))


def models_dir(override: str | os.PathLike[str] | None = None) -> Path:
    if override:
        return Path(override).expanduser()
    env = os.environ.get("SSD_EDGE_MODELS")
    return Path(env).expanduser() if env else home() / "models"


def hub_dir(models_override: str | os.PathLike[str] | None = None) -> Path:
    """Models pulled from the Hugging Face Hub, in huggingface_hub's cache layout (models--ORG--REPO/...)."""
    return models_dir(models_override) / "hub"


def profiles_dir() -> Path:
    return home() / "profiles"


def chats_dir() -> Path:
    env = os.environ.get("SSD_EDGE_CHATS")
    return Path(env).expanduser() if env else Path(platformdirs.user_data_dir("ssd-edge")) / "chats"
