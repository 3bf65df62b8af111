"""One engine, one worker thread, a bounded FIFO queue in front of it.

An edge device runs one generation at a time (the engine refuses a second), so requests wait
their turn in arrival order. The queue is bounded: a request that finds it full is refused at
once (HTTP 503 with Retry-After) instead of hanging. Each job's events travel from the worker
thread to its request's event loop through an asyncio.Queue, and every job receives exactly one
terminal item: the engine's FinishEvent, or a Failure.

A Work of max_tokens 0 reads its prompt into the cache and generates nothing (Pair.prefill: an editor's
warm-up); its terminal item is the Prefilled event. A job's `cached` says how much of its prompt the
target's cache held when it started (written by the worker before the engine runs, read after the end).

Cancelling (a client gone, the server stopping) sets the job's threading.Event; the engine
checks it at every round boundary (and between prompt chunks), so nothing keeps computing for
nobody for longer than one round. A job withdrawn while it still waits never reaches the engine.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, NamedTuple

from ..config import SamplingConfig
from ..events import FinishEvent, Prefilled, TokenEvent
from .monitor import Monitor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Work:
    """What to generate: the engine's generate() arguments, plus per-request draft settings."""

    tokens: list[int]
    max_tokens: int                  # 0: read the prompt into the cache only (Pair.prefill)
    mode: str | None
    stop: list[Any]                  # stop strings, and stops.StopRule's
    sampling: SamplingConfig
    spec: dict[str, Any] = field(default_factory=dict)  # engine.configure() changes for this request only
    constraint: Any = None           # a structured.Constraint the answer must follow (None: free text)
    logprobs: int | None = None      # alternatives per token's log-probability (None: none)


class Failure(NamedTuple):
    """A job's terminal item when the engine produced no FinishEvent."""

    reason: str          # "withdrawn" (left the queue), "shutdown" (server stopping), "error"
    error: BaseException | None = None


class QueueFull(Exception):
    def __init__(self, retry_after: int) -> None:
        super().__init__(f"the queue is full; retry in {retry_after} s")
        self.retry_after = retry_after


class ShuttingDown(Exception):
    pass


Item = TokenEvent | FinishEvent | Prefilled | Failure
TERMINAL = (FinishEvent, Prefilled, Failure)


class Job:
    def __init__(self, work: Work, loop: asyncio.AbstractEventLoop) -> None:
        self.work = work
        self.cancel = threading.Event()
        self.stopping = False  # cancelled because the server stops (not because the client left)
        self.enqueued = time.monotonic()
        self._loop = loop
        self._items: asyncio.Queue[Item] = asyncio.Queue()
        self._ended = False  # a terminal item was posted
        self.cached: int | None = None  # prompt tokens the target's cache held at the start (the worker's)

    def post(self, item: Item) -> None:
        """From any thread; after a terminal item nothing more is posted."""
        if self._ended:
            return
        self._ended = isinstance(item, TERMINAL)
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    async def items(self) -> AsyncIterator[Item]:
        """The job's events, up to and including its terminal item."""
        while True:
            item = await self._items.get()
            yield item
            if isinstance(item, TERMINAL):
                return


class Scheduler:
    def __init__(self, engine: Any, monitor: Monitor, max_queue: int = 8) -> None:
        self.engine = engine
        self.monitor = monitor
        self.max_queue = max_queue  # jobs that may wait behind the running one
        self._waiting: deque[Job] = deque()
        self._running: Job | None = None
        self._closed = False
        self._cond = threading.Condition()
        self._mean_s = 0.0  # running mean of a job's time on the engine, for Retry-After
        self.monitor.queue_capacity.set(max_queue)
        self._thread = threading.Thread(target=self._loop, name="ssd-edge-serve", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the async side
    def submit(self, work: Work, loop: asyncio.AbstractEventLoop) -> Job:
        with self._cond:
            if self._closed:
                raise ShuttingDown()
            if len(self._waiting) + (self._running is not None) > self.max_queue:  # one runs, max_queue wait
                raise QueueFull(self._retry_after())
            job = Job(work, loop)
            self._waiting.append(job)
            self.monitor.queue_depth.set(len(self._waiting))
            self._cond.notify()
        return job

    def withdraw(self, job: Job) -> None:
        """The client is gone: stop its generation at the next round, or drop it from the queue."""
        job.cancel.set()
        with self._cond:
            if job in self._waiting:
                self._waiting.remove(job)
                self.monitor.queue_depth.set(len(self._waiting))
                self.monitor.generations.labels("withdrawn").inc()
                job.post(Failure("withdrawn"))

    def shutdown(self) -> None:
        """Stop taking work; refuse what waits; cancel what runs at its next round. Does not block."""
        with self._cond:
            self._closed = True
            for job in self._waiting:
                job.stopping = True
                job.cancel.set()
                job.post(Failure("shutdown"))
            self._waiting.clear()
            self.monitor.queue_depth.set(0)
            if self._running is not None:
                self._running.stopping = True
                self._running.cancel.set()
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def depth(self) -> int:
        with self._cond:
            return len(self._waiting)

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._running is not None

    def _retry_after(self) -> int:
        """Seconds until a place is likely free: the jobs ahead times a job's mean time."""
        ahead = len(self._waiting) + (self._running is not None)
        return max(1, min(600, math.ceil(ahead * (self._mean_s or 1.0))))

    # ------------------------------------------------------------ the worker thread
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if not self._waiting:
                    return  # closed and drained
                job = self._running = self._waiting.popleft()
                self.monitor.queue_depth.set(len(self._waiting))
            try:
                self._run(job)
            finally:
                with self._cond:
                    self._running = None
                job = None  # not kept alive (with its events) while the next job is awaited

    def _run(self, job: Job) -> None:
        eng, w = self.engine, job.work
        t0 = time.monotonic()
        self.monitor.queue_wait.observe(t0 - job.enqueued)
        self.monitor.in_progress.set(1)
        saved = eng.config  # per-request draft settings apply to this job only
        try:
            if w.spec:
                eng.configure(**w.spec)
            job.cached = eng.cached_prefix(w.tokens)
            if w.max_tokens == 0:
                done = eng.prefill(w.tokens, job.cancel)
                self.monitor.generations.labels("cancelled" if done.cancelled else "prefill").inc()
                self.monitor.prompt_tokens.inc(done.prompt_tokens)
                job.post(done)
                return
            shaped = {k: v for k, v in (("constraint", w.constraint), ("logprobs", w.logprobs)) if v is not None}
            events = eng.generate(tokens=w.tokens, max_tokens=w.max_tokens, mode=w.mode, stop=w.stop,
                                  cancel=job.cancel, sampling=w.sampling, **shaped)
            try:
                for ev in events:
                    if isinstance(ev, TokenEvent):
                        self.monitor.token_event(ev)
                    else:
                        self.monitor.finish(ev, len(w.tokens))
                        eng.config = saved  # the server's own settings are back before the client hears the end
                    job.post(ev)
            finally:
                events.close()
        except Exception as e:  # an engine failure ends this job, never the worker
            log.warning("generation failed: %s: %s", type(e).__name__, e, exc_info=log.isEnabledFor(logging.DEBUG))
            self.monitor.generations.labels("error").inc()
            job.post(Failure("error", e))
        finally:
            eng.config = saved
            self.monitor.in_progress.set(0)
            dt = time.monotonic() - t0
            self._mean_s = dt if not self._mean_s else 0.8 * self._mean_s + 0.2 * dt
            job.post(Failure("error", RuntimeError("the generation ended without a result")))  # no-op if ended
