"""The HTTP face: an OpenAI-compatible API on a Starlette app.

    POST /v1/chat/completions   chat (messages), streamed as server-sent events with "stream": true
    POST /v1/completions        plain prompt completion; with `suffix`, fill in the middle (editors.py)
    POST /infill, /completion   llama-server's own endpoints, for editors (editors.py, llama_protocol.py)
    GET  /v1/models             the one served model
    GET  /health                liveness and the queue (no API key needed)
    GET  /metrics               Prometheus text format (monitor.py)

A request is read and validated here (protocol.py), its prompt tokenized, and its generation
queued on the scheduler; the handler then relays the job's events: as one JSON object, or as
chunks ending in `data: [DONE]`. A client that disconnects has its job withdrawn (cancelled at
the next round, or dropped from the queue). Every error is a JSON body in OpenAI's shape; a
malformed request is always a 4xx, and the server keeps serving.
"""

from __future__ import annotations

import hmac
import logging
import time
from dataclasses import replace
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import anyio
from pydantic import ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..config import SamplingConfig, SpecConfig
from ..settings import reason
from ..structured.constraint import ConstraintError
from .editors import Editors, fim_prompt
from .monitor import CONTENT_TYPE, Monitor
from .protocol import APIError, ChatRequest, CompletionRequest, bad_request, parse, read_json, short
from .relay import CLIENT_GONE, Relay
from .reply import Reply
from .scheduler import Scheduler, Work
from ..structured.request import Shape, check as check_shape, prompt_tokens, read as read_shape

log = logging.getLogger(__name__)

MAX_BODY = 4 << 20   # bytes; a 128k-token prompt is ~0.5 MB of JSON
PUBLIC = {"/health"}  # paths that need no API key
ENDPOINTS = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/infill", "/completion"}


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


class Guard:
    """ASGI middleware in front of everything: the API key, the body size limit, and the
    count of requests by endpoint and status for /metrics."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body: int, monitor: Monitor) -> None:
        self.app, self.api_key, self.max_body, self.monitor = app, api_key, max_body, monitor

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        status = [CLIENT_GONE]

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                await _drain(receive, DRAIN_MOST)
                await error_response(refusal)(scope, receive, send_counted)
                return
            await self.app(scope, self._limited(receive), send_counted)
        finally:
            self.monitor.requests.labels(path if path in ENDPOINTS else "other", str(status[0])).inc()

    def _refusal(self, scope: Scope) -> APIError | None:
        headers = dict(scope["headers"])
        if self.api_key and scope["path"] not in PUBLIC:
            auth = headers.get(b"authorization", b"").decode("latin-1")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not token:
                return APIError(401, "missing API key: send the header 'Authorization: Bearer KEY'",
                                code="invalid_api_key")
            if not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
                return APIError(401, "invalid API key", code="invalid_api_key")
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return _too_large(self.max_body)
        return None

    def _limited(self, receive: Receive) -> Receive:
        """receive() that refuses a body (e.g. chunked, without a length) once it passes max_body."""
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    if message.get("more_body", False):
                        await _drain(receive, DRAIN_MOST)
                    raise _too_large(self.max_body)
            return message
        return limited


# A refused request's body is read and dropped, up to this much, before the error is sent: a client
# that sends its whole body before it reads (Python's urllib, some SDKs) would otherwise see the
# connection reset under it instead of the answer. Reverse proxies do the same ("lingering close").
DRAIN_MOST = 64 << 20


async def _drain(receive: Receive, most: int) -> None:
    """Read and drop the request's body, up to `most` bytes (then the connection closes with the
    answer, as before)."""
    seen = 0
    while seen <= most:
        message = await receive()
        if message["type"] != "http.request":
            return  # the client went away
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than {limit} bytes (--max-body)", code="request_too_large")


class API:
    """The routes, over one engine and its scheduler."""

    def __init__(self, engine: Any, model_id: str, monitor: Monitor, max_queue: int,
                 default_max_tokens: int | None, stream_grace_s: float) -> None:
        self.engine = engine
        self.model_id = model_id
        self.monitor = monitor
        self.base = engine.config  # per-request settings are validated against the server's own
        self.default_max_tokens = default_max_tokens
        self.stream_grace_s = stream_grace_s
        self.scheduler = Scheduler(engine, monitor, max_queue)
        self.started = int(time.time())

    # ------------------------------------------------------------ small routes
    async def health(self, request: Request) -> Response:
        s = self.scheduler
        body = {"status": "ok", "model": self.model_id, "busy": s.busy, "queue_depth": s.depth,
                "queue_capacity": s.max_queue}
        return JSONResponse(body)

    def _model(self) -> dict[str, Any]:
        cfg = self.base
        return {"id": self.model_id, "object": "model", "created": self.started, "owned_by": "ssd-edge",
                "meta": {"target": cfg.target.path, "draft": cfg.draft.path if cfg.draft else None,
                         "mode": cfg.mode, "n_ctx": cfg.n_ctx}}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model()]})

    async def model(self, request: Request) -> Response:
        self._check_model(request.path_params["model"])
        return JSONResponse(self._model())

    async def metrics(self, request: Request) -> Response:
        return Response(self.monitor.exposition(), media_type=CONTENT_TYPE)

    # ------------------------------------------------------------ completions
    async def chat(self, request: Request) -> Response:
        req: ChatRequest = parse(ChatRequest, await read_json(request))
        top = self.check(req)
        messages = req.chat()
        shape = self.shape(req, self.engine.chat_template() if req.tools else None)
        if shape.constraint is not None or shape.choice is not None:  # tools: each one's schema, even unused
            await self.compile(shape)
        try:  # the model's template with the tools, else llama.cpp's renderer (structured/request.py)
            tokens = await run_in_threadpool(prompt_tokens, self.engine, messages, shape)
        except ConstraintError as e:  # the template cannot render these messages
            raise bad_request(str(e), e.field) from None
        works = self.works(req, tokens, "messages", shape, top)
        return await self._respond(request, req, works, Reply("chat", self.model_id, len(tokens), self.engine.piece,
                                                             top), shape)

    async def completions(self, request: Request) -> Response:
        req: CompletionRequest = parse(CompletionRequest, await read_json(request))
        top = self.check(req)
        prompt = req.prompt_text_or_ids()
        shape = self.shape(req, None)
        if shape.constraint is not None:
            await self.compile(shape)
        if req.suffix is not None:  # fill in the middle, in the model's FIM tokens (OpenAI's and ollama's field)
            if not isinstance(prompt, str):
                raise bad_request("suffix: fills in the middle after a string prompt, not token ids", "suffix")
            laid = await run_in_threadpool(fim_prompt, self.engine, prompt, req.suffix, n_predict=req.limit() or 0,
                                           param="suffix")
            tokens = list(laid.tokens)
        elif isinstance(prompt, str):
            # special tokens parsed, as llama-server does: an editor's fill-in-the-middle prompt is made of them
            tokens = await run_in_threadpool(self.engine.tokenize, prompt, parse_special=True)
        else:
            n_vocab = self.engine.n_vocab
            if any(not 0 <= t < n_vocab for t in prompt):
                raise bad_request(f"prompt: token ids must be in [0, {n_vocab})", "prompt")
            tokens = list(prompt)
        works = self.works(req, tokens, "prompt", shape, top)
        return await self._respond(request, req, works, Reply("text", self.model_id, len(tokens), self.engine.piece,
                                                             top), shape)

    def _check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_id:
            raise APIError(404, f"the model '{name}' does not exist here; this server serves '{self.model_id}' "
                           "(GET /v1/models)", param="model", code="model_not_found")

    def check(self, req: ChatRequest | CompletionRequest) -> int | None:
        """The request's settings checked; the number of log-probability alternatives it asks."""
        self._check_model(req.model)
        req.refused()
        if req.mode in ("sd", "ssd") and not self.engine.has_draft:
            raise bad_request(f"mode: '{req.mode}' needs a draft model, and this server runs without one "
                              "(use ar, lookup or auto)", "mode")
        return req.top()

    @staticmethod
    def shape(req: ChatRequest | CompletionRequest, template: Any) -> Shape:
        try:
            return read_shape(req.response_format, req.tools, req.tool_choice, template, req.parallel_tool_calls)
        except ConstraintError as e:
            raise bad_request(str(e), e.field) from None

    async def compile(self, shape: Shape) -> None:
        """The grammar compiled for the target's vocabulary now, so a bad one is a 400 before any header."""
        try:
            await run_in_threadpool(lambda: check_shape(shape, self.engine.grammar_tokenizer()))
        except ConstraintError as e:
            raise bad_request(str(e), e.field) from None

    def works(self, req: ChatRequest | CompletionRequest, tokens: list[int], prompt_param: str, shape: Shape,
               top: int | None) -> list[Work]:
        """One Work per answer: the same but for the seed (seed, seed + 1, ... where one is set)."""
        work = self._work(req, tokens, prompt_param)
        work = replace(work, constraint=shape.constraint, logprobs=top)
        seed = work.sampling.seed
        return [work if i == 0 or seed is None else
                replace(work, sampling=work.sampling.model_copy(update={"seed": seed + i})) for i in range(req.n)]

    def _work(self, req: ChatRequest | CompletionRequest, tokens: list[int], prompt_param: str) -> Work:
        n_ctx = self.base.n_ctx
        if not tokens:
            raise bad_request(f"{prompt_param}: the prompt is empty", prompt_param)
        if len(tokens) >= n_ctx:
            raise bad_request(f"the prompt has {len(tokens)} tokens and the context holds {n_ctx} "
                              "(start the server with a larger -c/--ctx-size)", prompt_param,
                              code="context_length_exceeded")
        overrides = {k: getattr(req, k) for k in ("temperature", "top_k", "top_p", "min_p")
                     if getattr(req, k) is not None}
        if req.seed is not None:
            overrides["seed"] = None if req.seed == -1 else req.seed
        overrides.update(req.shaping())
        bias = overrides.get("logit_bias", {})
        if any(t >= self.engine.n_vocab for t in bias):
            raise bad_request(f"logit_bias: token ids are below {self.engine.n_vocab}, got {max(bias)}", "logit_bias")
        try:
            sampling = SamplingConfig.model_validate({**self.base.sampling.model_dump(), **overrides})
        except ValidationError as e:
            name = str(e.errors()[0]["loc"][0])
            shown = overrides.get(name) if name != "logit_bias" else req.logit_bias
            raise bad_request(f"{name}: {reason(e)}, got {short(shown)}", name) from None
        spec: dict[str, Any] = {}
        if req.speculative is not None:
            names = {"n_max": "k", "n_min": "k_min", "p_min": "p_min"}
            spec = {names[k]: v for k, v in req.speculative.model_dump().items() if v is not None}
            try:
                SpecConfig.model_validate({**self.base.spec.model_dump(), **spec})
            except ValidationError as e:
                field = {v: k for k, v in names.items()}.get(str(e.errors()[0]["loc"][0]), "n_max")
                raise bad_request(f"speculative.{field}: {reason(e)}", f"speculative.{field}") from None
        limit = req.limit() or self.default_max_tokens or n_ctx
        return Work(tokens, limit, req.mode, req.stops(), sampling, spec)

    async def _respond(self, request: Request, req: ChatRequest | CompletionRequest, works: list[Work],
                       reply: Reply, shape: Shape) -> Response:
        relay = Relay(self.scheduler, works, reply, shape.reader)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return EventSourceResponse(relay.stream(include_usage), ping=15, shutdown_event=anyio.Event(),
                                       shutdown_grace_period=self.stream_grace_s)
        return await relay.whole(request)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found" if exc.status_code == 404 else "method_not_allowed" if exc.status_code == 405 else None
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return error_response(APIError(exc.status_code, message, code=kind, headers=exc.headers))


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("unexpected %s in %s %s: %s", type(exc).__name__, request.method, request.url.path, exc,
              exc_info=exc)
    return error_response(APIError(500, f"internal error ({type(exc).__name__}); the server log has the details",
                                   type="server_error"))


def create_app(engine: Any, *, model_id: str, api_key: str | None = None, max_queue: int = 8,
               max_body: int = MAX_BODY, default_max_tokens: int | None = None,
               stream_grace_s: float = 5.0) -> Starlette:
    """The app over a loaded engine (which it does not close). app.state.api.scheduler runs the jobs;
    app.state.monitor holds the metrics."""
    monitor = Monitor()
    api = API(engine, model_id, monitor, max_queue, default_max_tokens, stream_grace_s)
    editors = Editors(api)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        api.scheduler.shutdown()
        await anyio.to_thread.run_sync(api.scheduler.join, 60.0)

    routes = [
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/models/{model:path}", api.model, methods=["GET"]),
        Route("/infill", editors.infill, methods=["POST"]),
        Route("/completion", editors.completion, methods=["POST"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/metrics", api.metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={APIError: _api_error, HTTPException: _http_error,
                                        Exception: _internal_error})
    app.add_middleware(Guard, api_key=api_key, max_body=max_body, monitor=monitor)
    app.state.api = api
    app.state.monitor = monitor
    return app
