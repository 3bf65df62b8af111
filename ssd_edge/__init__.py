"""ssd-edge: speculative speculative decoding (SSD / SAGUARO) on GGUF models through llama.cpp.

    from ssd_edge import Engine, EngineConfig
    engine = Engine(EngineConfig.build(target={"path": "qwen2.5-coder-1.5b"},
                                       draft={"path": "qwen2.5-coder-0.5b"}, mode="ssd"))
    print(engine.complete("def fib(n):", max_tokens=64).text)

The Engine is imported on first use, so `import ssd_edge` stays cheap for
tools that only read configs or events; llama_cpp itself is imported only when
a model is loaded (ssd_edge/llama/library.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import EngineConfig, ModelConfig, PrespecConfig, SamplingConfig, SpecConfig
from .errors import SSDEdgeError
from .events import AutoStats, FinishEvent, LiveStats, PrespecStats, Round, Stats, TokenEvent

__version__ = "0.1.0"

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Completion, Engine

__all__ = ["Engine", "Completion", "EngineConfig", "ModelConfig", "SamplingConfig", "SpecConfig", "PrespecConfig",
           "TokenEvent", "FinishEvent", "Round", "LiveStats", "Stats", "PrespecStats", "AutoStats", "SSDEdgeError",
           "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("Engine", "Completion"):
        from . import engine

        return getattr(engine, name)
    if name == "priced":  # `from ssd_edge import priced`: the priced pair, a bench instrument (bench/priced/)
        from .bench import priced

        return priced
    raise AttributeError(f"module 'ssd_edge' has no attribute {name!r}")
