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
            if not where.upper().startswith("CPU") and where != "RPC_Host" and not where.endswith("_Host"):
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

    def parts(self) -> list[tuple[str, int]]:
        """(label, bytes) of each part worth showing, largest first is not implied: the order is fixed."""
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
