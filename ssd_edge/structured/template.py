"""A GGUF's own Jinja chat template, rendered as Hugging Face renders it: for prompts with tools.

llama.cpp's `llama_chat_apply_template` takes roles and text only, so a prompt that lists tools, or
a history that holds the model's tool calls and their results, is rendered here from the template
text in the model's metadata (`tokenizer.chat_template`). Hugging Face's environment is the
reference every template is written against, so this one copies it:

- a sandboxed environment (ImmutableSandboxedEnvironment: a template is data from a downloaded
  file, and must not reach Python's internals), trim_blocks and lstrip_blocks;
- `raise_exception(msg)` for templates that refuse a message order;
- `tojson` as json.dumps with ensure_ascii=False and no HTML escaping (jinja2's own filter writes
  `<` as `\\u003c`, which would change a tool's description in the prompt), `indent` supported.

Messages are passed as OpenAI sends them, with one repair: a history tool call's `arguments` is a
JSON string at OpenAI, while templates render it with `| tojson`, which would encode it a second
time ("{\\"city\\": ...}"); it is parsed back into the object first.

Plain role/text chats keep llama.cpp's renderer (Pair.render_chat): on Qwen2.5 both agree byte for
byte where a system message is given, but without one the template adds its default system turn
("You are Qwen, created by Alibaba Cloud...") and llama.cpp's chatml does not, so rendering every
chat here would change every existing prompt.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Sequence

from .constraint import ConstraintError


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    """Hugging Face's tojson: no ASCII escaping, no HTML escaping (markupsafe is not involved)."""
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


@lru_cache(maxsize=8)
def _compiled(text: str) -> Any:
    """One compiled template per template text (a server renders every request with the same one)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    return env.from_string(text)


def history(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as a template expects them: each assistant tool call's `arguments` an object
    (OpenAI sends a JSON string; one that is not JSON is kept as the string)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = {**m, "tool_calls": [_with_object_arguments(c) for c in calls]}
        out.append(m)
    return out


def _with_object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function", call)
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return call
        fn = {**fn, "arguments": args}
        return {**call, "function": fn} if "function" in call else fn
    return call


class ChatTemplate:
    """One model's Jinja chat template, with the start and end tokens' text it may write."""

    def __init__(self, text: str, bos_token: str = "", eos_token: str = "") -> None:
        self.text = text
        self.bos_token, self.eos_token = bos_token, eos_token

    @property
    def calls_tools_in_tags(self) -> bool:
        """Whether the template's own tool-call syntax is Qwen's (Hermes') `<tool_call>` tags."""
        return "<tool_call>" in self.text

    def render(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True) -> str:
        """The prompt text; a template that fails (raise_exception, an undefined it cannot take) is a
        ConstraintError on `messages`, naming the template's message."""
        from jinja2.exceptions import TemplateError

        try:
            return _compiled(self.text).render(messages=history(messages), tools=list(tools) if tools else None,
                                               add_generation_prompt=add_generation_prompt,
                                               bos_token=self.bos_token, eos_token=self.eos_token)
        except TemplateError as e:
            raise ConstraintError("messages", f"the model's chat template refused them: {e}") from None
