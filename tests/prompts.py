"""Shared test prompts: code, prose and chat, chosen to run long (128+ tokens)
and to vary how predictable the continuation is (repetitive code helps the
n-gram drafter, open prose and chat spread the target's distribution)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Prompt:
    name: str
    kind: str                                   # "code", "prose" or "chat"
    text: str | None = None                     # a raw completion prompt
    messages: tuple[dict[str, str], ...] | None = None  # or chat messages (rendered by the GGUF's template)

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for Engine.generate / Engine.complete."""
        if self.messages is not None:
            return {"messages": [dict(m) for m in self.messages]}
        return {"prompt": self.text}


def _chat(*turns: tuple[str, str]) -> tuple[dict[str, str], ...]:
    return tuple({"role": role, "content": content} for role, content in turns)


PROMPTS: list[Prompt] = [
    Prompt("fibonacci", "code",
           'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    Prompt("quicksort", "code",
           "# Quicksort in Python, with a partition helper and tests\n\ndef partition(items, lo, hi):\n"),
    Prompt("js_fetch", "code",
           "// Fetch a JSON document and retry on failure\nasync function fetchWithRetry(url, retries = 3) {\n"),
    Prompt("sql_schema", "code",
           "-- Schema for a small library database\nCREATE TABLE authors (\n    id INTEGER PRIMARY KEY,\n"),
    Prompt("rust_struct", "code",
           "/// A 2D point with basic vector arithmetic.\n#[derive(Debug, Clone, Copy, PartialEq)]\n"
           "pub struct Point {\n    pub x: f64,\n    pub y: f64,\n}\n\nimpl Point {\n"),
    Prompt("lighthouse", "prose",
           "The old lighthouse keeper climbed the spiral stairs for the last time. Below him, the sea"),
    Prompt("history", "prose",
           "The printing press, introduced in Europe in the fifteenth century, changed the way ideas spread."),
    Prompt("recipe", "prose",
           "How to bake a simple loaf of bread at home.\n\nIngredients:\n- 500 g flour\n"),
    Prompt("chat_explain", "chat",
           messages=_chat(("user", "Explain in a few paragraphs why the sky is blue."))),
    Prompt("chat_code", "chat",
           messages=_chat(("system", "You are a concise programming assistant."),
                          ("user", "Write a Python function that checks whether a string is a palindrome, "
                                   "and explain it."))),
    Prompt("chat_multi", "chat",
           messages=_chat(("user", "What is the capital of France?"),
                          ("assistant", "The capital of France is Paris."),
                          ("user", "Tell me three interesting facts about it."))),
    Prompt("chat_list", "chat",
           messages=_chat(("user", "List ten common fruits, one per line, each with its usual colour."))),
]
