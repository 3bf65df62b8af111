"""A priced pair: a target and a draft that spend the time of a GPU's price table instead of computing,
so the engine's own host cost and each mode's (and the planner's) behaviour can be measured against GPU
prices on any CPU. Not a measurement of a GPU: what runs is this machine's Python, and the waits are
what one H200 took per llama_decode (prices.py says where and how they were measured).

    from ssd_edge import priced
    engine = priced.engine(EngineConfig.build(target=dict(path="priced"), mode="sd"), "h200-1.5b", agreement=0.95)
    print(engine.complete("def fib(n):", max_tokens=64).stats.tokens_per_s)

prices.py  the tables and the price of a batch of any size
cells.py   the KV cache as a table of cells (also the tests' fake backend's)
backend.py PricedModel and PricedContext: the Backend protocol over a synthetic language model
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import EngineConfig
from ...engine import Engine
from ...errors import ConfigError
from .backend import PricedContext, PricedModel
from .prices import HEAD_DECODE_MS, HEAD_ROW_MS, TABLES, PriceTable

__all__ = ["Priced", "PricedContext", "PricedModel", "TABLES", "engine"]

DEFAULT_AGREEMENT = 0.95


@dataclass(frozen=True)
class Priced:
    """A price table and the draft's agreement with the target: what `--priced NAME[@AGREEMENT]` names."""

    table: str = "h200-1.5b"
    agreement: float = DEFAULT_AGREEMENT
    ties: float = 0.0  # contexts with a planted near-tie that a batch ranks the other way (backend.py; tests)

    def __post_init__(self) -> None:
        if self.table not in TABLES:
            raise ConfigError(f"--priced: no price table {self.table!r} (choose from {', '.join(TABLES)})")
        if not 0.0 <= self.agreement <= 1.0:
            raise ConfigError(f"the draft's agreement must be between 0 and 1, not {self.agreement}")

    @classmethod
    def parse(cls, text: str, agreement: float | None = None) -> "Priced":
        """'h200-1.5b' or 'h200-1.5b@0.9'; `agreement` (--agreement) where the text has none."""
        name, at, value = text.partition("@")
        if at and agreement is not None:
            raise ConfigError(f"--priced {text} already gives the agreement; drop --agreement")
        try:
            return cls(name, float(value) if at else DEFAULT_AGREEMENT if agreement is None else agreement)
        except ValueError:
            raise ConfigError(f"--priced {text}: the agreement after '@' must be a number") from None

    @property
    def prices(self) -> PriceTable:
        return TABLES[self.table]

    @property
    def label(self) -> str:
        """How results on this pair are labelled: priced, never a measured GPU, with its assumptions: the
        draft decodes on a device of its own beside the target (as the SSD reference implementation runs
        it), and what a branch step's heads cost is an estimate (prices.py) until a GPU measures it."""
        return (f"priced: {self.prices.device} table {self.table}, draft agreement {self.agreement:g}, "
                f"draft on a device of its own, branch heads {HEAD_DECODE_MS:g} ms a decode + {HEAD_ROW_MS:g} a row "
                "(estimated)")

    def models(self) -> tuple[PricedModel, PricedModel]:
        return (PricedModel(self.prices, "target", ties=self.ties),
                PricedModel(self.prices, "draft", self.agreement, ties=self.ties))

    def engine(self, config: EngineConfig) -> Engine:
        """An engine over the pair, with config's context size, batch and modes (its model paths are not read;
        a config without a draft gets one). The draft's unified cache holds the main sequence and one per
        branch, the history and the branch budget."""
        target, draft = self.models()
        if config.draft is None:
            config = EngineConfig.build(**{**config.model_dump(), "draft": dict(path=str(draft.path))})
        target_ctx = PricedContext(target, config.n_ctx, config.n_batch, threads=config.target.threads)
        draft_ctx = PricedContext(draft, 2 * config.n_ctx + config.prespec.budget_cells, config.n_batch,
                                  n_seq_max=config.prespec.fanout_max + 1,
                                  threads=config.draft.threads if config.draft is not None else 1)
        return Engine.from_parts(config, target, target_ctx, draft, draft_ctx)


def engine(config: EngineConfig, table: str = "h200-1.5b", agreement: float = DEFAULT_AGREEMENT,
           ties: float = 0.0) -> Engine:
    """An engine over the priced pair of `table`, its draft agreeing with its target at `agreement`,
    near-ties planted on a fraction `ties` of the contexts."""
    return Priced(table, agreement, ties).engine(config)
