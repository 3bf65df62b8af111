"""tests/native_build.py: a test that needs ssd_edge.native skips only where no C compiler could have
built it; where one could, the missing extension is a failure."""

from __future__ import annotations

import shutil

import pytest

import native_build


def test_without_a_c_compiler_a_missing_extension_is_a_skip(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert native_build.c_compiler() is None
    with pytest.raises(pytest.skip.Exception, match="no C compiler"):
        native_build.skip_or_fail("the compiled pass")


def test_with_a_c_compiler_a_missing_extension_is_a_failure(monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/cc" if name == "cc" else None)
    assert native_build.c_compiler() == "/usr/bin/cc"
    with pytest.raises(pytest.fail.Exception, match=r"the compiled pass is not built .*/usr/bin/cc.*build_ext"):
        native_build.skip_or_fail("the compiled pass")
