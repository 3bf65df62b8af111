"""The editors' endpoints, in llama-server's own shape (llama_protocol.py):

    POST /infill       fill in the middle: input_prefix, input_suffix, input_extra, prompt (llama.vim, llama.vscode)
    POST /completion   a prompt the client templated itself, or token ids (Continue's and Tabby's llama.cpp providers)

and fim_prompt(), the layout (infill.py) that /infill and /v1/completions' `suffix` both read. A request is
checked as the OpenAI endpoints check theirs (app.API: the model, mode and sampling), its prompt laid out
at the engine's n_batch and n_ctx, and queued on the scheduler as one job; n_predict 0 is a job that reads
the prompt into the cache only (the editors' warm-up). A client that disconnects has its job withdrawn,
as on the OpenAI endpoints: stopped at the next round (or the next prompt batch), or dropped from the queue.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import replace
from typing import Any, AsyncIterator, Sequence

import anyio
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import ConfigError
from ..events import FinishEvent, Prefilled, TokenEvent
from ..infill import Chunk, InfillPrompt, layout
from .llama_protocol import InfillRequest, LlamaFields, LlamaReply, TextRequest, settings_of
from .protocol import bad_request, parse, read_json
from .relay import ended, on_disconnect, submit
from .scheduler import Failure, Scheduler, Work


def fim_prompt(engine: Any, prefix: str, suffix: str, *, prompt: str = "", extra: Sequence[Chunk] = (),
               n_predict: int = 0, param: str = "input_prefix") -> InfillPrompt:
    """The FIM layout of the engine's target at its n_batch and n_ctx; a 400 naming `param` where the model
    has no FIM tokens."""
    cfg = engine.config
    try:
        return layout(engine.target, prefix, suffix, prompt=prompt, extra=extra, n_batch=cfg.n_batch,
                      n_ctx=cfg.n_ctx, n_predict=n_predict)
    except ConfigError as e:
        raise bad_request(str(e), param) from None


class Editors:
    """The routes, over the OpenAI face's API (its engine, scheduler and checks)."""

    def __init__(self, api: Any) -> None:
        self.api = api

    async def infill(self, request: Request) -> Response:
        req: InfillRequest = parse(InfillRequest, await read_json(request))
        self.api.check(req)
        extra = [Chunk(c.text, c.filename) for c in req.input_extra]
        laid = await run_in_threadpool(fim_prompt, self.api.engine, req.input_prefix, req.input_suffix,
                                       prompt=req.prompt, extra=extra, n_predict=req.limit() or 0)
        return await self._answer(request, req, list(laid.tokens), laid.truncated, "input_prefix")

    async def completion(self, request: Request) -> Response:
        req: TextRequest = parse(TextRequest, await read_json(request))
        self.api.check(req)
        prompt = req.prompt_text_or_ids()
        if isinstance(prompt, str):  # special tokens parsed, as llama-server does: a client's own FIM template
            tokens = await run_in_threadpool(self.api.engine.tokenize, prompt, parse_special=True)
        else:
            n_vocab = self.api.engine.n_vocab
            if any(not 0 <= t < n_vocab for t in prompt):
                raise bad_request(f"prompt: token ids must be in [0, {n_vocab})", "prompt")
            tokens = list(prompt)
        return await self._answer(request, req, tokens, False, "prompt")

    async def _answer(self, request: Request, req: LlamaFields, tokens: list[int], truncated: bool,
                      param: str) -> Response:
        api = self.api
        shape = api.shape(req, None)
        own = req.constraint()
        if own is not None:
            if shape.constraint is not None:
                raise bad_request("response_format: give it or json_schema / grammar, not both", "response_format")
            shape = replace(shape, constraint=own)
        if shape.constraint is not None:
            await api.compile(shape)
        works = [replace(w, stop=[*w.stop, *req.rules()], max_tokens=0 if req.n_predict == 0 else w.max_tokens)
                 for w in api.works(req, tokens, param, shape, None)]  # n_cmpl of them (seed, seed + 1, ...)
        work = works[0]
        reply = LlamaReply(api.model_id, req, len(tokens), truncated,
                           settings_of(req, work.sampling, work.max_tokens, work.mode or api.base.mode))
        relay = LlamaRelay(api.scheduler, works, reply)
        if req.stream:
            return EventSourceResponse(relay.stream(), ping=15, shutdown_event=anyio.Event(),
                                       shutdown_grace_period=api.stream_grace_s)
        return await relay.whole(request)


def answered(item: Any) -> bool:
    """Whether a job's item is its answer (not a cancelled generation or warm-up, not a failure)."""
    return (isinstance(item, FinishEvent) and item.stop_reason != "cancelled") or \
        (isinstance(item, Prefilled) and not item.cancelled)


class LlamaRelay:
    """One request's jobs relayed to its client: one JSON object (a list of them for n_cmpl > 1, each answer
    queued when the one before it ends, on its own seed), or one answer's chunks as server-sent events
    ending in the final object (llama-server sends no `[DONE]` on these endpoints)."""

    def __init__(self, scheduler: Scheduler, works: Sequence[Work], reply: LlamaReply) -> None:
        self.scheduler, self.reply, self.works = scheduler, reply, list(works)
        self.job = submit(scheduler, self.works[0])  # a full queue is a 503 before any header is sent
        self.sources: Counter[str] = Counter()

    def withdraw(self) -> None:
        self.scheduler.withdraw(self.job)

    def _error(self, item: Any) -> Any:
        return ended(self.job, Failure("withdrawn") if isinstance(item, Prefilled) else item)

    async def whole(self, request: Request) -> Response:
        watcher = asyncio.ensure_future(on_disconnect(request, self.withdraw))
        done: list[dict[str, Any]] = []
        try:
            for i, work in enumerate(self.works):
                if i:
                    self.job, self.sources = submit(self.scheduler, work), Counter()
                async for item in self.job.items():
                    if isinstance(item, TokenEvent):
                        self.sources.update(item.provenance)
                    elif answered(item):
                        done.append(self.reply.final(item, self.job.cached, self.sources, index=i))
                    else:
                        raise self._error(item)
            return JSONResponse(done if len(done) > 1 else done[0])
        finally:
            watcher.cancel()
            self.withdraw()

    async def stream(self) -> AsyncIterator[str]:
        reply = self.reply
        try:
            async for item in self.job.items():
                if isinstance(item, TokenEvent):
                    self.sources.update(item.provenance)
                    yield json.dumps(reply.partial(item.text, item.tokens), ensure_ascii=False)
                elif answered(item):
                    if isinstance(item, FinishEvent) and item.tail:
                        yield json.dumps(reply.partial(item.tail, ()), ensure_ascii=False)
                    yield json.dumps(reply.final(item, self.job.cached, self.sources, streamed=True), ensure_ascii=False)
                    return
                else:  # headers are sent: the error travels as an event
                    yield json.dumps(self._error(item).body())
                    return
        finally:  # also when the client disconnected and sse-starlette cancelled this generator
            self.withdraw()
