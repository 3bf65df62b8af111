"""llama-server's own wire format, for editors: the bodies of POST /infill and POST /completion, and the
response object both answer with (whole, or as server-sent chunks).

Requests take llama-server's field names. Beyond the OpenAI fields both share (protocol.py: stop,
temperature, top_k, top_p, min_p, seed, stream, mode, ...):
  n_predict          tokens to generate: -1 no limit (the server's --max-tokens, else the context), 0 read
                     the prompt into the cache and generate nothing (an editor's warm-up), below -1 a 400
  n_indent           stops.IndentLimit; t_max_predict_ms: stops.TimeLimit (0: off); t_max_prompt_ms accepted
  samplers           which of the filters apply (llama-server's meaning: one left out is off, and without
                     "temperature" the draw is at temperature 1). The engine applies them in its own order
                     (top-k, top-p, min-p, then "infill", llama.cpp's sampler that keeps the end tokens where
                     they weigh enough and merges candidates sharing a prefix, structured/infill_filter.py;
                     the temperature last, on what they kept); the other llama.cpp names (penalties, dry,
                     typ_p, xtc, top_n_sigma) are accepted: at their defaults they change nothing
  cache_prompt, id_slot   accepted: one slot, whose cache every request reuses (its longest common prefix)
  json_schema, grammar   the answer held to a JSON schema or a GBNF grammar (as response_format is)
  response_fields    ["content", "timings/prompt_n", ...]: only these, each under its path as the key
  n_cmpl             answers (llama.vscode asks 3): made one after another, on seeds seed, seed + 1, ...,
                     answered as a list of objects (one answer: the object itself)
/infill: input_prefix and input_suffix (both required), input_extra ([{filename, text}], oldest first),
prompt (the cursor's line so far); /completion: a string prompt (special tokens parsed, as llama-server
does: clients template their own FIM prompts) or a list of token ids.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict, field_validator

from ..events import FinishEvent, Prefilled
from ..stops import IndentLimit, StopRule, TimeLimit
from ..structured import Constraint, Grammar, JsonSchema
from .protocol import MAX_N, GenerationFields, bad_request
from .reply import speculation

# llama.cpp's sampler names (common_sampler_types_from_names, with its other spellings) -> the filter each is
# here (None: accepted, not applied)
SAMPLERS: dict[str, str | None] = {
    "top_k": "top_k", "top-k": "top_k", "top_p": "top_p", "top-p": "top_p", "nucleus": "top_p",
    "min_p": "min_p", "min-p": "min_p", "temperature": "temperature", "temp": "temperature",
    "infill": "infill", "penalties": None, "dry": None, "typ_p": None, "typ-p": None, "typical_p": None,
    "typical-p": None, "typical": None, "typ": None, "xtc": None, "top_n_sigma": None,
}
OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 1.0}  # a filter left out of `samplers`
# llama-server's other sampling fields: accepted at the values that change nothing, else a 400 naming them
# (dropped silently, they would change the answer without a word)
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "repeat_penalty": (1, 1.0), "mirostat": (0,), "typical_p": (1, 1.0), "dry_multiplier": (0, 0.0),
    "xtc_probability": (0, 0.0), "top_n_sigma": (-1, -1.0), "ignore_eos": (False,), "n_probs": (0,),
}


class Extra(BaseModel):
    """One input_extra chunk: another file's text, for context."""

    model_config = ConfigDict(strict=True, extra="ignore")
    text: str
    filename: str = "tmp"


class LlamaFields(GenerationFields):
    """The fields /infill and /completion share (others llama-server knows are read as NEUTRAL says)."""

    model_config = ConfigDict(strict=True, extra="allow")

    n_predict: int = -1
    n_indent: int = 0
    t_max_predict_ms: float = 0.0
    t_max_prompt_ms: float = -1.0
    samplers: list[str] | None = None
    cache_prompt: bool = True
    id_slot: int = -1
    response_fields: list[str] | None = None
    n_cmpl: int = 1
    json_schema: dict[str, Any] | None = None  # llama-server's own constraint fields (beside response_format)
    grammar: str | None = None                 # GBNF

    @field_validator("model")
    @classmethod
    def _no_name(cls, v: str | None) -> str | None:
        """An empty model name is none: llama.vim sends its `model_fim` setting, '' by default, every time."""
        return v or None

    def refused(self) -> None:
        """A 400 for values out of range; then the filters left out of `samplers` turned off (llama-server
        builds its chain from that list alone), so that the sampling read next is the one that applies."""
        if not 1 <= self.n_cmpl <= MAX_N:
            raise bad_request(f"n_cmpl: from 1 to {MAX_N} answers (made one after another), got {self.n_cmpl}",
                              "n_cmpl")
        if self.n_cmpl > 1 and self.stream:
            raise bad_request("n_cmpl: one answer when streaming", "n_cmpl")
        self.n = self.n_cmpl  # (OpenAI's n is not these endpoints' field: n_cmpl is)
        for name, neutral in NEUTRAL.items():
            value = (self.model_extra or {}).get(name)
            same_kind = isinstance(value, bool) == isinstance(neutral[0], bool)  # (True == 1 in Python)
            if value is not None and not (same_kind and value in neutral):
                raise bad_request(f"{name}: not supported here; only {neutral[0]!r} (no effect), got {value!r}", name)
        super().refused()
        if self.n_predict < -1:
            raise bad_request(f"n_predict: -1 (no limit), 0 (read the prompt only) or a number of tokens, got "
                              f"{self.n_predict}", "n_predict")
        if self.n_indent < 0:
            raise bad_request(f"n_indent: a column, 0 or more, got {self.n_indent}", "n_indent")
        if self.t_max_predict_ms < 0:
            raise bad_request(f"t_max_predict_ms: milliseconds, 0 (off) or more, got {self.t_max_predict_ms}",
                              "t_max_predict_ms")
        if self.id_slot < -1:
            raise bad_request(f"id_slot: -1 or a slot, got {self.id_slot}", "id_slot")
        if self.samplers is not None:
            used = set()
            for i, name in enumerate(self.samplers):
                if name not in SAMPLERS:
                    raise bad_request(f"samplers[{i}]: unknown sampler {name!r}; choose from {', '.join(SAMPLERS)}",
                                      "samplers")
                used.add(SAMPLERS[name])
            for name, value in OFF.items():
                if name not in used:
                    setattr(self, name, value)

    def shaping(self) -> dict[str, Any]:
        """The OpenAI fields' shaping, and llama.cpp's infill sampler where `samplers` names it."""
        out = super().shaping()
        if self.samplers is not None and any(SAMPLERS[name] == "infill" for name in self.samplers):
            out["infill"] = True
        return out

    def constraint(self) -> Constraint | None:
        """llama-server's json_schema or grammar (GBNF) field as a constraint (structured/), None if neither."""
        if self.json_schema is not None and self.grammar:
            raise bad_request("grammar: give json_schema or grammar, not both", "grammar")
        if self.json_schema is not None:
            return JsonSchema(self.json_schema, field="json_schema")
        return Grammar(self.grammar, "gbnf", field="grammar") if self.grammar else None

    def limit(self) -> int | None:
        """The answer's length; None: no limit of its own (0, the warm-up, is the caller's to handle)."""
        if self.n_predict > 0:
            return self.n_predict
        return self.max_tokens

    def top(self) -> int | None:
        return None  # no log-probabilities here

    def rules(self) -> list[StopRule]:
        out: list[StopRule] = []
        if self.n_indent > 0:
            out.append(IndentLimit(self.n_indent))
        if self.t_max_predict_ms > 0:
            out.append(TimeLimit(self.t_max_predict_ms))
        return out


class InfillRequest(LlamaFields):
    input_prefix: str
    input_suffix: str
    input_extra: list[Extra] = []
    prompt: str = ""


class TextRequest(LlamaFields):
    """/completion's body: a string prompt or token ids."""

    prompt: str | list[int]

    def prompt_text_or_ids(self) -> str | list[int]:
        if not self.prompt:
            raise bad_request("prompt: the prompt is empty", "prompt")
        return self.prompt


def flatten(body: dict[str, Any], paths: Sequence[str] | None) -> dict[str, Any]:
    """response_fields, as llama-server reads them: each "a/b" path that exists in `body`, under that path
    as its key (one that does not exist is left out); None or [] keep the whole body."""
    if not paths:
        return body
    out: dict[str, Any] = {}
    for path in paths:
        node: Any = body
        for key in path.split("/"):
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            out[path] = node
    return out


def stop_type(finish: FinishEvent | None) -> str:
    """llama-server's stop_type: eos, word (a stop string), limit (n_predict, a rule, the context) or none."""
    if finish is None:
        return "limit"  # n_predict 0
    if finish.stop_reason == "eos":
        return "eos"
    if finish.stop_reason == "stop" and finish.stop_word is not None:
        return "word"
    return "limit"


class LlamaReply:
    """The response objects of one /infill or /completion request (llama-server's shape, plus ssd-edge's
    `speculation`). tokens_cached is how many of the prompt's tokens the cache held (read no more);
    timings.prompt_n the rest, which were read."""

    def __init__(self, model: str, req: LlamaFields, n_prompt: int, truncated: bool, settings: dict[str, Any]) -> None:
        self.model, self.req, self.n_prompt, self.truncated = model, req, n_prompt, truncated
        self.settings = settings
        self.predicted = 0

    def partial(self, text: str, tokens: Sequence[int]) -> dict[str, Any]:
        """A streamed chunk of the answer."""
        self.predicted += len(tokens)
        return {"index": 0, "content": text, "tokens": list(tokens), "stop": False, "id_slot": 0,
                "tokens_predicted": self.predicted, "tokens_evaluated": self.n_prompt}

    def final(self, done: FinishEvent | Prefilled, cached: int | None, sources: Counter[str],
              streamed: bool = False, index: int = 0) -> dict[str, Any]:
        """The answer's last object: the whole content (empty when streamed: the chunks carried it), why it
        stopped, the cache's share and the timings; cut to response_fields."""
        finish = done if isinstance(done, FinishEvent) else None
        if finish is not None:
            st = finish.stats
            prompt_s = st.ttft_s or 0.0
            predicted_s = max(st.wall_s - prompt_s, 0.0)
            text, tokens = finish.text, list(finish.tokens)
        else:
            prompt_s, predicted_s, text, tokens = done.prompt_s, 0.0, "", []
        cached = cached if cached is not None else getattr(done, "cached", 0)
        prompt_n = self.n_prompt - cached
        timings = {"prompt_n": prompt_n, "prompt_ms": prompt_s * 1e3,
                   "prompt_per_token_ms": prompt_s * 1e3 / prompt_n if prompt_n else 0.0,
                   "prompt_per_second": prompt_n / prompt_s if prompt_s > 0 else 0.0,
                   "predicted_n": len(tokens), "predicted_ms": predicted_s * 1e3,
                   "predicted_per_token_ms": predicted_s * 1e3 / len(tokens) if tokens else 0.0,
                   "predicted_per_second": len(tokens) / predicted_s if predicted_s > 0 else 0.0}
        body = {"index": index, "content": "" if streamed else text, "tokens": [] if streamed else tokens,
                "id_slot": 0, "stop": True, "model": self.model, "tokens_predicted": len(tokens),
                "tokens_evaluated": self.n_prompt, "generation_settings": self.settings,
                "has_new_line": "\n" in text, "truncated": self.truncated, "stop_type": stop_type(finish),
                "stopping_word": (finish.stop_word or "") if finish is not None else "",
                "tokens_cached": cached, "timings": timings}
        if finish is not None:
            body["speculation"] = speculation(finish, sources)
        return flatten(body, self.req.response_fields)


def settings_of(req: LlamaFields, sampling: Any, max_tokens: int, mode: str) -> dict[str, Any]:
    """generation_settings: what the answer was made with, under llama-server's names."""
    return {"n_predict": max_tokens, "temperature": sampling.temperature, "top_k": sampling.top_k,
            "top_p": sampling.top_p, "min_p": sampling.min_p, "seed": sampling.seed,
            "samplers": req.samplers if req.samplers is not None else ["top_k", "top_p", "min_p", "temperature"],
            "stop": req.stops(), "n_indent": req.n_indent, "t_max_predict_ms": req.t_max_predict_ms,
            "stream": req.stream, "mode": mode}
