"""llguidance's tokenizer of a model's vocabulary: built once per loaded model (about 0.7 s for Qwen2.5's
152k tokens), shared by the target and the draft (a pair shares one vocabulary: models/pairing.py).

A llama.cpp model (ssd_edge.llama.model.Model) gives llguidance its raw token bytes, control tokens
marked as special (so a grammar names them: `<tool_call>`), and its own tokenize function, so a forced
run is split as the model would split it. Any other backend model (the fake one in tests) gives its
pieces and tokenize(). The end tokens are every end-of-generation token the model has
(Qwen2.5: <|im_end|> and <|endoftext|>, among others): a complete answer may end with either.
"""

from __future__ import annotations

import ctypes
from typing import Any


def for_model(model: Any) -> Any:
    """An llguidance LLTokenizer for `model`'s vocabulary."""
    vocab = getattr(model, "vocab", None)
    if vocab is not None and hasattr(model, "ptr"):
        return _from_llama(model)
    return _from_pieces(model)


def _from_llama(model: Any) -> Any:
    from llguidance import LLTokenizer

    from ..llama.library import ll

    vocab, n = model.vocab, model.n_vocab
    size = 16 * 1024
    buf = ctypes.create_string_buffer(size + 1)
    control, user = ll.LLAMA_TOKEN_ATTR_CONTROL, ll.LLAMA_TOKEN_ATTR_USER_DEFINED
    tokens: list[bytes] = []
    ends: list[int] = []
    for t in range(n):  # llguidance.llamacpp's loop, with the non-deprecated attribute call (no warnings)
        k = ll.llama_token_to_piece(vocab, t, buf, size, 0, True)
        if k < 0:
            raise ValueError(f"token {t} of {model.path.name} is longer than {size} bytes")
        tok = bytes(buf[:k])
        attr = ll.llama_vocab_get_attr(vocab, t)
        if attr & control or (attr & user and tok.startswith(b"<") and tok.endswith(b">")):
            tok = b"\xff" + tok  # llguidance's mark of a special token
        tokens.append(tok)
        if ll.llama_vocab_is_eog(vocab, t):
            ends.append(t)
    eos = int(ll.llama_vocab_eos(vocab))
    ends.sort(key=lambda t: t != eos)  # the model's own eos first: llguidance's eos_token
    fn = ctypes.cast(ll.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value  # (the llama_cpp.llama_cpp module)
    return LLTokenizer.from_llamacpp(tokens=tokens, vocab_ptr=vocab, tokenize_fptr=fn,
                                     eos_token=ends or [n - 1], slices=None)


class _Pieces:
    """llguidance's TokenizerWrapper protocol over a backend model's piece() and tokenize()."""

    def __init__(self, model: Any) -> None:
        n = int(model.n_vocab)
        self.tokens = [model.piece(t) for t in range(n)]
        ends = [t for t in range(n) if model.is_eog(t)]
        self.eos_token_id = ends[0] if ends else n - 1
        self.bos_token_id = None
        self.special_token_ids = ends

        self._ids = {p: t for t, p in reversed(list(enumerate(self.tokens))) if p}
        self._longest = max((len(p) for p in self._ids), default=1)

    def __call__(self, text: Any) -> list[int]:
        """Greedy longest match over the pieces: a split the model's pieces spell back exactly (a fake
        backend's tokenize() need not be the inverse of its pieces), up to the first byte no piece starts."""
        data = text if isinstance(text, bytes) else text.encode()
        out, i = [], 0
        while i < len(data):
            for n in range(min(self._longest, len(data) - i), 0, -1):
                t = self._ids.get(data[i:i + n])
                if t is not None:
                    out.append(t)
                    i += n
                    break
            else:  # no piece spells what is left (a partial piece, in llguidance's lookahead): the split so far
                return out
        return out


def _from_pieces(model: Any) -> Any:
    from llguidance import LLTokenizer, TokenizerWrapper

    return LLTokenizer(TokenizerWrapper(_Pieces(model)))
