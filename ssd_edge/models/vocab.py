"""Vocabularies read from GGUF headers, and whether a draft fits a target, before either is loaded.

A draft proposes token ids that the target verifies, so the two must mean the same text by the
same id. What is read from each file's header (memory-mapped and parsed here in one pass, see
`_header`; no weights are read, llama.cpp is not involved):

    size        the length of tokenizer.ggml.tokens
    digest      sha256 of the token list (each token's bytes, length-prefixed)
    bos, eos    tokenizer.ggml.bos_token_id / eos_token_id
    template    sha256 of tokenizer.chat_template (None when the file has none)

The rule is the engine's (llama/backend.check_same_vocab), decided from the whole list rather
than a sample: a draft fits when its token list is the target's, or when one list is the other
plus at most PAD_MAX tokens at the end (Qwen-style tables padded to a round size; every shared
id must hold the same token). BOS/EOS ids and the chat template may differ: the target's are
the ones used, so the output is unchanged; `fit` says so in its notes.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CorruptModelError, NotGGUFError, VocabMismatchError

PAD_MAX = 128  # most extra tokens at the end of one list (the engine's check allows the same gap)
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class Vocab:
    path: Path
    tokenizer: str            # tokenizer.ggml.model: gpt2 (BPE), llama (SentencePiece), ...
    pre: str | None           # tokenizer.ggml.pre: qwen2, llama-bpe, smollm, ...
    size: int                 # tokens in the list
    digest: str               # sha256 hex of the whole list
    bos: int | None
    eos: int | None
    template: str | None      # sha256 hex of the chat template
    tokens: tuple[bytes, ...] = field(repr=False, compare=False)

    def label(self) -> str:
        """'qwen2 vocabulary of 151,936 tokens #9c1e2f3a', the words an error names a vocabulary by: the
        pre-tokenizer's name, else the tokenizer's ("default", llama.cpp's placeholder, names nothing)."""
        kind = self.pre if self.pre and self.pre != "default" else self.tokenizer
        return f"{kind} vocabulary of {self.size:,} tokens #{self.digest[:8]}"


def _digest(tokens: tuple[bytes, ...] | list[bytes]) -> str:
    h = hashlib.sha256()
    for t in tokens:
        h.update(len(t).to_bytes(4, "little"))
        h.update(t)
    return h.hexdigest()


def read(path: Path | str) -> Vocab:
    """The vocabulary in the header of the GGUF file `path` (a split model's first shard holds it)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
            if magic != GGUF_MAGIC:
                raise NotGGUFError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                fields = _header(data, KEYS)
    except FileNotFoundError:
        raise CorruptModelError(f"model file not found: {path}") from None
    except (struct.error, ValueError, IndexError, UnicodeDecodeError) as e:
        raise CorruptModelError(f"cannot read the GGUF header of {path} (truncated or damaged: {e})") from None
    if "tokenizer.ggml.tokens" not in fields:
        raise CorruptModelError(f"{path} has no token list (tokenizer.ggml.tokens) in its header")
    tokens = tuple(fields["tokenizer.ggml.tokens"])
    template = fields.get("tokenizer.chat_template")
    return Vocab(path=path, tokenizer=_text(fields.get("tokenizer.ggml.model")) or "unknown",
                 pre=_text(fields.get("tokenizer.ggml.pre")), size=len(tokens), digest=_digest(tokens),
                 bos=_int_or_none(fields.get("tokenizer.ggml.bos_token_id")),
                 eos=_int_or_none(fields.get("tokenizer.ggml.eos_token_id")),
                 template=hashlib.sha256(template).hexdigest() if template is not None else None, tokens=tokens)


KEYS = frozenset({"tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.bos_token_id",
                  "tokenizer.ggml.eos_token_id", "tokenizer.chat_template"})
# GGUF value types (gguf.GGUFValueType): struct format of the fixed-size ones; 8 string, 9 array
_FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def _header(data: mmap.mmap, wanted: frozenset[str]) -> dict[str, object]:
    """The `wanted` keys of a GGUF (v2/v3) header's key-value section, read in one pass without the
    gguf package's per-element objects (which take ~10 s for a 150k-token list on a small CPU):
    strings as bytes, a string array as a list of bytes, numbers as numbers; other keys skipped."""
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    if version < 2:
        raise ValueError(f"GGUF version {version} (ssd-edge reads 2 and 3)")
    pos, out = 24, {}
    for _ in range(n_kv):
        (n,) = struct.unpack_from("<Q", data, pos)
        key = data[pos + 8:pos + 8 + n].decode()
        (vtype,) = struct.unpack_from("<I", data, pos + 8 + n)
        pos += 12 + n
        value, pos = _value(data, pos, vtype, key in wanted)
        if key in wanted:
            out[key] = value
    return out


def _value(data: mmap.mmap, pos: int, vtype: int, keep: bool) -> tuple[object, int]:
    if vtype in _FIXED:
        return struct.unpack_from(_FIXED[vtype], data, pos)[0], pos + struct.calcsize(_FIXED[vtype])
    if vtype == _STRING:
        (n,) = struct.unpack_from("<Q", data, pos)
        return data[pos + 8:pos + 8 + n], pos + 8 + n
    if vtype != _ARRAY:
        raise ValueError(f"unknown GGUF value type {vtype}")
    item, count = struct.unpack_from("<IQ", data, pos)
    pos += 12
    if item in _FIXED:  # numbers: skipped whole (a vocabulary's scores and token types)
        size = struct.calcsize(_FIXED[item])
        return (list(struct.unpack_from(f"<{count}{_FIXED[item][1]}", data, pos)) if keep else None), pos + count * size
    if item != _STRING:
        items = []
        for _ in range(count):
            v, pos = _value(data, pos, item, keep)
            items.append(v)
        return items, pos
    strings: list[bytes] = []
    unpack = struct.Struct("<Q").unpack_from
    for _ in range(count):
        (n,) = unpack(data, pos)
        if keep:
            strings.append(data[pos + 8:pos + 8 + n])
        pos += 8 + n
    return (strings if keep else None), pos


def _text(v: object) -> str | None:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else None


def _int_or_none(v: object) -> int | None:
    return int(v) if v is not None else None  # type: ignore[call-overload]


@dataclass(frozen=True)
class Fit:
    kind: str | None          # "same", "padded", or None: the draft does not fit
    detail: str = ""          # padded: "same tokens, the target padded by 128"; None: why not
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.kind is not None

    def describe(self) -> str:
        """'same tokens', 'same tokens, the target padded by 128', or why not; then the notes."""
        return "; ".join((self.detail or "same tokens",) + self.notes)


def fit(target: Vocab, draft: Vocab) -> Fit:
    """Whether `draft` can propose tokens for `target` (see the module's docstring for the rule)."""
    if target.tokenizer != draft.tokenizer:
        return Fit(None, f"the target's tokenizer is {target.tokenizer}, the draft's {draft.tokenizer}")
    notes = []
    if (target.bos, target.eos) != (draft.bos, draft.eos):
        notes.append(f"BOS/EOS {target.bos}/{target.eos} vs {draft.bos}/{draft.eos} (the target's are used)")
    if target.template != draft.template:
        notes.append("different chat templates (the target's is used)")
    if target.digest == draft.digest:
        return Fit("same", notes=tuple(notes))
    gap = abs(target.size - draft.size)
    if gap > PAD_MAX:
        return Fit(None, f"the target has {target.size:,} tokens, the draft {draft.size:,}")
    n = min(target.size, draft.size)
    if target.tokens[:n] != draft.tokens[:n]:
        first = next(i for i in range(n) if target.tokens[i] != draft.tokens[i])
        return Fit(None, f"token {first} is {target.tokens[first]!r} in the target, "
                         f"{draft.tokens[first]!r} in the draft")
    which = "target" if target.size > draft.size else "draft"
    return Fit("padded", f"same tokens, the {which} padded by {gap}", tuple(notes))


def check(target_path: Path | str, draft_path: Path | str) -> Fit:
    """The fit of a (target, draft) pair of files; VocabMismatchError, one line naming both
    vocabularies, when the draft does not fit."""
    target, draft = read(target_path), read(draft_path)
    result = fit(target, draft)
    if not result.ok:
        raise VocabMismatchError(
            f"draft {Path(draft_path).name} ({draft.label()}) does not fit target {Path(target_path).name} "
            f"({target.label()}): {result.detail}")
    return result
