"""The completion bench's editing sequence (`ssd-edge bench --fim`): what an editor sends, request by
request, as llama.vim sends it (ggml-org/llama.vim, autoload/llama.vim), cut from real source files.

The files are the Python standard library's (FILES, read from `sysconfig.get_paths()["stdlib"]`: every
machine with Python has them; a fixed list, so the sequence is the same on every run of one Python). In each
file the cursor moves down: `per_file` lines spread evenly over it (cursor_rows: the first line of code at or
after each i/(per_file+1) of the file). At each such line the user is typing it: the cursor stands after the
line's indentation and its first word (cursor_col), the rest of the line is cut out (not yet typed), and the
completion's first line should give it back (first_line_ok).

A completion request is llama.vim's /infill body (fim_request):
  input_prefix  the 256 lines above the cursor's line (n_prefix), each ended by a newline
  prompt        the cursor's line before the cursor (llama.vim: "" where that is only whitespace)
  input_suffix  the rest of the cursor's line (here "", it is cut out), a newline, the 64 lines below (n_suffix)
  input_extra   the ring of chunks (Ring), oldest first, each {filename, text}
  n_indent      the typed indentation; top_k 40, top_p 0.99, cache_prompt true, t_max_prompt_ms 500
with three changes for measuring: n_predict 48, greedy (samplers top_k, top_p, temperature at temperature 0:
llama.vim's sampler list draws at temperature 1 after its "infill" sampler, which ssd-edge does not apply),
t_max_predict_ms 0 (llama.vim's 1500 ms cap would cut a slow CPU's answers by the clock, not by their tokens),
and streamed (the time to the first token is read where the first token arrives).

The ring of extra chunks follows llama.vim's rules: after a completion whose cursor moved more than 32 lines
from where chunks were last picked, one chunk is picked from the lines above the prefix (ring_scope 1024
lines up to n_prefix above the cursor) and one from below the suffix (ring_chunk_size lines after it); on
leaving a file, one around the cursor (its BufLeave). A chunk is at most ring_chunk_size/2 + 1 lines,
placed at random in its range (a seeded generator here: the same picks on every run); an exact copy of a
queued or ringed chunk is not picked again, nor one more than 0.9 similar (chunk_sim). Between two
completions the queued chunks move into the ring one at a time (its 1 s timer; the ring holds 16, the oldest
leaves first), each move followed by llama.vim's warm-up request (n_predict 0: the new extra context read
into the server's cache, warm_request); the bench sends those too and times them apart from the completions.
"""

from __future__ import annotations

import random
import re
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

FILES = ("textwrap.py", "shlex.py", "fractions.py")  # from the standard library
N_PREFIX, N_SUFFIX, N_PREDICT = 256, 64, 48
RING_N_CHUNKS, RING_CHUNK_SIZE, RING_SCOPE, RING_QUEUE = 16, 64, 1024, 16
PICK_DISTANCE = 32  # llama.vim picks chunks again once the cursor moved more than this many lines
_FIRST_WORD = re.compile(r"\s*(\w+|\S)")


@dataclass(frozen=True)
class Source:
    """One file of the sequence: its name (the chunks' filename) and its lines."""

    name: str
    lines: tuple[str, ...]


def stdlib_sources(names: Sequence[str] = FILES) -> list[Source]:
    """The sequence's files, read from this Python's standard library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return [Source(n, tuple((root / n).read_text(encoding="utf-8").splitlines())) for n in names]


def cursor_rows(lines: Sequence[str], n: int) -> list[int]:
    """`n` rows (0-based) moving down the file: the first line of code (not blank, not a comment) at or after
    each i/(n+1) of it, i = 1..n, no row twice."""
    rows: list[int] = []
    for i in range(1, n + 1):
        r = max(len(lines) * i // (n + 1), rows[-1] + 1 if rows else 0)
        while r < len(lines) and (not lines[r].strip() or lines[r].lstrip().startswith("#")):
            r += 1
        if r < len(lines):
            rows.append(r)
    return rows


def cursor_col(line: str) -> int:
    """Where the user's cursor stands in the line being typed: after its indentation and first word."""
    m = _FIRST_WORD.match(line)
    return m.end() if m else len(line)


@dataclass(frozen=True)
class Chunk:
    lines: tuple[str, ...]
    filename: str

    def extra(self) -> dict[str, str]:
        return {"text": "\n".join(self.lines) + "\n", "filename": self.filename}


def chunk_sim(a: Sequence[str], b: Sequence[str]) -> float:
    """llama.vim's similarity of two chunks: twice the lines of `a` found in `b`, over both lengths."""
    common = sum(1 for x in a if x in b)
    return 2.0 * common / (len(a) + len(b))


@dataclass
class Ring:
    """llama.vim's ring of extra context: picked chunks wait in `queued`, then move into `chunks`."""

    rng: random.Random = field(default_factory=lambda: random.Random(0))
    chunks: list[Chunk] = field(default_factory=list)
    queued: list[Chunk] = field(default_factory=list)
    n_chunks: int = RING_N_CHUNKS
    chunk_size: int = RING_CHUNK_SIZE

    def pick(self, text: Sequence[str], filename: str, evict: bool = False) -> None:
        """Queue a chunk of `text` (llama.vim's s:pick_chunk)."""
        if self.n_chunks <= 0 or len(text) < 3:
            return
        if len(text) + 1 < self.chunk_size:
            lines = tuple(text)
        else:
            half = self.chunk_size // 2
            l0 = self.rng.randint(0, max(0, len(text) - half))
            lines = tuple(text[l0:min(l0 + half, len(text)) + 1])  # vim's slice [l0:l1] holds l1
        if any(c.lines == lines for c in (*self.chunks, *self.queued)):
            return
        for pool in (self.queued, self.chunks):
            for i in range(len(pool) - 1, -1, -1):
                if chunk_sim(pool[i].lines, lines) > 0.9:
                    if not evict:
                        return
                    del pool[i]
        if len(self.queued) == RING_QUEUE:
            del self.queued[0]
        self.queued.append(Chunk(lines, filename))

    def update(self) -> bool:
        """Move the first queued chunk into the ring (llama.vim's s:ring_update); False if none waits."""
        if not self.queued:
            return False
        if len(self.chunks) == self.n_chunks:
            del self.chunks[0]
        self.chunks.append(self.queued.pop(0))
        return True

    def extra(self) -> list[dict[str, str]]:
        return [c.extra() for c in self.chunks]


@dataclass(frozen=True)
class Completion:
    """One completion of the sequence: where, what was cut out, and the request."""

    index: int
    file: str
    row: int          # 0-based
    typed: str        # the line before the cursor, as typed
    cut: str          # the whole line as the file has it
    body: dict[str, Any]


def fim_request(lines: Sequence[str], row: int, col: int, extra: list[dict[str, str]],
                n_predict: int = N_PREDICT) -> dict[str, Any]:
    """llama.vim's /infill body at (row, col) of `lines`, the rest of the cursor's line cut out, with the
    bench's changes (the module's docstring)."""
    typed = lines[row][:col]
    if not typed.strip():
        typed, indent = "", 0
    else:
        indent = len(typed) - len(typed.lstrip())
    above = lines[max(0, row - N_PREFIX):row]
    below = lines[row + 1:row + 1 + N_SUFFIX]
    return {"input_prefix": "\n".join(above) + "\n", "input_suffix": "\n" + "\n".join(below) + "\n",
            "input_extra": extra, "prompt": typed, "n_predict": n_predict, "n_indent": indent,
            "top_k": 40, "top_p": 0.99, "temperature": 0.0, "samplers": ["top_k", "top_p", "temperature"],
            "seed": 0, "stream": True, "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 0}


def warm_request(extra: list[dict[str, str]]) -> dict[str, Any]:
    """llama.vim's warm-up after a ring update: the extra context alone, nothing generated."""
    return {"input_prefix": "", "input_suffix": "", "input_extra": extra, "prompt": "", "n_predict": 0,
            "temperature": 0.0, "stream": False, "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 1,
            "t_max_predict_ms": 1, "response_fields": [""]}


Step = tuple[str, Any]  # ("warm", body) or ("fim", Completion)


def sequence(sources: Sequence[Source], per_file: int, seed: int = 0, n_predict: int = N_PREDICT) -> Iterator[Step]:
    """The editing sequence: warm-ups and completions in the order an editor sends them."""
    ring = Ring(rng=random.Random(seed))
    index, y_pick = 0, -9999
    for src in sources:
        lines, row = src.lines, 0
        for row in cursor_rows(lines, per_file):
            while ring.update():
                yield "warm", warm_request(ring.extra())
            col = cursor_col(lines[row])
            body = fim_request(lines, row, col, ring.extra(), n_predict)
            yield "fim", Completion(index, src.name, row, body["prompt"], lines[row], body)
            index += 1
            y = row + 1  # llama.vim's lines are 1-based
            if abs(y - y_pick) > PICK_DISTANCE:
                ring.pick(lines[max(1, y - RING_SCOPE) - 1:max(1, y - N_PREFIX)], src.name)
                end = len(lines)
                ring.pick(lines[min(end, y + N_SUFFIX) - 1:min(end, y + N_SUFFIX + ring.chunk_size)], src.name)
                y_pick = y
        half = ring.chunk_size // 2  # BufLeave: a chunk around the cursor, similar ones evicted
        ring.pick(lines[max(0, row - half):min(len(lines), row + half + 1)], src.name, evict=True)
        y_pick = -9999


def first_line(typed: str, content: str) -> str:
    """The cursor's line once the completion's first line is accepted."""
    return typed + content.split("\n", 1)[0]


def first_line_ok(typed: str, cut: str, content: str) -> bool:
    """Whether the completion gives back the line that was cut out (trailing blanks aside). A completion
    that starts on a new line (typed a whole line's worth already) counts as wrong."""
    return first_line(typed, content).rstrip() == cut.rstrip()
