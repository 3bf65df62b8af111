"""The OpenAI wire format: request bodies in, response objects out, errors in OpenAI's shape.

Requests are validated strictly (a string where a number belongs is a 400, as at OpenAI) and
unknown fields are ignored (clients send their own extras, e.g. `user`, `cache_prompt`). Fields
that would change the answer in a way this server cannot honour (n > 1, logprobs, tools,
penalties, ...) are refused with a 400 that names them, rather than silently dropped.

Beyond OpenAI: llama.cpp's `top_k`, `min_p` and `speculative: {n_max, n_min, p_min}`, and
`mode` (ar | sd | lookup | ssd | auto). Every response carries a `speculation` object.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..config import MODES
from ..events import FinishEvent


class APIError(Exception):
    """An error answered as {"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


# ---------------------------------------------------------------- requests

class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class Speculative(_Body):
    """llama.cpp's per-request draft settings (n_max = k, n_min = --draft-min, p_min = --draft-p-min)."""

    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None


class StreamOptions(_Body):
    include_usage: bool = False


class _Generation(_Body):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    mode: str | None = None
    speculative: Speculative | None = None
    # accepted only at their neutral values (see refused())
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    best_of: int | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 16:
            raise bad_request("stop: at most 16 stop strings", "stop")
        return [s for s in stops if s]

    def refused(self) -> None:
        """A 400 for fields this server cannot honour (at their neutral values they are fine)."""
        if self.n != 1:
            raise bad_request(f"n: only n = 1 is supported (one answer per request), got {self.n}", "n")
        if self.best_of not in (None, 1):
            raise bad_request("best_of: only 1 is supported", "best_of")
        if self.logprobs or self.top_logprobs:
            raise bad_request("logprobs are not supported", "logprobs")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise bad_request(f"{name} is not supported (speculative decoding here is lossless "
                                  "for the model's own distribution); leave it at 0", name)
        if self.logit_bias:
            raise bad_request("logit_bias is not supported", "logit_bias")
        if self.tools or self.functions:
            raise bad_request("tools and function calling are not supported", "tools")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise bad_request("response_format: only {\"type\": \"text\"} is supported", "response_format")
        if self.mode is not None and self.mode not in MODES:
            raise bad_request(f"mode: choose one of {', '.join(MODES)}, got {self.mode!r}", "mode")


class _Part(_Body):
    type: str
    text: str | None = None


class Message(_Body):
    role: str
    content: str | list[_Part] | None = None
    name: str | None = None

    def text(self, i: int) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for p in self.content:
            if p.type != "text" or p.text is None:
                raise bad_request(f"messages[{i}].content: only text parts are supported, got {p.type!r}",
                                  f"messages.{i}.content")
            parts.append(p.text)
        return "".join(parts)


ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class ChatRequest(_Generation):
    messages: list[Message]
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def chat(self) -> list[dict[str, str]]:
        if not self.messages:
            raise bad_request("messages: give at least one message", "messages")
        out = []
        for i, m in enumerate(self.messages):
            if m.role not in ROLES:
                raise bad_request(f"messages[{i}].role: choose one of {', '.join(ROLES)}, got {m.role!r}",
                                  f"messages.{i}.role")
            out.append({"role": ROLES[m.role], "content": m.text(i)})
        return out

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Generation):
    prompt: str | list[str] | list[int]
    echo: bool = False
    suffix: str | None = None

    def prompt_text_or_ids(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str):
            if len(p) != 1:
                raise bad_request("prompt: one prompt per request (a list of several is a batch, like n > 1)",
                                  "prompt")
            p = p[0]
        if not p:
            raise bad_request("prompt: the prompt is empty", "prompt")
        if self.echo:
            raise bad_request("echo is not supported", "echo")
        if self.suffix:
            raise bad_request("suffix is not supported; put the model's fill-in-the-middle tokens in the prompt",
                              "suffix")
        return p

    def limit(self) -> int | None:
        return self.max_tokens


def parse(kind: type[_Body], data: Any) -> Any:
    """Validate a decoded JSON body, or a 400 naming the first field at fault."""
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        return kind.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        param = param_name(err["loc"])
        if err["type"] == "missing":
            raise bad_request(f"{param}: this field is required", param) from None
        raise bad_request(f"{param}: {err['msg'].lower()}, got {_short(err.get('input'))}", param) from None


def param_name(loc: tuple[Any, ...]) -> str:
    """('messages', 0, 'content', 'str') -> 'messages.0.content' (pydantic adds union members to locs)."""
    out = []
    for part in loc:
        if isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part or "-" in part):
            break
        out.append(str(part))
    return ".".join(out) or "body"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------- responses

FINISH_REASON = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}
PROPOSER = {"none": "plain", "draft": "draft", "prespec": "prepared", "ngram": "ngram"}


def new_id(kind: Literal["chat", "text"]) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def speculation(finish: FinishEvent, sources: Counter[str]) -> dict[str, Any]:
    """How this answer was decoded: acceptance, pre-speculation hit rate, which proposer served
    each round (plain, ngram, draft, prepared), and where each token came from.

    rounds and rounds_by_proposer count every round; planner_decisions (mode auto) counts the rounds
    the planner chose. A round with no room to draft (the last token before max_tokens or a full context)
    is a plain step taken without asking it, so planner_decisions may sum to one less than rounds."""
    st, pre = finish.stats, finish.stats.prespec
    out = {
        "mode": st.mode,
        "acceptance_rate": st.acceptance_rate,
        "drafted": st.drafted,
        "accepted": st.accepted,
        "hit_rate": pre.hit_rate,
        "hit_rate_health": pre.health,
        "prespec": {"lookups": pre.lookups, "hits": pre.hits, "partial_hits": pre.partial_hits, "misses": pre.misses},
        "rounds": st.rounds,
        "rounds_by_proposer": {PROPOSER.get(k, k): v for k, v in st.speculators.items()},
        "tokens_by_source": dict(sources),
        "tokens_per_s": st.tokens_per_s,
        "ttft_s": st.ttft_s,
        "seed": st.seed,
    }
    if st.auto is not None:
        out["planner_decisions"] = dict(st.auto.decisions)
    return out


class Reply:
    """Builds the response objects of one request (whole or streamed chunks) in one place."""

    def __init__(self, kind: Literal["chat", "text"], model: str, prompt_tokens: int) -> None:
        self.kind, self.model, self.prompt_tokens = kind, model, prompt_tokens
        self.id = new_id(kind)
        self.created = int(time.time())

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, finish: FinishEvent, sources: Counter[str]) -> dict[str, Any]:
        reason = FINISH_REASON.get(finish.stop_reason, "stop")
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": finish.text}, "logprobs": None,
                      "finish_reason": reason}
            out = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": finish.text, "logprobs": None, "finish_reason": reason}
            out = self._head("text_completion")
        return {**out, "choices": [choice], "usage": usage(self.prompt_tokens, len(finish.tokens)),
                "speculation": speculation(finish, sources)}

    def chunk(self, text: str | None = None, *, role: bool = False, finish_reason: str | None = None
              ) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def last_chunk(self, finish: FinishEvent, sources: Counter[str]) -> dict[str, Any]:
        """The chunk that carries the finish reason (and the `speculation` object)."""
        out = self.chunk(finish.tail or ("" if self.kind == "text" else None),
                         finish_reason=FINISH_REASON.get(finish.stop_reason, "stop"))
        out["speculation"] = speculation(finish, sources)
        return out

    def usage_chunk(self, finish: FinishEvent) -> dict[str, Any]:
        """stream_options.include_usage: one more chunk with no choices and the usage, as OpenAI sends it."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(self.prompt_tokens, len(finish.tokens))}
