"""llama.cpp's own constrained decoding as the bench's peer on structured prompts: `llama-server`
(built by scripts/build_llama_tools.sh from the llama.cpp sources the pinned llama-cpp-python carries),
the target alone, on the very prompt tokens ssd-edge runs, through its `/completion` endpoint (the
prompt as token ids, n_predict, temperature, seed, no prompt cache: each answer reads its prompt).

Two peer kinds, one server per setting:

    json_schema  the prompt's schema as `json_schema`: llama.cpp converts it itself, with its default
                 free whitespace (a newline and indentation may follow every brace and comma), as its
                 users get it
    grammar      the same conversion with ssd-edge's rigid separators, as a `grammar`: the server's
                 own GBNF of the schema (asked of it once, read back from its generation_settings),
                 its whitespace rule pinned (rigid()): ", " between items, ": " after keys, nothing
                 else, the JSON that structured/constraint.py's RIGID makes

Tool calls are one call object per offered tool ({"name": const, "arguments": its parameters}; several
tools: anyOf) converted the same way, inside Qwen's tags (`<tool_call>` and `</tool_call>` are special
tokens, written as GBNF token literals), or, where the template knows no tags, as the whole answer
{"tool_calls": [call, ...]}: the grammar of structured/tools.py's call, llama.cpp's way.

Each answer is timed twice: the request's wall time (the prompt sent to the answer read) and the
server's own `timings` (prompt_ms: its encode; predicted_ms: its decode). The server is stopped on
leaving the `with` block, also on Ctrl-C (terminate, then kill after a grace period).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..structured.constraint import JsonObject, JsonSchema
from ..structured.tools import CLOSE, OPEN
from .schema import PeerRecord

BINARY = "llama-server"
KINDS = ("grammar", "json_schema")
NOTE = ("on structured prompts llama-server instead (the target alone, the same prompt tokens, threads and "
        "seed, its /completion without prompt cache): llama.cpp-grammar, its GBNF of the constraint with "
        "ssd-edge's rigid separators; llama.cpp-json_schema, its default json_schema conversion")


@dataclass(frozen=True)
class ServerAnswer:
    text: str
    tokens: int            # tokens predicted
    prompt_tokens: int     # tokens the server read (all of the prompt: no cache)
    encode_s: float        # its prompt_ms
    decode_s: float        # its predicted_ms
    tokens_per_s: float    # its predicted_per_second
    answer_s: float        # the request's wall time
    stop: str              # why it stopped (eos, limit, ...)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """One llama-server process over `target` at `threads`, started on entering, stopped on leaving."""

    def __init__(self, binary: Path, target: Path, *, threads: int, n_ctx: int, ready_s: float = 300,
                 extra: Sequence[str] = ()) -> None:
        self.binary, self.target, self.threads, self.n_ctx, self.ready_s = binary, target, threads, n_ctx, ready_s
        self.extra = tuple(extra)  # more flags (the completion bench's: --cache-reuse, -md, --spec-type, ...)
        self.name = BINARY         # in messages
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._log: Any = None
        self._client: Any = None
        self._gbnf: dict[str, str] = {}

    def command(self) -> list[str]:
        t = str(self.threads)
        return [str(self.binary), "-m", str(self.target), "-t", t, "-tb", t, "-c", str(self.n_ctx), "-np", "1",
                "--host", "127.0.0.1", "--port", str(self.port), "--no-webui", *self.extra]

    def __enter__(self) -> "LlamaServer":
        import httpx

        self._log = tempfile.TemporaryFile(mode="w+", prefix="ssd-edge-llama-server-")
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)  # Ctrl-C reaches us only
        self._client = httpx.Client(base_url=self.url, timeout=httpx.Timeout(600.0, connect=5.0))
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        """Until GET /health answers 200 (503 while the model loads); RuntimeError if the process ends."""
        import httpx

        end = time.monotonic() + self.ready_s
        while time.monotonic() < end:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if self._client.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} was not ready after {self.ready_s:.0f} s: {self.log_tail()}")

    def log_tail(self, lines: int = 3) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        text = [ln.strip() for ln in self._log.read().splitlines() if ln.strip()]
        return " | ".join(text[-lines:])

    def stop(self) -> None:
        """Terminate the server (kill it if it has not ended after 10 s) and close what it held."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    # ------------------------------------------------------------ requests
    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        r = self._client.post("/completion", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"{BINARY} answered {r.status_code}: {r.text[:200]}")
        return r.json()

    def complete(self, tokens: list[int], constrain: dict[str, Any], *, n_predict: int, temperature: float,
                 seed: int) -> ServerAnswer:
        """One answer to the prompt `tokens` under `constrain` ({"grammar": ...} or {"json_schema": ...})."""
        body = {"prompt": list(tokens), "n_predict": n_predict, "temperature": temperature, "seed": seed,
                "cache_prompt": False, "stream": False, **constrain}
        t0 = time.perf_counter()
        data = self._post(body)
        wall = time.perf_counter() - t0
        t = data.get("timings") or {}
        return ServerAnswer(text=data.get("content", ""), tokens=int(t.get("predicted_n", data.get("tokens_predicted", 0))),
                            prompt_tokens=int(t.get("prompt_n", 0)), encode_s=float(t.get("prompt_ms", 0.0)) / 1e3,
                            decode_s=float(t.get("predicted_ms", 0.0)) / 1e3,
                            tokens_per_s=float(t.get("predicted_per_second", 0.0)), answer_s=wall,
                            stop=str(data.get("stop_type", "")))

    def gbnf(self, schema: dict[str, Any]) -> str:
        """llama.cpp's own GBNF of `schema` (its json_schema conversion, default whitespace), asked of the
        server once per schema: a one-token request carrying it, the grammar read back."""
        key = json.dumps(schema, sort_keys=True)
        if key not in self._gbnf:
            data = self._post({"prompt": [0], "n_predict": 1, "json_schema": schema, "cache_prompt": False})
            grammar = (data.get("generation_settings") or {}).get("grammar")
            if not isinstance(grammar, str) or "root" not in grammar:
                raise RuntimeError(f"{BINARY} gave no converted grammar in generation_settings")
            self._gbnf[key] = grammar
        return self._gbnf[key]


# ---------------------------------------------------------------- what each kind sends

# llama.cpp's conversion writes `space` after every structural character and value; its rule lets a
# blank, or newlines and indentation, stand there. rigid() pins it: the separators carry their one
# space, every other `space` is empty.
_SEP = {re.compile(r'(?<![\\\w])"," space\b'): '", "', re.compile(r'(?<![\\\w])":" space\b'): '": "'}
_SPACE_RULE = re.compile(r"^space ::= .*$", re.M)


def rigid(gbnf: str) -> str:
    """llama.cpp's GBNF of a schema with ssd-edge's rigid JSON: ", " and ": ", no other whitespace."""
    if not _SPACE_RULE.search(gbnf):
        raise ValueError("the converted grammar has no `space` rule to pin")
    for pattern, literal in _SEP.items():
        gbnf = pattern.sub(lambda m: literal, gbnf)
    return _SPACE_RULE.sub('space ::= ""', gbnf)


def call_schema(tools: Any) -> dict[str, Any]:
    """One call as a JSON schema: {"name": the tool's name, "arguments": its parameters}, anyOf the tools."""
    calls = [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
              "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def constrain(shape: Any, kind: str, server: LlamaServer, parallel: bool = True) -> dict[str, Any]:
    """The request fields that hold llama-server's answer to `shape` (structured.request.Shape) in `kind`."""
    if kind not in KINDS:
        raise ValueError(f"unknown llama-server peer kind {kind!r}")
    if shape.constraint is None:
        raise ValueError("the answer is free (tool_choice auto in the json format): nothing to constrain")
    if shape.choice is not None and shape.choice.kind == "auto":
        raise ValueError("tool_choice auto: the answer is free until a call's tag, which no peer grammar here "
                         "waits for")
    if shape.choice is not None and shape.fmt == "tags":  # the call object's grammar inside Qwen's tags
        gbnf = server.gbnf(call_schema(shape.choice.tools))
        body = re.sub(r"^root ::=", "call ::=", rigid(gbnf) if kind == "grammar" else gbnf, flags=re.M)
        more = f' ("\\n" {OPEN} "\\n" call "\\n" {CLOSE})*' if parallel else ""
        return {"grammar": f'root ::= {OPEN} "\\n" call "\\n" {CLOSE}{more}\n{body}'}
    if shape.choice is not None:  # the json format: {"tool_calls": [call, ...]} is the whole answer
        calls = {"type": "array", "items": call_schema(shape.choice.tools), "minItems": 1,
                 **({} if parallel else {"maxItems": 1})}
        schema = {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"],
                  "additionalProperties": False}
    elif isinstance(shape.constraint, JsonSchema):
        schema = shape.constraint.schema
    elif isinstance(shape.constraint, JsonObject):
        schema = {"type": "object"}
    else:
        raise ValueError(f"no llama-server peer for the constraint {shape.constraint!r}")
    return {"json_schema": schema} if kind == "json_schema" else {"grammar": rigid(server.gbnf(schema))}


def record(server: LlamaServer, asked: Any, prompt: Any, setting: str, kind: str, *, rep: int, seed: int,
           max_tokens: int, temperature: float) -> PeerRecord:
    """One answer of llama-server in `kind` to a structured prompt (asked: record.Asked), checked."""
    r = server.complete(asked.tokens, constrain(asked.shape, kind, server, asked.parallel),
                        n_predict=prompt.max_tokens or max_tokens, temperature=temperature, seed=seed)
    valid, invalid = asked.check(r.text)
    return PeerRecord(setting=setting, prompt_id=prompt.id, category=prompt.category, k=0, kind=kind, rep=rep,
                      prompt_tokens=r.prompt_tokens, tokens=r.tokens, decode_s=r.decode_s, tokens_per_s=r.tokens_per_s,
                      drafted=0, accepted=0, encode_s=r.encode_s, answer_s=r.answer_s, valid=valid, invalid=invalid)


def find(tools_dir: str | os.PathLike[str] | None = None) -> Path | None:
    from .peer import find_binary

    return find_binary(tools_dir, BINARY)
