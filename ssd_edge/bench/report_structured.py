"""The structured prompts' part of the bench's report: per mode, the share of answers that validate, the
share of tokens the grammar forced and the time per answer beside tokens/s (report.summarize's rows of
the category 'structured'); per prompt, the forced share; and the issue's goals for auto under a
constraint.

    auto vs ar, under the same constraint              decode tokens/s  >= 1.00x
    auto vs llama-server under the same grammar        decode tokens/s  >= 1.10x
    auto vs llama-server's default json_schema         time per answer  >= 1.50x faster, and a valid
                                                                        share at least as high
"""

from __future__ import annotations

from collections import defaultdict

from .schema import BenchResult, Goal, RunRecord, SummaryRow

GRAMMAR, JSON_SCHEMA = "llama.cpp-grammar", "llama.cpp-json_schema"
STRUCTURED = "structured"  # report.STRUCTURED: the summary's category of every structured prompt


def rows(summary: list[SummaryRow]) -> list[SummaryRow]:
    """The summary rows over every structured prompt (report.summarize's category 'structured')."""
    return [r for r in summary if r.category == STRUCTURED]


def goals(summary: list[SummaryRow]) -> list[Goal]:
    """The issue's goals for auto under a constraint, per setting."""
    summary = rows(summary)
    out: list[Goal] = []
    for s in dict.fromkeys(r.setting for r in summary):
        got = {r.mode: r for r in summary if r.setting == s}
        auto = got.get("auto")
        if auto is None:
            continue
        for other, threshold in (("ar", 1.0), (GRAMMAR, 1.1)):
            o = got.get(other)
            if o is not None and o.tokens_per_s:
                v = auto.tokens_per_s / o.tokens_per_s
                out.append(Goal(name=f"{s}, structured: auto vs {other} under the same constraint",
                                threshold=f">= {threshold:.2f}x", value=v, met=v >= threshold,
                                detail=f"auto {auto.tokens_per_s:.2f} vs {other} {o.tokens_per_s:.2f} tok/s"))
        peer = got.get(JSON_SCHEMA)
        if peer is not None and peer.answer_s and auto.answer_s:
            v = peer.answer_s / auto.answer_s
            ok, theirs = _valid(auto), _valid(peer)
            out.append(Goal(name=f"{s}, structured: auto's whole answer vs {JSON_SCHEMA}'s, and as many valid",
                            threshold=">= 1.50x", value=v,
                            met=v >= 1.5 and (auto.valid_share or 0.0) >= (peer.valid_share or 0.0),
                            detail=f"{auto.answer_s:.2f} vs {peer.answer_s:.2f} s an answer; valid {ok} vs "
                                   f"{theirs} of {auto.runs} and {peer.runs}"))
    return out


def _valid(row: SummaryRow) -> int:
    return round((row.valid_share or 0.0) * row.runs)


def _f(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def markdown(result: BenchResult) -> list[str]:
    """The structured tables (no lines where no prompt was structured)."""
    summary = rows(result.summary)
    if not summary:
        return []
    lines = ["", "Structured output (the prompts with a response_format or tools): valid, the share of answers "
             "that validate (jsonschema); forced, the share of tokens the grammar forced that rode a round as free "
             "drafts (ar's plain steps draw every token); answer s, mean seconds from the prompt to the last "
             "token; t/s, decode tokens/s (speedup vs ar):", "",
             "| setting | mode | answers | valid | forced | answer s | answer t/s | t/s | speedup |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    ar = {r.setting: r.tokens_per_s for r in summary if r.mode == "ar"}
    for r in summary:
        base = ar.get(r.setting)
        lines.append(f"| {r.setting} | {r.mode} | {r.runs} | {_f(r.valid_share, '.0%')} | {_f(r.forced_share, '.0%')} "
                     f"| {_f(r.answer_s, '.2f')} | {_f(r.answer_tokens_per_s, '.2f')} | {r.tokens_per_s:.2f} | "
                     f"{_f(r.tokens_per_s / base if base else None, '.2f')}x |")
    lines += per_prompt(result)
    bad = [f"{r.mode} · {r.prompt_id} (rep {r.rep}): {r.invalid}" for r in result.runs if r.valid is False] + \
          [f"{r.kind} · {r.prompt_id} (rep {r.rep}): {r.invalid}" for r in result.peer.runs if r.valid is False]
    if bad:
        lines += ["", "Answers that did not validate:", ""] + [f"- {b}" for b in bad[:12]]
    return lines


def per_prompt(result: BenchResult) -> list[str]:
    """Per structured prompt: its tokens and forced share in each mode (over its reps), answers valid."""
    cells: dict[tuple[str, str], list[RunRecord]] = defaultdict(list)
    cats: dict[str, str] = {}
    for r in result.runs:
        if r.valid is not None and r.rep >= 0:
            cells[(r.prompt_id, r.mode)].append(r)
            cats[r.prompt_id] = r.category
    modes = list(dict.fromkeys(m for _, m in cells))
    lines = ["", "Per prompt: tokens an answer, forced share, answers valid (all settings and passes):", "",
             "| prompt | category | " + " | ".join(modes) + " |", "|---|---|" + "--:|" * len(modes)]
    for pid, cat in cats.items():
        out = []
        for m in modes:
            rs = cells.get((pid, m), [])
            tokens = sum(r.tokens for r in rs)
            out.append("–" if not rs else f"{tokens / len(rs):.0f} tok, {sum(r.forced for r in rs) / tokens:.0%} "
                       f"forced, {sum(bool(r.valid) for r in rs)}/{len(rs)}" if tokens else "0 tok")
        lines.append(f"| {pid} | {cat} | " + " | ".join(out) + " |")
    return lines
