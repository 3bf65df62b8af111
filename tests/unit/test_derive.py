"""Derived drafts (`ssd-edge models derive-draft`): names, where the files go, the default draft,
and one real requantization whose result loads and drafts the target's greedy tokens."""

from __future__ import annotations

import json
import shutil

import pytest

from ssd_edge.errors import ModelNotFoundError
from ssd_edge.models import catalog, derive


def test_variant_names_split_and_resolve(tmp_path):
    assert catalog.split_variant("qwen2.5-coder-0.5b:q4_0") == ("qwen2.5-coder-0.5b", "q4_0")
    assert catalog.split_variant("qwen2.5-coder-0.5b") == ("qwen2.5-coder-0.5b", None)
    model = catalog.load_catalog().get("qwen2.5-coder-0.5b")
    path = catalog.derived_path(model, "q4_0", tmp_path)
    assert path.parent == tmp_path and path.name == "qwen2.5-coder-0.5b-instruct-q4_k_m.q4_0.gguf"
    with pytest.raises(ModelNotFoundError, match="models derive qwen2.5-coder-0.5b --type q4_0"):
        catalog.resolve_model("qwen2.5-coder-0.5b:q4_0", tmp_path)
    with pytest.raises(ModelNotFoundError, match="unknown variant 'q9'"):
        catalog.resolve_model("qwen2.5-coder-0.5b:q9", tmp_path)
    path.write_bytes(b"GGUF")
    assert catalog.resolve_model("qwen2.5-coder-0.5b:q4_0", tmp_path) == path


def test_the_default_draft_is_the_derived_variant_once_it_exists(tmp_path):
    cat = catalog.load_catalog()
    assert derive.default_draft(tmp_path) == cat.default_draft
    path = catalog.derived_path(cat.get(cat.default_draft), "q4_0", tmp_path)
    path.write_bytes(b"GGUF")
    assert derive.default_draft(tmp_path) == cat.default_draft  # no provenance: not a finished derive
    derive.provenance_path(path).write_text("{}")
    assert derive.default_draft(tmp_path) == f"{cat.default_draft}:q4_0"


@pytest.mark.real
def test_derive_requantizes_a_pulled_model_and_it_drafts(small_pair, tmp_path):
    """SmolLM2-135M (Q4_1) -> Q4_0 in a scratch models folder: the file loads, its provenance names
    the source, a second call makes nothing, and greedy sd with it as the draft gives ar's tokens."""
    from conftest import make_engine

    cat = catalog.load_catalog()
    src = catalog.model_path(cat.get("smollm2-135m"))
    shutil.copy(src, tmp_path / src.name)
    path, made = derive.derive("smollm2-135m", "q4_0", tmp_path)
    assert made and path.exists() and not list(tmp_path.glob(".*partial"))
    note = json.loads(derive.provenance_path(path).read_text())
    assert note["source"] == "smollm2-135m" and note["type"] == "q4_0" and note["size"] == path.stat().st_size
    assert note["recipe"] == "pure"  # the output layer in Q4_0 too
    assert derive.derive("smollm2-135m", "q4_0", tmp_path) == (path, False)
    del note["recipe"]  # a file an earlier version made (llama.cpp's default mix) is made again
    derive.provenance_path(path).write_text(json.dumps(note))
    assert derive.derive("smollm2-135m", "q4_0", tmp_path) == (path, True)
    eng = make_engine((small_pair[0], path))
    try:
        ar = eng.complete("The capital of France is", max_tokens=16, mode="ar")
        sd = eng.complete("The capital of France is", max_tokens=16, mode="sd")
        assert sd.tokens == ar.tokens and sd.stats.accepted > 0
    finally:
        eng.close()
