"""The llama.cpp adapter on the default pair's Qwen Q4_K_M target.

Batches of 4+ tokens take another kernel than one-token decodes and differ by up
to ~0.55 (FIELD_NOTES saw 0.58): QWEN_TOL = 0.75, and the argmax must agree
wherever the one-token top-2 margin exceeds twice that.
"""

from __future__ import annotations

from logits_check import check_batched_equals_one_token

QWEN_TOL = 0.75


def test_batched_decode_on_the_qwen_target(default_pair):
    from ssd_edge.llama.backend import Model

    m = Model(default_pair[0])
    try:
        check_batched_equals_one_token(m, QWEN_TOL)
    finally:
        m.close()
