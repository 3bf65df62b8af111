"""The vocabulary read from GGUF headers (models/vocab.py) and the Hub file choice (models/hub.py):
the header parser agrees with the gguf package's reader, the fit rule on hand-made token lists,
and llama.cpp's choice of a repo's file for -hf ORG/REPO[:QUANT]."""

from __future__ import annotations

import pytest

import tiny_gguf
from ssd_edge.errors import CorruptModelError, ModelNotFoundError, NotGGUFError, VocabMismatchError
from ssd_edge.models import hub, vocab
from ssd_edge.models.hub import RemoteFile


def test_the_header_parser_reads_what_the_gguf_package_reads(tmp_path):
    import gguf

    path = tiny_gguf.write(tmp_path / "a.gguf", tiny_gguf.tokens(300) + ["é", "\n"], bos=3, eos=4, template="T")
    v = vocab.read(path)
    fields = gguf.GGUFReader(path).fields
    listed = fields["tokenizer.ggml.tokens"]
    assert v.tokens == tuple(bytes(listed.parts[i]) for i in listed.data)
    assert (v.size, v.bos, v.eos, v.tokenizer, v.pre) == (302, 3, 4, "gpt2", "tiny")
    assert v.label() == f"tiny vocabulary of 302 tokens #{v.digest[:8]}"


def test_fit_same_padded_and_mismatched(tmp_path):
    base = tiny_gguf.tokens(1000)
    target = vocab.read(tiny_gguf.write(tmp_path / "t.gguf", base))
    same = vocab.fit(target, vocab.read(tiny_gguf.write(tmp_path / "s.gguf", base, template="other")))
    assert same.kind == "same" and same.notes == ("different chat templates (the target's is used)",)
    padded = vocab.fit(target, vocab.read(tiny_gguf.write(tmp_path / "p.gguf", tiny_gguf.tokens(1000, pad=128))))
    assert padded.kind == "padded" and padded.detail == "same tokens, the draft padded by 128"
    too_far = vocab.fit(target, vocab.read(tiny_gguf.write(tmp_path / "f.gguf", tiny_gguf.tokens(1000, pad=129))))
    assert not too_far.ok and too_far.detail == "the target has 1,000 tokens, the draft 1,129"
    swapped = list(base)
    swapped[7], swapped[8] = swapped[8], swapped[7]
    other = tiny_gguf.write(tmp_path / "o.gguf", swapped)
    with pytest.raises(VocabMismatchError, match=r"^draft o.gguf \(tiny vocabulary of 1,000 tokens #\w{8}\) does not "
                       r"fit target t.gguf \(tiny vocabulary of 1,000 tokens #\w{8}\): "
                       r"token 7 is b'tok7' in the target, b'tok8' in the draft$"):
        vocab.check(tmp_path / "t.gguf", other)
    sp = vocab.fit(target, vocab.read(tiny_gguf.write(tmp_path / "sp.gguf", base, tokenizer="llama")))
    assert not sp.ok and sp.detail == "the target's tokenizer is gpt2, the draft's llama"
    unnamed = vocab.read(tiny_gguf.write(tmp_path / "u.gguf", base, tokenizer="llama", pre="default"))
    assert unnamed.label().startswith("llama vocabulary of 1,000 tokens")  # not "default vocabulary"


def test_not_a_gguf_and_a_truncated_header_are_model_errors(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(NotGGUFError):
        vocab.read(tmp_path / "x.gguf")
    good = tiny_gguf.write(tmp_path / "g.gguf", tiny_gguf.tokens(1000)).read_bytes()
    (tmp_path / "cut.gguf").write_bytes(good[:2000])
    with pytest.raises(CorruptModelError, match="truncated or damaged"):
        vocab.read(tmp_path / "cut.gguf")


@pytest.mark.parametrize("name, quant", [
    ("qwen2.5-7b-instruct-q4_k_m.gguf", "Q4_K_M"), ("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"), ("gemma-3-1b-it-q4_0.gguf", "Q4_0"),
    ("Llama-3.2-1B-Instruct-IQ4_XS.gguf", "IQ4_XS"), ("Q8_0/qwen2.5-32b-instruct-q8_0-00001-of-00004.gguf", "Q8_0"),
    ("model-f16.gguf", "F16"), ("Qwen2.5-0.5B-Instruct-BF16.gguf", "BF16"), ("model.gguf", None),
])
def test_quant_of_reads_the_label_in_a_file_name(name, quant):
    assert hub.quant_of(name) == quant


def test_choose_follows_llama_cpp():
    files = [RemoteFile("m-Q8_0.gguf", 8), RemoteFile("m-Q4_K_M.gguf", 4), RemoteFile("mmproj-m-f16.gguf", 1),
             RemoteFile("big/m-Q6_K-00002-of-00002.gguf", 3), RemoteFile("big/m-Q6_K-00001-of-00002.gguf", 3),
             RemoteFile("part/m-Q5_K_M-00001-of-00002.gguf", 3), RemoteFile("README.md", 1)]
    assert [f.name for f in hub.choose("o/m", files, None)] == ["m-Q4_K_M.gguf"]  # the default
    assert [f.name for f in hub.choose("o/m", files, "q6_k")] == ["big/m-Q6_K-00001-of-00002.gguf",
                                                                   "big/m-Q6_K-00002-of-00002.gguf"]
    with pytest.raises(ModelNotFoundError, match=r"^o/m has no Q5_K_M GGUF; it has Q4_K_M, Q6_K, Q8_0$"):
        hub.choose("o/m", files, "Q5_K_M")  # its split lacks a shard, and a projector is no model
    assert [f.name for f in hub.choose("o/m", files[:1], None)] == ["m-Q8_0.gguf"]  # no Q4_K_M: the first GGUF


def test_hub_names_parse_as_llama_cpp_spells_them():
    assert hub.HubRef.parse("Qwen/Qwen2.5-7B-Instruct-GGUF:q4_k_m") == hub.HubRef("Qwen/Qwen2.5-7B-Instruct-GGUF",
                                                                                  "q4_k_m")
    assert str(hub.HubRef.parse("hf:o/m@v2")) == "hf:o/m@v2"
    for bad in ("o", "o/m/x", "../x/y", "o /m"):
        with pytest.raises(ModelNotFoundError, match="invalid Hugging Face repo"):
            hub.HubRef.parse(bad)
