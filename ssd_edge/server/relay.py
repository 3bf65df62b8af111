"""A request's jobs relayed to its client: n answers, one after another, whole or streamed.

Each answer is its own job on the scheduler (its own seed: seed, seed + 1, ... where the request
gives one), queued when the one before it ends, so other clients' requests keep their place in the
line. A whole response waits for every answer; a stream sends each answer's chunks under its
choice index, then the usage (stream_options.include_usage) and `[DONE]`. A client that goes away
has its running job withdrawn, and no further answer is queued.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Callable, Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import ContextFullError, SSDEdgeError
from ..events import FinishEvent, TokenEvent
from ..structured.calls import Reader
from .protocol import APIError, bad_request
from .reply import Answer, Reply
from .scheduler import Failure, Job, QueueFull, Scheduler, ShuttingDown, Work

CLIENT_GONE = 499     # nginx's "client closed request": counted in /metrics, never seen by the client


def submit(scheduler: Scheduler, work: Work) -> Job:
    """The job queued, or the 503 a full queue or a stopping server answers."""
    try:
        return scheduler.submit(work, asyncio.get_running_loop())
    except QueueFull as e:
        raise APIError(503, f"the server is busy ({scheduler.max_queue} requests already wait for the "
                       f"model); retry in {e.retry_after} s", type="server_error", code="queue_full",
                       headers={"Retry-After": str(e.retry_after)}) from None
    except ShuttingDown:
        raise shutting_down() from None


class Relay:
    """The answers of one request: `works` (one per choice), each read by a fresh reader where the
    request offered tools."""

    def __init__(self, scheduler: Scheduler, works: Sequence[Work], reply: Reply,
                 reader: Callable[[], Reader | None]) -> None:
        self.scheduler, self.works, self.reply, self.reader = scheduler, list(works), reply, reader
        self.first = submit(scheduler, self.works[0])  # a full queue is a 503 before any header is sent
        self.job: Job | None = self.first              # the job running for this request now

    def _jobs(self) -> Any:
        for i, work in enumerate(self.works):
            self.job = self.first if i == 0 else submit(self.scheduler, work)
            yield i, self.job

    def withdraw(self) -> None:
        if self.job is not None:
            self.scheduler.withdraw(self.job)

    async def whole(self, request: Request) -> Response:
        watcher = asyncio.ensure_future(self._watch(request))
        done: list[tuple[Answer, FinishEvent]] = []
        try:
            for i, job in self._jobs():
                answer = Answer(i, self.reader())
                async for item in job.items():
                    if isinstance(item, TokenEvent):
                        answer.sources.update(item.provenance)
                    elif isinstance(item, FinishEvent) and item.stop_reason != "cancelled":
                        if answer.reader is not None:
                            answer.reader.feed(item.text)
                            answer.reader.finish()
                        done.append((answer, item))
                    else:
                        raise ended(job, item)
            return JSONResponse(self.reply.whole(done))
        finally:
            watcher.cancel()
            self.withdraw()

    async def _watch(self, request: Request) -> None:
        await on_disconnect(request, self.withdraw)  # its items end in a Failure, and no further answer is queued

    async def stream(self, include_usage: bool) -> AsyncIterator[str]:
        """The jobs as server-sent events: each answer's chunks and its finishing chunk, [DONE] (or an
        error object)."""
        reply = self.reply
        finishes: list[FinishEvent] = []
        try:
            for i, job in self._jobs():
                answer = Answer(i, self.reader())
                if reply.kind == "chat":
                    yield json.dumps(reply.chunk("", role=True, index=i))
                async for item in job.items():
                    if isinstance(item, TokenEvent):
                        answer.sources.update(item.provenance)
                        for chunk in reply.chunks(answer, item.text, item.logprobs):
                            yield json.dumps(chunk, ensure_ascii=False)
                    elif isinstance(item, FinishEvent) and item.stop_reason != "cancelled":
                        if answer.reader is not None:  # the held-back tail goes through the reader
                            for chunk in reply.chunks(answer, item.tail, None, final=True):
                                yield json.dumps(chunk, ensure_ascii=False)
                        yield json.dumps(reply.last_chunk(answer, item), ensure_ascii=False)
                        finishes.append(item)
                    else:  # headers are sent: the error travels as an event, as llama-server sends it
                        yield json.dumps(ended(job, item).body())
                        return
            if include_usage:
                yield json.dumps(reply.usage_chunk(finishes))
            yield "[DONE]"
        except APIError as e:  # the next answer could not be queued
            yield json.dumps(e.body())
        finally:  # also when the client disconnected and sse-starlette cancelled this generator
            self.withdraw()


async def on_disconnect(request: Request, then: Callable[[], None]) -> None:
    """Call `then` when the client disconnects (the body is read, so the next message is that)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            then()
            return


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down", type="server_error", code="shutting_down")


def ended(job: Job, item: FinishEvent | Failure) -> APIError:
    """The error for a job that produced no answer: stopped, withdrawn, or failed."""
    if isinstance(item, FinishEvent) or item.reason in ("withdrawn", "shutdown"):
        if job.stopping:
            done = f" after {len(item.tokens)} tokens" if isinstance(item, FinishEvent) else ""
            e = shutting_down()
            e.message = f"the server is shutting down; the generation was stopped{done}"
            return e
        return APIError(CLIENT_GONE, "the client closed the request", type="cancelled")
    err = item.error
    if isinstance(err, ContextFullError):
        return bad_request(str(err), code="context_length_exceeded")
    if isinstance(err, SSDEdgeError) and err.exit_code == 2:  # ConfigError: a setting the request asked for
        return bad_request(str(err), getattr(err, "field", None))
    return APIError(500, f"the generation failed: {type(err).__name__}: {err}", type="server_error")
