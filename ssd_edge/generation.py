"""One answer's state: its history, the room left, the stop text, the meter and the drawer.

The engine (engine.py) runs rounds over a Generation; every token a round adds goes through
commit(), which alone extends the history and the answer and decides whether the answer ends
(an end-of-generation token, a stop string, max_tokens). StopText turns the committed tokens into
text deltas, holding back what could still be the start of a stop string (TextStream: a UTF-8
character split across tokens waits for its last byte). The KV caches are the pair's (pair.py):
they follow the history, never the other way round.
"""

from __future__ import annotations

import codecs
import threading
import time
from typing import NamedTuple, Sequence

from .config import SamplingConfig
from .coupling import Drawer
from .events import FinishEvent, Round, Stats, StopReason, TokenEvent, TokenLogprob
from .interface import BackendModel
from .metrics import Ema, Meter
from .stops import StopRule
from .structured.rows import AnswerRows
from .structured.shaping import Shaping


class TextStream:
    """Turns token ids into text incrementally; a UTF-8 character split across
    tokens is held back until its last byte arrives."""

    def __init__(self, model: BackendModel):
        self.model = model
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._dec.decode(self.model.piece(token))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


class StopText:
    """The answer's text as tokens commit: push() each token, take() what may be shown now,
    finish() the rest at the end. Cut at the earliest stop string (one may end inside another; `word`
    says which), else where a stop rule says (stops.py: the strings and rules of generate()'s `stop`)."""

    def __init__(self, model: BackendModel, stop: Sequence[str | StopRule]) -> None:
        self.stream = TextStream(model)
        self.stop = [s for s in stop if isinstance(s, str) and s]
        self.rules = [s for s in stop if not isinstance(s, str)]
        self.text = ""
        self.sent = 0
        self.stopped = False
        self.word: str | None = None  # the stop string that ended the answer
        self.t_first: float | None = None  # when the first token was pushed (the rules' clock)

    def push(self, token: int) -> None:
        self.text += self.stream.push(token)
        hits = [(i, s) for s in self.stop if (i := self.text.find(s, max(0, self.sent - len(s)))) >= 0]
        if hits:
            i, self.word = min(hits, key=lambda h: h[0])
            self.text = self.text[:i]
            self.stopped = True
        elif self.rules:
            now = time.perf_counter()
            self.t_first = self.t_first or now
            for rule in self.rules:
                if (cut := rule.cut(self.text, now - self.t_first)) is not None:
                    self.text = self.text[:max(cut, self.sent)]  # (what was shown stays: a rule cuts ahead of it)
                    self.stopped = True
                    return

    def take(self) -> str:
        hold = 0
        if not self.stopped:
            for s in self.stop:
                for n in range(min(len(s) - 1, len(self.text) - self.sent), 0, -1):
                    if self.text.endswith(s[:n]):
                        hold = max(hold, n)
                        break
        out = self.text[self.sent: len(self.text) - hold]
        self.sent += len(out)
        return out

    def finish(self) -> str:
        """The text not yet handed out (held-back stop-string prefixes, a last partial character)."""
        if not self.stopped:
            self.text += self.stream.flush()
        out = self.text[self.sent:]
        self.sent = len(self.text)
        return out


class Committed(NamedTuple):
    tokens: list[int]          # the round's tokens the answer keeps
    reason: StopReason | None  # why the answer ends after this round, if it does


class Generation:
    """history: the prompt and every token committed since (what the target's KV must hold next);
    out: the answer's tokens (history's tail, less what a stop cut). Engine-thread state only."""

    def __init__(self, target: BackendModel, prompt: Sequence[int], max_tokens: int, n_ctx: int,
                 stop: Sequence[str | StopRule], cancel: threading.Event, sampling: SamplingConfig, seed: int, meter: Meter,
                 step_ms: Ema, shaping: Shaping | None = None, logprobs: int | None = None) -> None:
        self.is_eog = target.is_eog
        self.n_prompt = len(prompt)
        self.history: list[int] = list(prompt)
        self.out: list[int] = []
        self.max_tokens = max_tokens
        self.n_ctx = n_ctx
        self.text = StopText(target, stop)
        self.cancel = cancel
        self.sampling = sampling
        self.seed = seed
        # a constraint, bias or penalties shape each row before its draw, and logprobs read it first
        # (structured/rows.py): the target's row hook; None where rows are drawn as they come
        self.shaping = shaping if shaping is not None and shaping.active else None
        self.rows = AnswerRows(self.shaping.cursor() if self.shaping else None, self.history, len(prompt), logprobs) \
            if self.shaping is not None or logprobs is not None else None
        self.logprobs: list[TokenLogprob] | None = [] if logprobs is not None else None
        self.drawer = Drawer(sampling, seed, hook=self.rows)  # the target's draws, bound once (coupling.py)
        self.meter = meter
        self.step_ms = step_ms  # ms of a plain target step at these threads, over generations
        self.reason: StopReason | None = None
        self.message: str | None = None
        self._kept_logprobs: tuple[TokenLogprob, ...] = ()

    @property
    def room(self) -> int:
        """Tokens the target's KV can still take (history + the round's draft must fit)."""
        return self.n_ctx - len(self.history)

    @property
    def remaining(self) -> int:
        """Tokens the answer may still make."""
        return self.max_tokens - len(self.out)

    def can_go_on(self) -> bool:
        """Whether another round may run; if not, the reason is set (cancelled, or the context full)."""
        if self.reason is not None:
            return False
        if self.cancel.is_set():
            self.reason = "cancelled"
        elif len(self.history) >= self.n_ctx:  # (room < 1)
            self.reason, self.message = "context", f"the context of {self.n_ctx} tokens is full"
        return self.reason is None

    def commit(self, tokens: Sequence[int]) -> list[int]:
        """A round's tokens enter the history; the answer keeps them up to an end of generation, a
        stop string or max_tokens, which end it. Returns the kept ones."""
        new = self.take(tokens, self.max_tokens - len(self.out))  # (remaining)
        first = len(self.history)
        self.history.extend(tokens)
        self.out.extend(new.tokens)
        self.reason = new.reason
        if self.rows is not None:
            self.rows.round()
            if self.logprobs is not None:
                self._kept_logprobs = self.rows.take_logprobs(first, new.tokens)
                self.logprobs.extend(self._kept_logprobs)
        return new.tokens

    def take(self, tokens: Sequence[int], room: int) -> Committed:
        """The round's tokens up to an end of generation, a stop string or `room` tokens."""
        new: list[int] = []
        for t in tokens:
            if self.is_eog(t):
                return Committed(new, "eos")
            new.append(t)
            self.text.push(t)
            if self.text.stopped:
                return Committed(new, "stop")
            if len(new) >= room:
                return Committed(new, "length")
        return Committed(new, None)

    def event(self, rnd: Round, kept: Sequence[int]) -> TokenEvent:
        """What the round shows: its kept tokens, their provenance, the text that may be shown now."""
        self.meter.record(rnd, len(kept))
        return TokenEvent(self.text.take(), tuple(kept), rnd.provenance[:len(kept)], rnd, self.meter.live(),
                          self._kept_logprobs if self.logprobs is not None else None)

    def finish(self, stats: Stats) -> FinishEvent:
        tail = self.text.finish()
        return FinishEvent(self.text.text, tuple(self.out), self.reason or "length", stats, self.message, tail,
                           tuple(self.logprobs) if self.logprobs is not None else None, self.text.word)
