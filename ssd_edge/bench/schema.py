"""The records of bench.json, validated on write and on read: the prompts, the machine and the
models, every run, the peer's runs, the summary rows and the goals. run.py writes them,
report.py reads them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

SCHEMA_VERSION = 1
TEXT_CATEGORIES = ("code", "code-edit", "prose", "chat", "translation")  # ssd_edge/data/prompts.jsonl
STRUCTURED_CATEGORIES = ("extraction", "tool-call", "list", "config")   # ssd_edge/data/structured.jsonl
CATEGORIES = TEXT_CATEGORIES + STRUCTURED_CATEGORIES


class BenchPrompt(BaseModel):
    id: str
    category: Literal["code", "code-edit", "prose", "chat", "translation", "extraction", "tool-call", "list",
                      "config"]
    messages: list[dict[str, str]]
    max_tokens: int | None = Field(default=None, ge=1, description="overrides -n/--n-predict for this prompt")
    # What the answer must look like, as in OpenAI's API (structured/request.py reads them as the server
    # does); a prompt without them runs free.
    response_format: dict[str, Any] | None = Field(default=None, description="{type: json_object} or "
                                                   "{type: json_schema, json_schema: {name, schema, strict}}")
    tools: list[dict[str, Any]] | None = Field(default=None, description="OpenAI tools: the prompt lists them, "
                                               "the answer calls them")
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    @property
    def structured(self) -> bool:
        """Whether the answer is held to a response_format or to tool calls."""
        return bool(self.response_format or self.tools)


class Setting(BaseModel):
    name: str = Field(description="separate or shared; with the stand-in's type after it for the stand-in's runs")
    target_threads: int
    draft_threads: int
    description: str
    target: str | None = Field(default=None, description="the target's file when not the run's target (the stand-in)")
    stand_in: bool = Field(default=False, description="the target is a measuring stand-in (`models derive`)")
    verify_ms: list[float] | None = Field(default=None, description="the target's decode of 1, 2, ... tokens at these "
                                          "threads, from the calibration profile (the regime's curve)")
    regime: str | None = Field(default=None, description="what that curve means for speculation, in words")


class MachineInfo(BaseModel):
    """The machine, never by its name: no hostname is written (results are committed and shared; a file
    written before held one, which reading ignores), and paths are the models folder's or `~`'s (machine.py)."""

    os: str
    machine: str
    cpu: str
    cores: int
    ram_gib: float
    python: str
    llama_system_info: str
    gpus: str = Field(default="", description="the local GPUs llama.cpp saw, as ggml names them ('' none)")
    load_avg_start: tuple[float, float, float]
    load_avg_end: tuple[float, float, float] | None = None
    native: str | None = Field(default=None, description="the path that read rows and drew tokens: 'c' "
                               "(ssd_edge.native built) or 'numpy' (the same tokens, slower)")
    priced: str | None = Field(default=None, description="the price table a priced run waited on (`--priced`): "
                               "the models were synthetic and no GPU ran; None: real models on this machine")


class ModelInfo(BaseModel):
    role: Literal["target", "draft"]
    name: str
    path: str
    size: int


class BenchOptions(BaseModel):
    modes: list[str]
    settings: list[str]
    k: int | None = Field(description="-k/--draft-max; None: each mode's default (auto: per round, up to what the verify curve pays for)")
    max_tokens: int
    reps: int
    seed: int
    temperature: float
    n_ctx: int
    quick: bool
    peer_k: list[int] = Field(description="extra llama.cpp draft lengths, run on the code prompts only")
    categories: list[str]


class RunRecord(BaseModel):
    """One generation."""

    setting: str
    mode: str
    prompt_id: str
    category: str
    rep: int
    seed: int
    prompt_tokens: int
    tokens: int
    stop_reason: str
    wall_s: float
    ttft_s: float | None
    decode_s: float = Field(description="wall time after the first round (Stats.decode_s)")
    tokens_per_s: float = Field(description="decode speed (Stats.tokens_per_s, metrics.decode_rate): tokens after "
                                            "the first round / decode_s")
    latencies_ms: list[float] = Field(description="per token: its round's wall time / tokens that round (first round excluded)")
    drafted: int
    accepted: int
    spec_rounds: int
    rounds: int
    lookups: int
    hits: int
    partial_hits: int
    miss_reasons: dict[str, int] = Field(default_factory=dict, description="misses by why (events.MISS_REASONS)")
    hits_by_accepted: dict[str, list[int]] = Field(default_factory=dict, description="by the looked-up round's "
                                                   "accepted count: [lookups, hits] (PrespecStats)")
    complete_at_lookup: float | None = Field(default=None, description="branches complete at a lookup, on average")
    first_decode_ms_p50: float | None = Field(default=None, description="ms from a verify's start to the SSD "
                                              "worker's first decode beside it (PrespecStats), median")
    first_decode_ms_p90: float | None = Field(default=None, description="the same, 90th percentile")
    verify_ms: dict[str, list[float]] = Field(default_factory=dict, description="by verify size (tokens): [verifies "
                                              "alone, their ms, verifies with the SSD worker beside, their ms]")
    draft_busy_s: float
    target_busy_s: float
    in_decode_s: float = Field(default=0.0, description="time inside llama_decode on the generating thread (Stats)")
    positions: int = Field(default=0, description="logit rows decoded: every verified and drafted position")
    host_by_worker: dict[str, list[float]] = Field(default_factory=dict, description="by what the pre-speculation "
                                                   "worker did beside a round's verify (alone, branch, tree): "
                                                   "[host seconds, positions] (Stats.host_by_worker)")
    threads: list[dict[str, Any]] = Field(default_factory=list, description="the thread splits its rounds ran at: "
                                          "[{target, draft, rounds, steps, ms_per_step}] (Stats.threads: plain "
                                          "steps after the prompt's, and their mean decode ms)")
    peak_rss_mib: float
    memory: dict[str, int] | None = Field(default=None, description="bytes by part at the end of the run "
                                          "(memory.MemoryUse.to_dict: weights, KV and compute buffers by model, "
                                          "the process before the models loaded, their total, RSS)")
    modes_run: dict[str, int] = Field(description="rounds per mode that actually ran (auto may switch)")
    auto: dict[str, Any] | None = None
    output_sha: str = Field(description="sha256 of the output token ids (greedy runs should agree across modes)")
    forced: int = Field(default=0, description="of `tokens`, those the answer's grammar forced (its only "
                        "continuation) that rode a round as free drafts (Stats.forced); 0 for a free prompt, "
                        "and in ar, whose plain steps draw every token")
    valid: bool | None = Field(default=None, description="the answer validates against its prompt's schema (tool "
                               "calls: each call's arguments against its tool's parameters); None: a free prompt")
    invalid: str | None = Field(default=None, description="why the answer did not validate (valid false)")


class PeerRecord(BaseModel):
    setting: str
    prompt_id: str
    category: str
    k: int
    kind: Literal["draft", "lookup", "grammar", "json_schema"] = Field(
        "draft", description="llama-speculative-simple with the draft model, llama-lookup (n-gram, target alone), "
                             "or llama-server under the prompt's constraint (peer_server.py, the target alone): "
                             "grammar (llama.cpp's GBNF of it, with ssd-edge's rigid separators) or json_schema "
                             "(its own conversion, as its users get it)")
    rep: int
    prompt_tokens: int
    tokens: int
    decode_s: float
    tokens_per_s: float
    drafted: int
    accepted: int
    encode_s: float | None = Field(default=None, description="the tool's prompt read ('encoded ... in S seconds'): "
                                   "the target's, and the draft model's where there is one")
    answer_s: float | None = Field(default=None, description="llama-server: the request's wall time, the prompt "
                                   "sent to the answer read (its own timings: encode_s + decode_s)")
    valid: bool | None = Field(default=None, description="llama-server: as RunRecord.valid")
    invalid: str | None = Field(default=None, description="llama-server: as RunRecord.invalid")


class PeerInfo(BaseModel):
    available: bool
    binary: str | None
    version: str | None
    note: str
    runs: list[PeerRecord] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)


class SummaryRow(BaseModel):
    setting: str
    mode: str
    category: str
    k: int | None
    runs: int
    tokens: int
    tokens_per_s: float
    tokens_per_s_std: float = Field(description="spread of per-prompt tokens/s")
    speedup_vs_ar: float | None
    answer_tokens_per_s: float | None = Field(
        default=None, description="tokens / time from the prompt to the last token (ssd-edge: TTFT + decode; "
                                  "llama.cpp: encode + decode): the same work on both sides, wherever a mode "
                                  "reads the prompt into the draft")
    ttft_ms: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    acceptance: float | None
    mean_accepted_len: float | None
    hit_rate: float | None
    draft_util: float | None
    target_util: float | None
    host_ms_per_position: float | None = Field(default=None, description="wall time outside llama_decode per "
                                               "decoded position, over the runs (Stats.host_ms_per_position)")
    host_ms_per_position_by_worker: dict[str, float] = Field(default_factory=dict, description="the same, by what "
                                                             "the worker did beside a round's verify: alone, "
                                                             "branch (one), tree (several at once)")
    verify_slowdown: float | None = Field(default=None, description="the verifies' time with the SSD worker beside "
                                          "them over the same sizes' time alone in the setting (any mode's), pooled")
    first_decode_ms_p50: float | None = Field(default=None, description="the runs' median first_decode_ms_p50")
    first_decode_ms_p90: float | None = Field(default=None, description="the runs' median first_decode_ms_p90")
    peak_rss_mib: float | None
    answer_s: float | None = Field(default=None, description="mean seconds per answer, prompt to last token "
                                   "(llama-server: the request's wall time)")
    valid_share: float | None = Field(default=None, description="share of the structured answers that validate "
                                      "(None: no structured prompt)")
    forced_share: float | None = Field(default=None, description="share of the structured answers' tokens that "
                                       "their grammar forced (None: no structured prompt, or a peer)")


class Goal(BaseModel):
    name: str
    threshold: str
    value: float | None
    met: bool | None
    detail: str


class BenchResult(BaseModel):
    schema_version: int = SCHEMA_VERSION
    created: str
    command: list[str]
    duration_s: float
    interrupted: bool = False
    machine: MachineInfo
    libraries: dict[str, str]
    models: list[ModelInfo]
    options: BenchOptions
    settings: list[Setting]
    engine_configs: dict[str, dict[str, Any]]
    prompts: list[BenchPrompt]
    profile: dict[str, Any] | None
    runs: list[RunRecord]
    peer: PeerInfo
    summary: list[SummaryRow]
    goals: list[Goal]
    notes: list[str]


# ---------------------------------------------------------------- a run as docs/bench commits it

DOCS_COPY = ("docs copy (schema.summary_only): the records of each generation (runs, and the peer's runs: "
             "timings, per-token latencies, acceptance, auto's planner records) were taken out to keep docs/ "
             "small; bench.md and bench.png were made from the whole file, and the summary rows, goals and "
             "every other field are as the run wrote them")


def summary_only(data: dict[str, Any]) -> dict[str, Any]:
    """A bench.json's data as docs/bench commits it, beside the bench.md and plot made from the whole: the
    records of each generation (runs, peer.runs) dropped, a note saying so; the summary rows, the goals,
    the machine, models, options, settings, prompts and profile kept as they are. The data is the file as
    read (json), not through the model, so a field an older schema wrote stays. The same data again where
    it is such a copy already. The copy still reads as a BenchResult (ValueError if not)."""
    notes = list(data.get("notes", []))
    out = {**data, "runs": [], "peer": {**data.get("peer", {}), "runs": []},
           "notes": notes if DOCS_COPY in notes else [*notes, DOCS_COPY]}
    BenchResult.model_validate(out)
    return out


# ---------------------------------------------------------------- reading a result (report.py, plot.py)

ALL = "all"  # the summary's category of every prompt


def row_of(rows: list[SummaryRow], setting: str, mode: str, category: str) -> SummaryRow | None:
    """The summary row of (setting, mode, category), if any."""
    return next((r for r in rows if (r.setting, r.mode, r.category) == (setting, mode, category)), None)


def cells(rows: list[SummaryRow], setting: str, mode: str, cats: list[str], field: str) -> list[float | None]:
    """One field of a mode's rows, per category (None: no row, or the row has no such value)."""
    return [getattr(r, field) if (r := row_of(rows, setting, mode, c)) is not None else None for c in cats]


def threads_of(result: BenchResult, setting: str) -> str:
    """A setting's threads as "target+draft"."""
    s = next(x for x in result.settings if x.name == setting)
    return f"{s.target_threads}+{s.draft_threads}"
