"""The completion bench's files (`ssd-edge bench --fim`, fim_run.py): bench.json (FimResult: each
completion's record, each set-up's summary, the goal's check, the run's command, machine and models) and
bench.md (the summary table). Its own document, marked `"kind": "fim"`: the main bench's schema
(schema.py: BenchResult) is not changed by it.

Per set-up, over the sequence's completions (warm-ups apart):
  s_per_completion   mean wall time of a completion request, sent to its last event read
  ttft_s             mean time to the first streamed token
  tokens_cached      mean prompt tokens the server reused from its cache (its `tokens_cached`, as it counts)
  prompt_n           mean prompt tokens it read (its timings.prompt_n)
  decode_tok_s       its predicted tokens over its predicted time, summed over the completions
  first_lines_ok     completions whose first line gave back the line cut out
  warm_s             wall time of llama.vim's warm-up requests, in all (the user does not wait for them)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Sequence

from pydantic import BaseModel, Field

from .schema import MachineInfo

GOAL_SPEEDUP = 1.1  # issue 54: ssd-edge at least this much faster than llama-server's fastest set-up


class FimRecord(BaseModel):
    setup: str
    index: int
    file: str
    row: int = Field(description="the cursor's line, 1-based")
    seconds: float
    ttft_s: float | None = Field(description="time to the first streamed token (None: no token came)")
    tokens_cached: int | None
    prompt_n: int | None
    predicted_n: int | None
    predicted_ms: float | None
    prompt_ms: float | None
    first_line_ok: bool
    first_line: str = Field(description="the cursor's line once the completion's first line is accepted")
    cut: str = Field(description="the line as the file has it")


class FimSetup(BaseModel):
    name: str
    server: Literal["llama-server", "ssd-edge"]
    command: list[str]
    completions: int = 0
    s_per_completion: float | None = None
    ttft_s: float | None = None
    tokens_cached: float | None = None
    prompt_n: float | None = None
    decode_tok_s: float | None = None
    first_lines_ok: int = 0
    warm_s: float = 0.0
    error: str | None = None


class FimGoal(BaseModel):
    ours: str
    peer: str
    speedup: float = Field(description="the peer's s_per_completion over ours")
    first_lines: tuple[int, int] = Field(description="first lines right: ours, the peer's")
    met: bool


class FimResult(BaseModel):
    kind: Literal["fim"] = "fim"
    command: str
    created: str
    machine: MachineInfo
    models: dict[str, str]
    files: list[str]
    per_file: int
    n_predict: int
    n_ctx: int
    threads: int
    notes: list[str] = []
    setups: list[FimSetup]
    goal: FimGoal | None = None
    interrupted: bool = False
    records: list[FimRecord] = []


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def summarize(setup: FimSetup, records: Sequence[FimRecord], warm_s: float) -> FimSetup:
    """`setup` with its summary over `records` (its own) and its warm-ups' time."""
    rs = [r for r in records if r.setup == setup.name]
    n_pred = sum(r.predicted_n or 0 for r in rs)
    ms = sum(r.predicted_ms or 0.0 for r in rs)
    return setup.model_copy(update=dict(
        completions=len(rs), s_per_completion=_mean([r.seconds for r in rs]), ttft_s=_mean([r.ttft_s for r in rs]),
        tokens_cached=_mean([r.tokens_cached for r in rs]), prompt_n=_mean([r.prompt_n for r in rs]),
        decode_tok_s=n_pred / (ms / 1e3) if ms > 0 else None, first_lines_ok=sum(r.first_line_ok for r in rs),
        warm_s=warm_s))


def goal(setups: Sequence[FimSetup]) -> FimGoal | None:
    """Issue 54's check: ssd-edge's fastest set-up against llama-server's fastest, over full sequences."""
    done = [s for s in setups if s.s_per_completion and s.error is None]
    full = max((s.completions for s in done), default=0)
    ours = [s for s in done if s.server == "ssd-edge" and s.completions == full]
    peers = [s for s in done if s.server == "llama-server" and s.completions == full]
    if not ours or not peers:
        return None
    a = min(ours, key=lambda s: s.s_per_completion or 0.0)
    b = min(peers, key=lambda s: s.s_per_completion or 0.0)
    speedup = (b.s_per_completion or 0.0) / (a.s_per_completion or 1.0)
    return FimGoal(ours=a.name, peer=b.name, speedup=speedup, first_lines=(a.first_lines_ok, b.first_lines_ok),
                   met=speedup >= GOAL_SPEEDUP and a.first_lines_ok >= b.first_lines_ok - 1)


def _f(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def markdown(result: FimResult) -> str:
    lines = [f"# ssd-edge bench --fim ({result.created})", "", f"`{result.command}`", "",
             f"{len(result.files)} files ({', '.join(result.files)}), {result.per_file} cursor positions each; "
             f"llama.vim's requests (256 lines above, 64 below, its ring of extra chunks), greedy, n_predict "
             f"{result.n_predict}; n_ctx {result.n_ctx}, {result.threads} threads; {result.machine.cpu}, "
             f"{result.machine.cores} cores.", "",
             "| set-up | completions | s / completion | time to first token (s) | tokens_cached | prompt_n | "
             "decode tok/s | first lines right | warm-ups (s) |", "|---|---|---|---|---|---|---|---|---|"]
    for s in result.setups:
        if s.error:
            lines.append(f"| {s.name} | {s.completions} | failed: {s.error} | | | | | | |")
            continue
        lines.append(f"| {s.name} | {s.completions} | {_f(s.s_per_completion, '.2f')} | {_f(s.ttft_s, '.2f')} | "
                     f"{_f(s.tokens_cached, '.0f')} | {_f(s.prompt_n, '.0f')} | {_f(s.decode_tok_s, '.1f')} | "
                     f"{s.first_lines_ok}/{s.completions} | {s.warm_s:.1f} |")
    if result.goal:
        g = result.goal
        lines += ["", f"Goal (ssd-edge >= {GOAL_SPEEDUP}x llama-server's fastest set-up, first lines right at "
                  f"least the peer's less one): {g.ours} vs {g.peer}: {g.speedup:.2f}x, first lines "
                  f"{g.first_lines[0]} vs {g.first_lines[1]}: {'met' if g.met else 'not met'}."]
    if result.interrupted:
        lines += ["", "Interrupted (Ctrl-C): the numbers cover the completions done."]
    lines += [""] + [f"- {n}" for n in result.notes] + ["", "## Set-ups", ""]
    lines += [f"- {s.name}: `{' '.join(s.command)}`" for s in result.setups]
    return "\n".join(lines) + "\n"


def write(result: FimResult, out: Path) -> list[Path]:
    """bench.json (validated on the way out) and bench.md in `out`."""
    data: dict[str, Any] = json.loads(result.model_dump_json())
    FimResult.model_validate(data)
    paths = [out / "bench.json", out / "bench.md"]
    paths[0].write_text(json.dumps(data, indent=1))
    paths[1].write_text(markdown(result))
    return paths
