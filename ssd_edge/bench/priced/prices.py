"""Price tables: what one llama_decode of n tokens cost on a measured GPU, and the price of any n.

Source: FIELD_NOTES.md (the project's shared notes, not in the repository), "The GPU regime, measured":
one H200, CUDA 13.0, a 16-core Xeon host, 2026-12-04; llama-bench -ngl 99 on random-weight Qwen2-shaped
Q4_0 GGUFs (FA kernels off), ms.
A one-token decode is llama.cpp's tg, which runs as a CUDA graph (1.5B: 1.70 ms against 3.25 for a
batch of one); batches of 2 and more are the pp figures.

Between measured sizes the price is the linear interpolation of the two neighbours, so it is monotone
between them; the measured points are kept as measured, also where one is below a smaller batch's
(1.5B: 3 tokens 3.30 < 2 tokens 3.42, 32 tokens 7.76 < 24 tokens 8.35: one run's kernel choices).
Past the largest size (a prompt's prefill) it goes on linearly with the slope from 16 to 32 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

EXTRAPOLATE_FROM = 16  # the slope past the table's largest size is the one from this size to the largest


@dataclass(frozen=True)
class Curve:
    """One model's prices, ms per decode: one token (step_ms), and batches of n tokens (batch_ms, where
    n = 1 is a batch of one run without the CUDA graph: the anchor for 2 and 3 where they are not measured)."""

    step_ms: float
    batch_ms: dict[int, float]

    def ms(self, n: int) -> float:
        """The price of one decode of n tokens."""
        if n < 1:
            return 0.0
        if n == 1:
            return self.step_ms
        b = self.batch_ms
        if n in b:
            return b[n]
        top = max(b)
        if n > top:
            slope = (b[top] - b[EXTRAPOLATE_FROM]) / (top - EXTRAPOLATE_FROM)
            return b[top] + (n - top) * slope
        lo = max(s for s in b if s < n)
        hi = min(s for s in b if s > n)
        return b[lo] + (b[hi] - b[lo]) * (n - lo) / (hi - lo)


@dataclass(frozen=True)
class Shape:
    """What a priced model says of itself (ModelInfo): a Qwen2-shaped model of this size, Q4_0."""

    name: str
    n_params: int
    size_bytes: int
    n_layer: int
    kv_bytes_per_cell: int  # K+V, f16: 2 * n_layer * n_head_kv * head_dim * 2 bytes


@dataclass(frozen=True)
class PriceTable:
    name: str
    device: str
    target: Curve
    draft: Curve
    target_shape: Shape
    draft_shape: Shape

    def curve(self, role: str) -> Curve:
        return self.target if role == "target" else self.draft

    def shape(self, role: str) -> Shape:
        return self.target_shape if role == "target" else self.draft_shape


# What handing over the rows' heads costs the device on top of their decode (llama.cpp's backend sampling:
# a top-k in the decode's own graph, only the candidates copied back), ms: an estimate, not a measurement
# (no GPU has measured it yet; scripts/backend_sampling.py times backend sampling on a CPU build). One
# kernel a decode, a block a row, the rows side by side on their own SMs: a block reads its row's 152k
# float32 logits (608 KB) at ~100 GB/s, 6 us, and reduces them; then each row's candidates (41 ids and
# logits, 0.5 KB) cross to the host.
HEAD_DECODE_MS = 0.012
HEAD_ROW_MS = 0.001

# the 2-layer draft of the kit's 1.5B-shaped target (its first two blocks, its embeddings and output)
DRAFT_2L = Curve(0.25, {1: 0.38, 4: 0.39, 8: 0.42, 16: 0.57, 32: 0.67})
DRAFT_2L_SHAPE = Shape("2-layer draft (Qwen2 1.5B shape)", 240_000_000, 150_000_000, 2, 2 * 2 * 2 * 128 * 2)

TABLES = {
    "h200-1.5b": PriceTable(
        "h200-1.5b", "H200",
        Curve(1.70, {1: 3.25, 2: 3.42, 3: 3.30, 4: 3.39, 6: 3.74, 8: 3.96, 12: 5.67, 16: 6.00, 24: 8.35, 32: 7.76}),
        DRAFT_2L, Shape("Qwen2 1.5B shape", 1_540_000_000, 1_000_000_000, 28, 2 * 28 * 2 * 128 * 2), DRAFT_2L_SHAPE),
    "h200-7b": PriceTable(
        "h200-7b", "H200",
        Curve(3.38, {1: 4.37, 2: 4.55, 3: 4.70, 4: 5.14, 6: 5.95, 8: 6.75, 12: 8.07, 16: 8.16, 24: 9.34, 32: 9.88}),
        DRAFT_2L, Shape("Qwen2 7B shape", 7_620_000_000, 4_400_000_000, 28, 2 * 28 * 4 * 128 * 2), DRAFT_2L_SHAPE),
}
