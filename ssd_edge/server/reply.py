"""The OpenAI response objects of one request: whole, or as streamed chunks, for n answers.

An answer's text reaches the client as `content`, or, where the request offered tools, through a
calls.Reader that splits it into content and `tool_calls` (finish_reason "tool_calls" when an answer
that ended on its own made calls). Log-probabilities travel in OpenAI's two shapes: chat's
`logprobs.content[]` (token, logprob, bytes, top_logprobs) and the completions endpoint's parallel
lists (tokens, token_logprobs, top_logprobs as {token: logprob}, text_offset in the choice's text).
Usage counts the prompt once and every answer's tokens; `speculation` describes the first answer.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

from ..events import FinishEvent, TokenLogprob
from ..structured.calls import Arguments, CallStart, Piece, Reader, Text

FINISH_REASON = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}
TOOL_CALLS = "tool_calls"  # the finish reason of an answer that ended on its own with calls
PROPOSER = {"none": "plain", "draft": "draft", "prespec": "prepared", "ngram": "ngram"}


def new_id(kind: Literal["chat", "text"]) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def speculation(finish: FinishEvent, sources: Counter[str]) -> dict[str, Any]:
    """How this answer was decoded: acceptance, pre-speculation hit rate, which proposer served
    each round (plain, ngram, draft, prepared), where each token came from, and how many tokens a
    grammar forced (response_format, tools).

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
        "forced": st.forced,  # tokens the answer's grammar forced (proposed without a model)
        "tokens_per_s": st.tokens_per_s,
        "ttft_s": st.ttft_s,
        "seed": st.seed,
    }
    if st.auto is not None:
        out["planner_decisions"] = dict(st.auto.decisions)
    return out


@dataclass
class Answer:
    """One choice as it is relayed: its finish, its tokens' sources, its reader (tools offered)."""

    index: int
    reader: Reader | None = None
    sources: Counter[str] = field(default_factory=Counter)
    offset: int = 0  # characters of the choice's text already streamed (completions' text_offset)


class Reply:
    """Builds the response objects of one request (whole or streamed chunks) in one place.
    `piece` gives a token's bytes; `top` is the number of alternatives asked per token (None: no
    log-probabilities)."""

    def __init__(self, kind: Literal["chat", "text"], model: str, prompt_tokens: int,
                 piece: Callable[[int], bytes] | None = None, top: int | None = None) -> None:
        self.kind, self.model, self.prompt_tokens = kind, model, prompt_tokens
        self.piece, self.top = piece, top
        self.id = new_id(kind)
        self.created = int(time.time())

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def reason(self, finish: FinishEvent, answer: Answer) -> str:
        reason = FINISH_REASON.get(finish.stop_reason, "stop")
        return TOOL_CALLS if reason == "stop" and answer.reader is not None and answer.reader.calls else reason

    # ------------------------------------------------------------ whole
    def whole(self, done: Sequence[tuple[Answer, FinishEvent]]) -> dict[str, Any]:
        choices = []
        for answer, finish in done:
            logprobs = self.logprobs(finish.logprobs, answer) if self.top is not None else None
            if self.kind == "chat":
                message: dict[str, Any] = {"role": "assistant", "content": finish.text}
                reader = answer.reader
                if reader is not None:
                    message["content"] = reader.content or None
                    if reader.calls:
                        message["tool_calls"] = [c.as_openai() for c in reader.calls]
                choices.append({"index": answer.index, "message": message, "logprobs": logprobs,
                                "finish_reason": self.reason(finish, answer)})
            else:
                choices.append({"index": answer.index, "text": finish.text, "logprobs": logprobs,
                                "finish_reason": self.reason(finish, answer)})
        first_answer, first = done[0]
        out = self._head("chat.completion" if self.kind == "chat" else "text_completion")
        return {**out, "choices": choices, "usage": self.usage(f for _, f in done),
                "speculation": speculation(first, first_answer.sources)}

    def usage(self, finishes: Any) -> dict[str, int]:
        return usage(self.prompt_tokens, sum(len(f.tokens) for f in finishes))

    # ------------------------------------------------------------ streamed
    def chunk(self, text: str | None = None, *, role: bool = False, finish_reason: str | None = None,
              index: int = 0, delta: dict[str, Any] | None = None, logprobs: Any = None) -> dict[str, Any]:
        if self.kind == "chat":
            d: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                d["content"] = text
            d.update(delta or {})
            choice = {"index": index, "delta": d, "logprobs": logprobs, "finish_reason": finish_reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def chunks(self, answer: Answer, text: str, logprobs: Sequence[TokenLogprob] | None,
               final: bool = False) -> list[dict[str, Any]]:
        """The chunks for one event's text (and its tokens' log-probabilities, on the first chunk);
        `final`: the reader is finished after this text."""
        lp = self.logprobs(logprobs, answer) if self.top is not None and logprobs else None
        reader = answer.reader
        if self.kind == "text" or reader is None:
            if not text and lp is None:
                return []
            return [self.chunk(text if text or self.kind == "text" else None, index=answer.index, logprobs=lp)]
        pieces = reader.feed(text) + (reader.finish() if final else [])
        out = [self.chunk(index=answer.index, delta=delta(p)) for p in pieces]
        if lp is not None:
            if out:
                out[0]["choices"][0]["logprobs"] = lp
            else:
                out.append(self.chunk(index=answer.index, logprobs=lp))
        return out

    def last_chunk(self, answer: Answer, finish: FinishEvent) -> dict[str, Any]:
        """The chunk that carries the finish reason (and the `speculation` object); its text is the
        held-back tail, which a reader has already taken (chunks(..., final=True))."""
        text = None if answer.reader is not None else finish.tail or ("" if self.kind == "text" else None)
        out = self.chunk(text, finish_reason=self.reason(finish, answer), index=answer.index)
        out["speculation"] = speculation(finish, answer.sources)
        return out

    def usage_chunk(self, finishes: Sequence[FinishEvent]) -> dict[str, Any]:
        """stream_options.include_usage: one more chunk with no choices and the usage, as OpenAI sends it."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": self.usage(finishes)}

    # ------------------------------------------------------------ log-probabilities
    def logprobs(self, entries: Sequence[TokenLogprob] | None, answer: Answer) -> dict[str, Any] | None:
        if entries is None or self.piece is None or self.top is None:
            return None
        top = self.top
        if self.kind == "chat":
            return {"content": [{**self._token(e.token, e.logprob),
                                 "top_logprobs": [self._token(t, lp) for t, lp in e.top[:top]]} for e in entries]}
        texts = [self._text(e.token) for e in entries]
        offsets = []
        for t in texts:
            offsets.append(answer.offset)
            answer.offset += len(t)
        return {"tokens": texts, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{self._text(t): lp for t, lp in e.top[:top]} for e in entries],
                "text_offset": offsets}

    def _text(self, token: int) -> str:
        assert self.piece is not None
        return self.piece(token).decode("utf-8", errors="replace")

    def _token(self, token: int, logprob: float) -> dict[str, Any]:
        assert self.piece is not None
        raw = self.piece(token)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}


def delta(piece: Piece) -> dict[str, Any]:
    """A reader's piece as a chat chunk's delta (OpenAI's tool-call deltas: the first of a call
    carries its index, id, type and name with empty arguments, the next ones argument fragments)."""
    if isinstance(piece, Text):
        return {"content": piece.text}
    if isinstance(piece, CallStart):
        return {"tool_calls": [{"index": piece.index, "id": piece.id, "type": "function",
                                "function": {"name": piece.name, "arguments": ""}}]}
    assert isinstance(piece, Arguments)
    return {"tool_calls": [{"index": piece.index, "function": {"arguments": piece.text}}]}
