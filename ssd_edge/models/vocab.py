"""Vocabularies read from GGUF headers, and whether a draft fits a target, before either is loaded.

A draft proposes token ids that the target verifies, so the two must mean the same text by the
same id. What is read from each file's header (the `gguf` package memory-maps it; no weights are
read, llama.cpp is not involved):

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
        """'qwen2 vocabulary of 151,936 tokens #9c1e2f3a', the words an error names a vocabulary by."""
        kind = self.pre or self.tokenizer
        return f"{kind} vocabulary of {self.size:,} tokens #{self.digest[:8]}"


def _digest(tokens: tuple[bytes, ...] | list[bytes]) -> str:
    h = hashlib.sha256()
    for t in tokens:
        h.update(len(t).to_bytes(4, "little"))
        h.update(t)
    return h.hexdigest()


def read(path: Path | str) -> Vocab:
    """The vocabulary in the header of the GGUF file `path` (a split model's first shard holds it)."""
    import gguf

    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except FileNotFoundError:
        raise CorruptModelError(f"model file not found: {path}") from None
    if magic != GGUF_MAGIC:
        raise NotGGUFError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, IndexError, OSError) as e:
        raise CorruptModelError(f"cannot read the GGUF header of {path}: {e}") from None
    keys = gguf.Keys.Tokenizer
    fields = reader.fields
    if keys.LIST not in fields:
        raise CorruptModelError(f"{path} has no token list ({keys.LIST}) in its header")
    tok_field = fields[keys.LIST]
    tokens = tuple(bytes(tok_field.parts[i]) for i in tok_field.data)

    def scalar(key: str) -> object | None:
        f = fields.get(key)
        return f.contents() if f is not None else None

    template = scalar(keys.CHAT_TEMPLATE)
    return Vocab(path=path, tokenizer=str(scalar(keys.MODEL) or "unknown"), pre=_str_or_none(scalar(keys.PRE)),
                 size=len(tokens), digest=_digest(tokens), bos=_int_or_none(scalar(keys.BOS_ID)),
                 eos=_int_or_none(scalar(keys.EOS_ID)),
                 template=hashlib.sha256(str(template).encode()).hexdigest() if template is not None else None,
                 tokens=tokens)


def _str_or_none(v: object) -> str | None:
    return str(v) if v is not None else None


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
        return Fit(None, f"tokenizer {target.tokenizer} vs {draft.tokenizer}")
    notes = []
    if (target.bos, target.eos) != (draft.bos, draft.eos):
        notes.append(f"BOS/EOS {target.bos}/{target.eos} vs {draft.bos}/{draft.eos} (the target's are used)")
    if target.template != draft.template:
        notes.append("different chat templates (the target's is used)")
    if target.digest == draft.digest:
        return Fit("same", notes=tuple(notes))
    gap = abs(target.size - draft.size)
    if gap > PAD_MAX:
        return Fit(None, f"{target.size:,} vs {draft.size:,} tokens")
    n = min(target.size, draft.size)
    if target.tokens[:n] != draft.tokens[:n]:
        first = next(i for i in range(n) if target.tokens[i] != draft.tokens[i])
        return Fit(None, f"token {first} is {target.tokens[first]!r} vs {draft.tokens[first]!r}")
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
