"""The completion bench's sequence and report (ssd_edge/bench/fim.py, fim_report.py), no models: llama.vim's
request shape (256 lines above, 64 below, the cut line, the typed prompt), its ring of extra chunks, the
first-line check, each set-up's summary and the goal."""

from __future__ import annotations

import json
import random

import pytest

from ssd_edge.bench import fim
from ssd_edge.bench.args import BenchArgs
from ssd_edge.bench.fim_report import FimRecord, FimResult, FimSetup, goal, markdown, summarize, write
from ssd_edge.bench.schema import MachineInfo
from ssd_edge.errors import ConfigError

LINES = tuple(f"    line_{i} = {i}" for i in range(400))


def test_request_has_256_lines_above_64_below_and_the_line_cut_out():
    row = 300
    col = fim.cursor_col(LINES[row])
    body = fim.fim_request(LINES, row, col, [])
    above = body["input_prefix"].split("\n")
    assert above[-1] == "" and len(above) - 1 == 256
    assert above[0] == LINES[row - 256] and above[-2] == LINES[row - 1]
    below = body["input_suffix"].split("\n")
    assert below[0] == "" and below[-1] == ""  # the rest of the cursor's line (cut), then 64 lines
    assert below[1:-1] == list(LINES[row + 1:row + 65])
    assert body["prompt"] == "    line_300" and LINES[row] not in body["input_prefix"] + body["input_suffix"]
    assert body["n_indent"] == 4 and body["n_predict"] == fim.N_PREDICT
    assert body["temperature"] == 0 and "temperature" in body["samplers"] and body["stream"] is True


def test_request_near_the_top_and_bottom_takes_what_there_is():
    body = fim.fim_request(LINES, 10, 4, [])
    assert body["input_prefix"].count("\n") == 10
    body = fim.fim_request(LINES, 390, 4, [])
    assert body["input_suffix"].count("\n") == 1 + 9


def test_cursor_after_indentation_and_first_word():
    assert fim.cursor_col("        return self.x") == len("        return")
    assert fim.cursor_col("x = 1") == 1
    assert fim.cursor_col("    (a, b) = c") == len("    (")
    assert fim.fim_request(("", "   "), 1, 3, [])["prompt"] == ""  # llama.vim: a blank line starts at column 0


def test_cursor_rows_move_down_on_code_lines():
    lines = ["# c", "", "a = 1", "# c", "b = 2", "", "c = 3", "d = 4", "", ""]
    rows = fim.cursor_rows(lines, 3)
    assert rows == sorted(set(rows)) and all(lines[r].strip() and not lines[r].startswith("#") for r in rows)
    assert len(fim.cursor_rows(LINES, 5)) == 5


def test_ring_picks_like_llama_vim():
    ring = fim.Ring(rng=random.Random(0))
    ring.pick(LINES[:2], "f")  # fewer than 3 lines: not picked
    assert not ring.queued
    ring.pick(LINES[:100], "f")
    (c,) = ring.queued
    assert len(c.lines) == fim.RING_CHUNK_SIZE // 2 + 1  # vim's inclusive slice
    ring.pick(c.lines, "f")  # an exact copy is not picked again
    assert len(ring.queued) == 1
    assert ring.update() and ring.chunks == [c] and not ring.queued and not ring.update()
    assert ring.extra() == [{"text": "\n".join(c.lines) + "\n", "filename": "f"}]


def test_ring_holds_16_the_oldest_leaves_first():
    ring = fim.Ring(rng=random.Random(0))
    for i in range(20):
        ring.queued.append(fim.Chunk((f"x{i}",), "f"))
        ring.update()
    assert len(ring.chunks) == fim.RING_N_CHUNKS and ring.chunks[0].lines == ("x4",)


def test_similar_chunks_evicted_or_refused():
    a = tuple(f"l{i}" for i in range(20))
    b = a[:19] + ("other",)
    assert fim.chunk_sim(a, b) > 0.9
    ring = fim.Ring(rng=random.Random(0))
    ring.queued.append(fim.Chunk(a, "f"))
    ring.pick(b, "f")              # refused
    assert [c.lines for c in ring.queued] == [a]
    ring.pick(b, "f", evict=True)  # replaces it
    assert [c.lines for c in ring.queued] == [b]


def test_sequence_from_the_standard_library_is_fixed():
    steps = list(fim.sequence(fim.stdlib_sources(), 3))
    fims = [s for k, s in steps if k == "fim"]
    assert len(fims) == 9 and [c.index for c in fims] == list(range(9))
    assert [c.file for c in fims] == [f for f in fim.FILES for _ in range(3)]
    assert fims[0].body["input_extra"] == []  # nothing picked before the first completion
    assert any(k == "warm" for k, _ in steps) and fims[-1].body["input_extra"]
    for c in fims:
        assert c.cut.startswith(c.typed) and c.cut.strip() != c.typed.strip()
    again = [s.body for k, s in fim.sequence(fim.stdlib_sources(), 3) if k == "fim"]
    assert again == [c.body for c in fims]
    warm = next(s for k, s in steps if k == "warm")
    assert warm["n_predict"] == 0 and warm["input_prefix"] == "" and warm["input_extra"]


def test_first_line_check():
    assert fim.first_line_ok("    return", "    return self.x  ", " self.x\n    y = 2")
    assert not fim.first_line_ok("    return", "    return self.x", " self.y\n")
    assert not fim.first_line_ok("    return", "    return self.x", "\n    self.x")


def _rec(setup: str, i: int, s: float, ok: bool, n: int = 40) -> FimRecord:
    return FimRecord(setup=setup, index=i, file="a.py", row=1, seconds=s, ttft_s=s / 2, tokens_cached=100,
                     prompt_n=50, predicted_n=n, predicted_ms=1000.0, prompt_ms=10.0, first_line_ok=ok,
                     first_line="x", cut="x")


def _machine() -> MachineInfo:
    return MachineInfo(os="linux", machine="x86_64", cpu="cpu", cores=2, ram_gib=1.0, python="3.11",
                       llama_system_info="", load_avg_start=(0.0, 0.0, 0.0))


def test_summary_goal_and_files(tmp_path):
    recs = [_rec("ssd-edge auto", i, 10.0, i < 8) for i in range(9)] + \
           [_rec("llama-server", i, 12.0, i < 9) for i in range(9)] + \
           [_rec("llama-server+ngram", i, 11.5, i < 9) for i in range(9)]
    setups = [summarize(FimSetup(name=n, server=k, command=["x"]), recs, 1.5)
              for n, k in (("ssd-edge auto", "ssd-edge"), ("llama-server", "llama-server"),
                           ("llama-server+ngram", "llama-server"))]
    ours = setups[0]
    assert ours.completions == 9 and ours.s_per_completion == 10.0 and ours.ttft_s == 5.0
    assert ours.decode_tok_s == pytest.approx(40.0) and ours.first_lines_ok == 8 and ours.warm_s == 1.5
    g = goal(setups)
    assert g.peer == "llama-server+ngram" and g.speedup == pytest.approx(1.15) and g.first_lines == (8, 9) and g.met
    slower = [s.model_copy(update={"s_per_completion": 11.0}) if s.name == "ssd-edge auto" else s for s in setups]
    assert not goal(slower).met
    assert goal(setups[1:]) is None  # no ssd-edge set-up: nothing to compare
    result = FimResult(command="ssd-edge bench --fim", created="now", machine=_machine(), models={}, files=["a.py"],
                       per_file=3, n_predict=48, n_ctx=8192, threads=2, setups=setups, goal=g, records=recs)
    md = markdown(result)
    assert "| ssd-edge auto | 9 | 10.00 | 5.00 | 100 | 50 | 40.0 | 8/9 | 1.5 |" in md and "1.15x" in md
    paths = write(result, tmp_path)
    data = json.loads(paths[0].read_text())
    assert data["kind"] == "fim" and len(data["records"]) == 27 and paths[1].read_text() == md


@pytest.mark.parametrize("kw, words", [
    (dict(fim_cursors=0), "--fim-cursors"), (dict(ctx_size=1024), "--ctx-size"),
    (dict(stand_in="bf16"), "--stand-in"), (dict(prompts="structured"), "--prompts"),
])
def test_fim_flags_checked(kw, words):
    with pytest.raises(ConfigError, match=words):
        BenchArgs(fim=True, **kw).checked()


def test_fim_cursors_needs_fim():
    with pytest.raises(ConfigError, match="--fim"):
        BenchArgs(fim_cursors=5).checked()
