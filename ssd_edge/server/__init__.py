"""`ssd-edge serve`: an OpenAI-compatible HTTP server with speculative decoding behind it.

    protocol   the OpenAI wire format: request bodies in (validated), response objects out, errors
    scheduler  one engine, one worker thread, a bounded FIFO queue in front of it
    monitor    Prometheus metrics (GET /metrics): tokens, rounds, acceptance, pre-speculation, latency
    app        the Starlette app: routes, API key, body limit, streaming (server-sent events)
    runner     uvicorn around the app, with the graceful SIGTERM/Ctrl-C the CLI promises

The engine runs one generation at a time and blocks while it decodes, so it lives on the
scheduler's thread; the async side only queues work and relays events. Nothing here imports
llama_cpp: the engine is handed in, so the tests serve the fake backend.
"""

from .app import create_app

__all__ = ["create_app"]
