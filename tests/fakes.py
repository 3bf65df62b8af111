"""A fake llama.cpp backend: a tiny deterministic 'language model' behind the
Backend protocol (ssd_edge/interface.py) that ssd_edge.llama.backend.Model / Context
implement, for testing the engine and SSD pre-speculation without weights or
the compiled library.

FakeContext keeps its KV state in the priced backend's cell table
(ssd_edge/bench/priced/cells.py), a real one like llama.cpp's unified KV cache: each
decoded token takes a cell that belongs to a set of sequences; seq_cp adds a
sequence to cells (no new cells), seq_rm removes it, and a cell with no
sequence is freed. decode() enforces llama.cpp's rule that a sequence's first
position in a batch is its last stored position + 1, and computes logits from
the sequence's stored tokens, so a wrong KV state gives wrong logits.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ssd_edge.errors import DecodeError
from ssd_edge.interface import Aborted, FimTokens
from ssd_edge.bench.priced.cells import CellCache, seq_ids

V = 32
EOS = 0


def lm_logits(tokens: Sequence[int], disagree_every: int = 0) -> np.ndarray:
    """The fake model: a peaked distribution over V tokens given the prefix.

    The favourite next token is (3 * last + len) % (V - 1) + 1 (never EOS); the
    runner-up is favourite + 1. With disagree_every = n > 0 (the draft), every
    n-th position prefers the runner-up instead, so drafts get rejected there
    (and the target's token is the draft's second choice: a predictable miss).
    With disagree_every < 0 the draft follows an unrelated rule: unpredictable misses.
    """
    last = tokens[-1] if tokens else 1
    fav = (3 * last + len(tokens)) % (V - 1) + 1
    alt = fav % (V - 1) + 1
    if disagree_every < 0:  # a draft that is wrong in ways its own candidates do not predict
        fav = (7 * last + 5 * len(tokens) + 11) % (V - 1) + 1
        alt = (fav + 13) % (V - 1) + 1
    elif disagree_every and len(tokens) % disagree_every == 0:
        fav, alt = alt, fav
    z = np.full(V, -4.0, dtype=np.float32)
    z[fav] = 4.0
    z[alt] = 2.5
    z[(fav + 7) % (V - 1) + 1] = 1.0
    return z


# A vocabulary of one character a token (FakeModel(alphabet=ALPHABET)): enough for small JSON, so that a
# grammar (structured output) can hold the fake model's answers; token t > 0 is ALPHABET[t - 1]
ALPHABET = '{}[]":, abcdefghij0123456789-.\n'
assert len(ALPHABET) == V - 1
# FakeModel(fim=True)'s fill-in-the-middle tokens: ids the fake tokenizer also makes from text (a vocabulary of
# 32 has no room to spare), so a test tells the layout's special tokens by position, not by id
FIM = FimTokens(pre=28, suf=29, mid=30, pad=31, rep=26, sep=27)


class FakeModel:
    def __init__(self, name: str = "fake", disagree_every: int = 0, alphabet: str | None = None,
                 fim: bool = False) -> None:
        self.path = Path(f"/fake/{name}.gguf")
        self.n_vocab = V
        self.disagree_every = disagree_every
        self.alphabet = alphabet
        self.fim = FIM if fim else None

    def fim_tokens(self) -> FimTokens | None:
        return self.fim

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def eot(self) -> int:
        return EOS

    def piece(self, token: int) -> bytes:
        if self.alphabet is not None:
            return self.alphabet[token - 1].encode() if token else b""
        return f"<{token}>".encode()

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        if self.alphabet is not None:
            return [1 + self.alphabet.index(c) for c in text if c in self.alphabet]
        return [1 + (ord(c) % (V - 1)) for c in text]

    def render_chat(self, messages, add_assistant: bool = True) -> str:
        return "".join(m["content"] for m in messages)

    def close(self) -> None: ...


class FakeAbort:
    def __init__(self) -> None:
        self.flag = False

    def set(self) -> None:
        self.flag = True

    def clear(self) -> None:
        self.flag = False

    def is_set(self) -> bool:
        return self.flag


class FakeContext(CellCache):
    def __init__(self, model: FakeModel, n_ctx: int = 512, n_batch: int = 64, n_seq_max: int = 1,
                 decode_delay: float | Callable[[int], float] = 0.0, main_seq: Callable[[], int] | None = None
                 ) -> None:
        super().__init__(n_ctx, n_seq_max)
        self.model = model
        self.n_batch = n_batch
        self.decode_delay = decode_delay
        self.decodes = 0
        self.aborted = 0
        self.batch_sizes: list[int] = []
        self.abort = FakeAbort()
        self.threads = 1

    def set_threads(self, threads: int) -> None:
        self.threads = threads

    def decode(self, tokens, positions, seqs, logits_for, copy: bool = True) -> np.ndarray:  # fresh rows either way
        n = len(tokens)
        if n > self.n_batch:
            raise DecodeError("batch too large")
        delay = self.decode_delay(n) if callable(self.decode_delay) else self.decode_delay
        if delay:  # sleep in slices so an abort lands mid-decode, as in llama.cpp
            end = time.perf_counter() + delay
            while time.perf_counter() < end and not self.abort.is_set():
                time.sleep(min(0.001, delay))
        if self.abort.is_set():
            self.aborted += 1
            raise Aborted()
        self.store(tokens, positions, seqs)
        rows = [lm_logits(self.seq_tokens(seq_ids(seqs[i])[0], positions[i] + 1), self.model.disagree_every)
                for i in logits_for]
        self.decodes += 1
        self.batch_sizes.append(n)
        return np.stack(rows) if rows else np.empty((0, V), np.float32)

    def close(self) -> None: ...
