"""One bench run measured: a generation from a cold KV cache, read off the engine's event stream into
a RunRecord (schema.py), with the process's peak resident memory sampled beside it. A structured prompt
(Asked: its shape and prompt tokens, made as the server makes them) runs under its constraint, and its
answer is checked (answers.py)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from . import answers
from .schema import BenchPrompt, RunRecord


@dataclass(frozen=True)
class Asked:
    """A structured prompt made ready on a loaded engine: what its answer must look like and its prompt's
    tokens (the chat template with the tools it lists: structured/request.py, as the server does)."""

    shape: Any                 # structured.request.Shape
    tokens: list[int]
    parallel: bool = True      # parallel_tool_calls

    @classmethod
    def made(cls, engine, prompt: BenchPrompt) -> "Asked":
        """`prompt` made ready on `engine`: its shape with the model's chat template (tools), compiled for
        the target's vocabulary (a schema llguidance refuses fails here, named), its prompt's tokens."""
        from ..errors import ConfigError
        from ..structured.request import check, prompt_tokens
        from .args import shape_of

        try:
            shape = shape_of(prompt, engine.chat_template() if prompt.tools else None)
            check(shape, engine.grammar_tokenizer())
            tokens = prompt_tokens(engine, prompt.messages, shape)
        except ConfigError as e:
            raise ConfigError(f"prompt {prompt.id!r}: {e}") from None
        return cls(shape, tokens, prompt.parallel_tool_calls is not False)

    def check(self, text: str) -> answers.Check:
        return answers.check(self.shape, text, self.parallel)


class RssPeak:
    """Peak resident memory of this process while a block runs (sampled every 20 ms)."""

    def __init__(self, every_s: float = 0.02) -> None:
        import psutil

        self.proc = psutil.Process()
        self.every_s = every_s
        self.peak = 0
        self._stop = threading.Event()

    def _poll(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> "RssPeak":
        self.peak = self.proc.memory_info().rss
        self._thread = threading.Thread(target=self._poll, name="bench-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def run_one(engine, setting: str, mode: str, prompt: BenchPrompt, *, rep: int, seed: int, max_tokens: int,
            temperature: float, asked: Asked | None = None) -> RunRecord:
    """One generation from a cold KV cache; the record of what it did. asked: the prompt's constraint and
    tokens (a structured prompt), its answer checked."""
    from ..events import FinishEvent

    engine.reset()  # each run prefills its prompt, like a fresh request
    sampling = engine.config.sampling.model_copy(update=dict(temperature=temperature, seed=seed))
    latencies: list[float] = []
    modes_run: Counter[str] = Counter()
    spec_rounds = 0
    verify_ms: dict[str, list[float]] = {}  # size -> [alone, their ms, with the worker beside, their ms]
    finish = None
    with RssPeak() as rss:
        shaped = dict(tokens=asked.tokens, constraint=asked.shape.constraint) if asked else dict(messages=prompt.messages)
        gen = engine.generate(**shaped, max_tokens=prompt.max_tokens or max_tokens, mode=mode, sampling=sampling)
        try:
            for ev in gen:
                if isinstance(ev, FinishEvent):
                    finish = ev
                    break
                r = ev.round  # the last of ev.rounds rounds (several: plain steps made in one call)
                modes_run[r.mode] += ev.rounds
                spec_rounds += r.drafted > 0
                if r.index > 0 and r.steps == 1 and ev.rounds == 1:  # one verify (not the prompt's, not a plain run)
                    cell = verify_ms.setdefault(str(r.drafted + 1), [0, 0.0, 0, 0.0])
                    cell[2 * (r.beside > 0)] += 1
                    cell[2 * (r.beside > 0) + 1] += r.verify_ms
                if r.index > 0 and ev.tokens:  # the first round carries the prompt's prefill (TTFT)
                    latencies.extend([ev.wall_ms / len(ev.tokens)] * len(ev.tokens))
        finally:
            gen.close()  # on Ctrl-C: stops the SSD worker before the engine closes
    assert finish is not None
    st, pre = finish.stats, finish.stats.prespec
    valid, invalid = asked.check(finish.text) if asked else (None, None)
    return RunRecord(
        setting=setting, mode=mode, prompt_id=prompt.id, category=prompt.category, rep=rep, seed=seed,
        prompt_tokens=st.prompt_tokens, tokens=st.tokens, stop_reason=finish.stop_reason, wall_s=st.wall_s,
        ttft_s=st.ttft_s, decode_s=st.decode_s, tokens_per_s=st.tokens_per_s, latencies_ms=latencies,
        drafted=st.drafted, accepted=st.accepted, spec_rounds=spec_rounds, rounds=st.rounds,
        lookups=pre.lookups, hits=pre.hits, partial_hits=pre.partial_hits, miss_reasons=dict(pre.miss_reasons),
        hits_by_accepted={str(a): list(nh) for a, nh in pre.hits_by_accepted.items()},
        complete_at_lookup=pre.complete_at_lookup, first_decode_ms_p50=pre.first_decode_ms_p50,
        first_decode_ms_p90=pre.first_decode_ms_p90, verify_ms=verify_ms,
        draft_busy_s=st.draft_busy_s, target_busy_s=st.target_busy_s, in_decode_s=st.in_decode_s,
        positions=st.positions, host_by_worker={w: list(sp) for w, sp in st.host_by_worker.items()},
        threads=st.to_dict()["threads"], peak_rss_mib=rss.peak / 2**20,
        memory=dict(st.memory) if st.memory is not None else None, modes_run=dict(modes_run),
        auto=st.auto.to_dict() if st.auto is not None else None,
        output_sha=hashlib.sha256(json.dumps(list(finish.tokens)).encode()).hexdigest()[:16],
        forced=st.forced, valid=valid, invalid=invalid)
