"""The OpenAI wire format: request bodies in, errors in OpenAI's shape (responses: reply.py).

Requests are validated strictly (a string where a number belongs is a 400, as at OpenAI) and
unknown fields are ignored (clients send their own extras, e.g. `user`, `cache_prompt`). Fields
that would change the answer in a way this server cannot honour (best_of, the deprecated
`functions`) are refused with a 400 that names them, rather than silently dropped. Each endpoint
reads logprobs in its own OpenAI shape (top()): chat's `logprobs: true` + `top_logprobs`, the
completions endpoint's `logprobs: N`. What the answer must look like (response_format, tools,
tool_choice) is read by structured/request.py.

Beyond OpenAI: llama.cpp's `top_k`, `min_p` and `speculative: {n_max, n_min, p_min}`, and
`mode` (ar | sd | lookup | ssd | auto). Every response carries a `speculation` object.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..config import MODES


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


MAX_N = 8              # answers per request (made one after another: n answers take n times as long)
MAX_TOP_LOGPROBS = 20  # OpenAI's limit


class GenerationFields(_Body):
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
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    # refused (see refused())
    best_of: int | None = None
    functions: list[Any] | None = None

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 16:
            raise bad_request("stop: at most 16 stop strings", "stop")
        return [s for s in stops if s]

    def refused(self) -> None:
        """A 400 for fields this server cannot honour, or values out of their range."""
        if not 1 <= self.n <= MAX_N:
            raise bad_request(f"n: from 1 to {MAX_N} answers per request, got {self.n}", "n")
        if self.best_of not in (None, 1):
            raise bad_request("best_of: only 1 is supported (ask for n answers instead)", "best_of")
        if self.functions:
            raise bad_request("functions: the deprecated function-calling fields are not supported; send tools",
                              "functions")
        if self.mode is not None and self.mode not in MODES:
            raise bad_request(f"mode: choose one of {', '.join(MODES)}, got {self.mode!r}", "mode")

    def shaping(self) -> dict[str, Any]:
        """The sampling changes the request asks for beyond the filters: penalties and logit_bias
        (OpenAI's string token ids as ints; their range is SamplingConfig's to check)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in ("presence_penalty", "frequency_penalty")
                               if getattr(self, k) is not None}
        if self.logit_bias:
            bias = {}
            for key, value in self.logit_bias.items():
                if not key.strip().isdigit():
                    raise bad_request(f"logit_bias: keys are token ids (as strings), got {key!r}", "logit_bias")
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise bad_request(f"logit_bias: the bias of token {key} is a number from -100 to 100, got "
                                      f"{short(value)}", "logit_bias")
                bias[int(key)] = float(value)
            out["logit_bias"] = bias
        return out


class _Part(_Body):
    type: str
    text: str | None = None


class _Function(_Body):
    name: str
    arguments: str | dict[str, Any] = "{}"  # OpenAI sends a JSON string


class _ToolCall(_Body):
    id: str | None = None
    type: str = "function"
    function: _Function


class Message(_Body):
    role: str
    content: str | list[_Part] | None = None
    name: str | None = None
    tool_calls: list[_ToolCall] | None = None  # an assistant's calls, in the history
    tool_call_id: str | None = None            # a tool message: the call it answers

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

    def as_dict(self, i: int) -> dict[str, Any]:
        """The message as the renderers take it: role and text, and a tool call's or result's fields."""
        out: dict[str, Any] = {"role": ROLES[self.role], "content": self.text(i)}
        if self.tool_calls:
            if self.role != "assistant":
                raise bad_request(f"messages[{i}].tool_calls: only an assistant's message holds tool calls",
                                  f"messages.{i}.tool_calls")
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                 for c in self.tool_calls]
        if self.role == "tool":
            out.update({k: v for k, v in (("tool_call_id", self.tool_call_id), ("name", self.name)) if v})
        return out


ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class ChatRequest(GenerationFields):
    messages: list[Message]
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def chat(self) -> list[dict[str, Any]]:
        if not self.messages:
            raise bad_request("messages: give at least one message", "messages")
        out = []
        for i, m in enumerate(self.messages):
            if m.role not in ROLES:
                raise bad_request(f"messages[{i}].role: choose one of {', '.join(ROLES)}, got {m.role!r}",
                                  f"messages.{i}.role")
            out.append(m.as_dict(i))
        return out

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def top(self) -> int | None:
        """Chat's shape: logprobs true or false, top_logprobs 0 to 20 (only with logprobs)."""
        if self.logprobs is not None and not isinstance(self.logprobs, bool):
            raise bad_request("logprobs: true or false for chat (top_logprobs says how many alternatives)",
                              "logprobs")
        if self.top_logprobs is not None:
            if not self.logprobs:
                raise bad_request("top_logprobs: needs \"logprobs\": true", "top_logprobs")
            if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
                raise bad_request(f"top_logprobs: from 0 to {MAX_TOP_LOGPROBS}, got {self.top_logprobs}",
                                  "top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(GenerationFields):
    prompt: str | list[str] | list[int]
    echo: bool = False
    suffix: str | None = None  # fill in the middle between prompt and suffix (server/editors.py)

    def prompt_text_or_ids(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str):
            if len(p) != 1:
                raise bad_request("prompt: one prompt per request (a list of several is a batch, like n > 1)",
                                  "prompt")
            p = p[0]
        if not p and self.suffix is None:  # (with a suffix, an empty prefix is the top of a file)
            raise bad_request("prompt: the prompt is empty", "prompt")
        if self.echo:
            raise bad_request("echo is not supported", "echo")
        if self.tools or self.tool_choice is not None:
            raise bad_request("tools: only /v1/chat/completions calls tools", "tools")
        return p

    def limit(self) -> int | None:
        return self.max_tokens

    def top(self) -> int | None:
        """The completions shape: logprobs is the number of alternatives per token, 0 to 20."""
        if self.top_logprobs is not None:
            raise bad_request("top_logprobs: /v1/completions takes the count in logprobs", "top_logprobs")
        if self.logprobs is None:
            return None
        if isinstance(self.logprobs, bool) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise bad_request(f"logprobs: the number of alternatives per token, 0 to {MAX_TOP_LOGPROBS}, got "
                              f"{self.logprobs!r}", "logprobs")
        return self.logprobs


async def read_json(request: Any) -> Any:
    """A request's body as JSON (a starlette Request), or a 400 saying what is wrong with it."""
    raw = await request.body()
    if not raw.strip():
        raise bad_request("the request body is empty; send a JSON object")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise bad_request(f"the request body is not valid JSON: {e}") from None


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
        raise bad_request(f"{param}: {err['msg'].lower()}, got {short(err.get('input'))}", param) from None


def param_name(loc: tuple[Any, ...]) -> str:
    """('messages', 0, 'content', 'str') -> 'messages.0.content' (pydantic adds union members to locs)."""
    out = []
    for part in loc:
        if isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part or "-" in part):
            break
        out.append(str(part))
    return ".".join(out) or "body"


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
