"""Where the memory goes: the loaded pair's buffers by part, and the rest of the process.

llama.cpp says what it allocates as it allocates it, in its log: a model load names each weight
buffer ("CPU_Mapped model buffer size = 400.86 MiB", "CPU_REPACK ...", "CUDA0 ..."), a context
its KV cache, its output (logits) buffer and its compute buffer. The backend keeps those lines'
sizes (Buffers, read by parse_buffers from library.capture_log), so the parts here are llama.cpp's
own allocations, for any device; nothing is estimated. "other" is the process without the models:
its resident memory (RSS) when the engine started, before the first load (Python, the libraries).

An allocation is what the app may touch, not what is resident at a given moment: a compute
buffer is sized for the largest batch and a memory-mapped weight file is paged in as it is read,
so the RSS beside the parts can read lower than their sum (and higher once the OS page cache
counts mapped pages twice). The sum of the parts is the figure to budget with.

    measure(engine) -> MemoryUse     one reading, cheap (a few attribute reads and /proc)

Shown by `generate --json` (stats.memory), the TUI's info panel, `calibrate --show`, the bench
JSON and the server's /metrics (ssd_edge_memory_bytes{part=...}).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping

MIB = 1 << 20
# "load_tensors:   CPU_REPACK model buffer size =   191.95 MiB", "llama_kv_cache:  CPU KV buffer size = ..."
_LINE = re.compile(r"(\S+)\s+(model|KV|compute|output) buffer size\s*=\s*([0-9.]+) MiB")
_KIND = {"model": "weights", "KV": "kv", "compute": "compute", "output": "compute"}


@dataclass(frozen=True)
class Buffers:
    """Bytes llama.cpp allocated for one model or context, by kind (weights, kv, compute: the
    compute graph's and the output logits' buffers), and how many of them live on a device other
    than the host (a GPU, an RPC server)."""

    weights: int = 0
    kv: int = 0
    compute: int = 0
    on_device: int = 0

    def __add__(self, other: "Buffers") -> "Buffers":
        return Buffers(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


def parse_buffers(lines: Iterable[str]) -> Buffers:
    """The buffers named in llama.cpp log lines (a model load's or a context creation's)."""
    out = {"weights": 0, "kv": 0, "compute": 0, "on_device": 0}
    for line in lines:
        for m in _LINE.finditer(line):
            where, kind, mib = m.group(1), _KIND[m.group(2)], float(m.group(3))
            size = int(round(mib * MIB))
            out[kind] += size
            if not where.upper().startswith("CPU") and not where.endswith("_Host"):
                out["on_device"] += size  # CUDA0, Metal, RPC[host:port]...; "CUDA_Host" is pinned host memory
    return Buffers(**out)


def rss_bytes() -> int:
    """This process's resident memory now (0 where it cannot be read)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:  # macOS and other Unixes: the peak, the best the standard library offers there
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)
    except (ImportError, OSError):
        return 0


@dataclass(frozen=True)
class MemoryUse:
    """One reading, in bytes. The draft's KV includes its branch cells (one unified cache)."""

    target_weights: int
    draft_weights: int
    target_kv: int
    draft_kv: int
    compute: int       # both contexts' compute and output buffers
    on_device: int     # of the parts above, what lives on a GPU or RPC device rather than in RAM
    other: int         # the process without the models: its RSS before the first load
    rss: int           # the process's resident memory now

    @property
    def total(self) -> int:
        """What the app may hold: every buffer (host and device) and the rest of the process."""
        return self.target_weights + self.draft_weights + self.target_kv + self.draft_kv + self.compute + self.other

    def to_dict(self) -> dict[str, int]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "total": self.total}

    @classmethod
    def of(cls, d: Mapping[str, int]) -> "MemoryUse":
        """From to_dict()'s form (keys it derives, "total", and any others are ignored)."""
        return cls(**{f.name: d[f.name] for f in fields(cls)})

    def parts(self) -> list[tuple[str, int]]:
        """(label, bytes) of each part worth showing, in a fixed order (a draft not loaded is left out)."""
        rows = [("target weights", self.target_weights), ("draft weights", self.draft_weights),
                ("target KV", self.target_kv), ("draft KV", self.draft_kv), ("compute", self.compute),
                ("other", self.other)]
        return [(k, v) for k, v in rows if v or k in ("target weights", "other")]

    def describe(self) -> str:
        """One line: "2.95 GiB: 1.62 GiB target weights · 112 MiB target KV · ... (RSS now 2.61 GiB)"."""
        parts = " · ".join(f"{human_bytes(v)} {k}" for k, v in self.parts())
        device = f", {human_bytes(self.on_device)} of it on a GPU or RPC device" if self.on_device else ""
        return f"{human_bytes(self.total)}: {parts} (RSS now {human_bytes(self.rss)}{device})"


def measure(engine: Any) -> MemoryUse:
    """The engine's memory by part now. Parts a backend does not report (the tests' fakes) are 0;
    engine.rss_base is the process's RSS before the first model load."""
    def buffers(obj: Any) -> Buffers:
        return getattr(obj, "buffers", None) or Buffers()

    tw, dw = buffers(engine.target), buffers(engine.draft)
    tc, dc = buffers(engine.target_ctx), buffers(engine.draft_ctx)
    allb = tw + dw + tc + dc
    return MemoryUse(target_weights=tw.weights, draft_weights=dw.weights, target_kv=tc.kv, draft_kv=dc.kv,
                     compute=tc.compute + dc.compute, on_device=allb.on_device,
                     other=getattr(engine, "rss_base", 0), rss=rss_bytes())


def human_bytes(n: float) -> str:
    """1536 -> "1.5 KiB"; binary units, three significant figures."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or abs(n) >= 100 else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} GiB"  # pragma: no cover


# ---------------------------------------------------------------- --memory-budget

KV_BYTES = {"f16": 64 / 32, "q8_0": 34 / 32, "q4_0": 18 / 32}  # bytes per value: 32 values in 64, 34, 18 bytes
MIN_CTX = 2048           # the budget shrinks the context to no less than this (or the size asked, if smaller)
COMPUTE_SLACK = 8 * MIB  # a context's compute buffer beyond its logits (measured 302 MiB for 512 x 151,936 x 4 B)


def parse_size(text: str) -> int:
    """'3G', '2.5GiB', '512M', '800MB', '1048576' -> bytes (binary units: 1G = 2^30 bytes)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"'{text}' is not a size: give a number with K, M or G (e.g. 3G, 512M)")
    return int(float(m.group(1)) * 1024 ** "bkmgt".index(m.group(2) or "b"))


def compute_bytes(n_vocab: int, n_batch: int) -> int:
    """A context's compute and output buffers, estimated: a batch of logits (n_batch x n_vocab floats)
    and a little more (COMPUTE_SLACK; measured by memory.measure after the load)."""
    return 4 * n_vocab * n_batch + COMPUTE_SLACK


@dataclass(frozen=True)
class ModelCost:
    """What one model costs before its context exists: its weights (as llama.cpp allocated them), the
    f16 KV bytes of one cell, its vocabulary (the logits buffer)."""

    weights: int
    f16_cell: int
    n_vocab: int


@dataclass(frozen=True)
class BudgetPlan:
    n_ctx: int
    kv: str                 # the KV cache type of K and V, both models ("f16", "q8_0", "q4_0")
    budget_cells: int
    draft: bool             # whether the draft is kept
    needs: int              # bytes the plan is expected to take
    changes: tuple[str, ...]  # what was changed to fit, in words (empty: nothing had to)

    def describe(self, budget: int) -> str:
        head = f"--memory-budget {human_bytes(budget)}: about {human_bytes(self.needs)}"
        return head + (" with " + ", ".join(self.changes) if self.changes else ", nothing changed")


def fit_budget(budget: int, *, base: int, target: ModelCost, draft: ModelCost | None, n_ctx: int, n_batch: int,
               kv: str, budget_cells: int, draft_extra: int, draft_required: bool) -> BudgetPlan:
    """Settings that fit `budget` bytes, changing as little as it can, in this order: the context
    (halved down to MIN_CTX), then the KV type (q8_0, then q4_0), then the branch-cell budget (to
    none), then the draft (dropped, unless the mode needs it). base: the process without the models;
    draft_extra: the draft context's cells beyond n_ctx and the branch budget. Raises ValueError, one
    line, when the target alone cannot fit at the smallest settings."""
    kinds = list(KV_BYTES)[list(KV_BYTES).index(kv):]  # the type asked, then the smaller ones

    def needs(ctx: int, kv_type: str, cells: int, with_draft: bool) -> int:
        per = KV_BYTES[kv_type] / KV_BYTES["f16"]
        total = base + target.weights + int(target.f16_cell * per * ctx) + compute_bytes(target.n_vocab, n_batch)
        if with_draft:
            total += draft.weights + int(draft.f16_cell * per * (ctx + cells + draft_extra))
            total += compute_bytes(draft.n_vocab, n_batch)
        return total

    floor = min(n_ctx, MIN_CTX)
    ctxs = [n_ctx]
    while ctxs[-1] // 2 >= floor:
        ctxs.append(ctxs[-1] // 2)
    if ctxs[-1] != floor:
        ctxs.append(floor)
    def ladder(cells: int, with_draft: bool) -> list[tuple[int, str, int, bool]]:  # the context, then the KV type
        return [(c, kinds[0], cells, with_draft) for c in ctxs] + [(floor, k, cells, with_draft) for k in kinds[1:]]

    steps = ladder(budget_cells, True) + [(floor, kinds[-1], 0, True)]
    if not draft_required:  # without the draft, the largest context that then fits
        steps += ladder(0, False)
    for c, k, cells, with_draft in steps:
        with_draft = with_draft and draft is not None
        n = needs(c, k, cells, with_draft)
        if n <= budget:
            changes = []
            if c != n_ctx:
                changes.append(f"a context of {c} tokens (from {n_ctx})")
            if k != kinds[0]:
                changes.append(f"a {k} KV cache")
            if cells != budget_cells and with_draft:
                changes.append(f"no pre-speculation branch cells (from {budget_cells})")
            if draft is not None and not with_draft:
                changes.append("no draft model")
            return BudgetPlan(c, k, cells, with_draft, n, tuple(changes))
    smallest = needs(floor, kinds[-1], 0, False)
    if draft is not None and draft_required:
        with_draft = needs(floor, kinds[-1], 0, True)
        raise ValueError(f"--memory-budget {human_bytes(budget)} is too small for this mode's two models: they need "
                         f"about {human_bytes(with_draft)} at the smallest settings (the target alone "
                         f"{human_bytes(smallest)}; --mode ar or lookup runs without the draft)")
    raise ValueError(f"--memory-budget {human_bytes(budget)} is too small: the target alone needs about "
                     f"{human_bytes(smallest)} (weights {human_bytes(target.weights)}, a {kinds[-1]} KV cache of "
                     f"{floor} tokens, its compute buffer, and {human_bytes(base)} for the process)")
