"""Batched against one-token decoding of the same tokens on a real model (used by
tests/real/test_backend.py and tests/default_pair/test_backend_qwen.py)."""

from __future__ import annotations

import numpy as np

PROMPT = ("import numpy as np\n\ndef softmax(x):\n    e = np.exp(x - x.max())\n    return e / e.sum()\n\n"
          "# Now a function that computes the cross entropy")
CONTINUATION = " between two distributions p and q over the same vocabulary, in a numerically stable way"


def new_ctx(model, n_ctx=512, n_batch=512, n_seq_max=1):
    from ssd_edge.llama.backend import Context

    return Context(model, n_ctx, n_batch, 1, n_seq_max)


def prefill(ctx, tokens, seq=0):
    """Decode `tokens` at positions 0.. of `seq`; return the last row."""
    return ctx.decode(tokens, range(len(tokens)), [seq] * len(tokens), [len(tokens) - 1])[0]


def one_token_rows(model, prompt, ext):
    ctx = new_ctx(model)
    try:
        prefill(ctx, prompt)
        return np.stack([ctx.decode([t], [len(prompt) + i], [0], [0])[0] for i, t in enumerate(ext)])
    finally:
        ctx.close()


def check_batched_equals_one_token(model, tol, gap=None):
    """Every batched row within `tol` of its one-token row, and the same argmax wherever the one-token
    top-two gap exceeds `gap` (default 2 x tol)."""
    gap = 2 * tol if gap is None else gap
    prompt = model.tokenize(PROMPT)
    ext = model.tokenize(CONTINUATION, add_special=False)[:16]
    one = one_token_rows(model, prompt, ext)
    for k in (1, 2, 4, 5, 8, 16):
        ctx = new_ctx(model)
        try:
            prefill(ctx, prompt)
            rows = ctx.decode(ext[:k], range(len(prompt), len(prompt) + k), [0] * k, list(range(k)))
        finally:
            ctx.close()
        assert rows.shape == (k, model.n_vocab) and rows.dtype == np.float32
        diff = float(np.abs(rows - one[:k]).max())
        assert diff <= tol, f"k={k}: batched and one-token logits differ by {diff:.4f} > {tol}"
        top2 = np.sort(one[:k], axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > gap
        assert (rows.argmax(1) == one[:k].argmax(1))[clear].all(), f"k={k}: argmax differs"
