"""A model path is checked before llama.cpp is loaded: a missing file, a folder or
a file without the GGUF magic is a typed error naming the path, with no
compiled library needed. (Truncated and corrupt GGUF files need llama.cpp:
tests/real/test_backend.py.)"""

from __future__ import annotations

import re

import pytest

from ssd_edge.errors import (CorruptModelError, ModelError, ModelNotFoundError, NotGGUFError, SSDEdgeError,
                             VocabMismatchError)


def _load(path):
    from ssd_edge.llama.backend import Model

    return Model(path)


def test_non_gguf_file(tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("this is not a model\n")
    with pytest.raises(NotGGUFError, match=re.escape(str(bad))):
        _load(bad)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(NotGGUFError, match=re.escape(str(empty))):
        _load(empty)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ModelNotFoundError, match=re.escape(str(tmp_path / "nope.gguf"))):
        _load(tmp_path / "nope.gguf")
    with pytest.raises(ModelNotFoundError, match=f"not a file: {re.escape(str(tmp_path))}"):
        _load(tmp_path)


def test_model_errors_are_typed():
    for cls in (ModelNotFoundError, NotGGUFError, CorruptModelError, VocabMismatchError):
        assert issubclass(cls, ModelError) and issubclass(cls, SSDEdgeError) and cls.exit_code == 3
