"""From the engine's event stream to the UI thread.

A generation runs in a worker thread (`run_generation`). It never touches a
widget: it folds each TokenEvent into a `Chunk` (text split by provenance,
the round, the live stats) and puts it in an `Outbox`. The outbox posts one
wake-up message to the UI when it goes from empty to non-empty; the UI drains
everything queued since, so however fast the engine is, the UI gets one
message per drain, never one per token, and redraws at most every ~50 ms.
"""

from __future__ import annotations

import codecs
import logging
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ssd_edge.errors import ContextFullError, SSDEdgeError
from ssd_edge.events import FinishEvent, LiveStats, Round, TokenEvent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Chunk:
    """One TokenEvent, ready for the UI."""

    spans: tuple[tuple[str, str], ...]  # (provenance, text) in order
    n_tokens: int
    round: Round      # the last of the event's rounds
    live: LiveStats
    wall_ms: float    # the event's rounds' wall time (TokenEvent.wall_ms)


@dataclass(frozen=True)
class Failure:
    """The generation raised; `message` is one line for the user."""

    message: str


Item = Chunk | FinishEvent | Failure


class Outbox:
    """A thread-safe queue from one worker to the UI thread.

    `wake` is called (from the worker) only when the outbox was empty, so the
    number of wake-up messages is bounded by the number of UI drains."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._items: list[Item] = []
        self._armed = False  # a wake-up is in flight and the UI has not drained since

    def put(self, item: Item) -> None:
        with self._lock:
            self._items.append(item)
            notify = not self._armed
            self._armed = True
        if notify:
            self._wake()

    def drain(self) -> list[Item]:
        with self._lock:
            items, self._items = self._items, []
            self._armed = False
        return items


class Segmenter:
    """Splits a TokenEvent's text delta into per-token pieces by provenance.

    The engine sends one text delta per round; a round mixes accepted draft
    tokens and one target token. Decoding each token's bytes (in the worker
    thread, the thread that owns the engine) gives each token's own text. When
    those pieces do not add up to the delta (a held-back stop string, say),
    the delta goes whole to the round's most common provenance."""

    def __init__(self, piece: Callable[[int], bytes] | None) -> None:
        self.piece = piece  # a token's bytes (Engine.piece); None: each delta goes whole
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def split(self, ev: TokenEvent) -> tuple[tuple[str, str], ...]:
        if not ev.text:
            return ()
        if self.piece is not None:
            pieces = [(p, self.decoder.decode(self.piece(t))) for t, p in zip(ev.tokens, ev.provenance)]
            if "".join(s for _, s in pieces) == ev.text:
                return merge(pieces)
        main = Counter(ev.provenance).most_common(1)[0][0] if ev.provenance else "target"
        return ((main, ev.text),)


def merge(pieces: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for prov, text in pieces:
        if not text:
            continue
        if out and out[-1][0] == prov:
            out[-1] = (prov, out[-1][1] + text)
        else:
            out.append((prov, text))
    return tuple(out)


def describe_error(e: BaseException) -> str:
    """One line for the user; typed project errors carry their own message."""
    if isinstance(e, ContextFullError):
        return f"{e} - start a new chat (Ctrl+N) or shorten the conversation"
    if isinstance(e, SSDEdgeError):
        return str(e)
    return f"{type(e).__name__}: {e}"


def run_generation(engine: Any, messages: list[dict[str, str]], max_tokens: int, cancel: threading.Event,
                   outbox: Outbox) -> None:
    """The worker's body: run one generation to its FinishEvent (or a Failure)."""
    seg = Segmenter(getattr(engine, "piece", None))
    try:
        for ev in engine.generate(messages=messages, max_tokens=max_tokens, cancel=cancel):
            if isinstance(ev, TokenEvent):
                outbox.put(Chunk(seg.split(ev), len(ev.tokens), ev.round, ev.live, ev.wall_ms))
            else:
                outbox.put(ev)
    except Exception as e:  # everything reaches the user as a line, not a traceback
        log.exception("generation failed")
        outbox.put(Failure(describe_error(e)))
