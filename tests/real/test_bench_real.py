"""A tiny real benchmark on the small pair, through `ssd-edge bench` with stderr
not a terminal (a log), on a prompt file of the user's own (--prompts): it
reports each step as a line while it runs, and writes a bench.json that validates."""

from __future__ import annotations

import json
import re
import sys

from typer.testing import CliRunner

from ssd_edge.bench.schema import BenchResult
from ssd_edge.cli import commands as cli


def test_tiny_real_bench_on_the_small_pair_writes_valid_json(small_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_EDGE_HOME", str(tmp_path / "home"))  # no profile: auto without calibration
    target, draft = small_pair
    prompts = tmp_path / "mine.jsonl"  # --prompts: the user's own suite (one of them outside --category)
    prompts.write_text("".join(json.dumps({"id": i, "category": c, "messages": [{"role": "user", "content": t}]}) + "\n"
                               for i, c, t in (("my-code", "code", "Write a Python function that adds two numbers."),
                                               ("my-edit", "code-edit", "Rename x to y: x = 1; print(x)"),
                                               ("my-prose", "prose", "Describe the sea."))))
    with CliRunner().isolation() as (_, err, _):
        code = cli.run(["bench", "-m", str(target), "-md", str(draft), "--quick", "--modes", "ar,sd,ssd,auto",
                        "--prompts", str(prompts),
                        "--settings", "separate", "--category", "code,code-edit", "-n", "8", "--no-peer",
                        "--no-calibrate", "--no-plot", "-o", str(tmp_path / "out")])
        sys.stderr.flush()
        log = err.getvalue().decode()
    assert code == 0, log
    steps = re.findall(r"^\[(\d+)/(\d+) \d+:\d\d:\d\d\] (.*)$", log, re.M)
    assert [int(i) for i, _, _ in steps] == list(range(1, 1 + 1 + 4 * 2))  # warm-up, then 4 modes x 2 prompts
    assert steps[0][2] == "separate: warm-up" and all(total == "9" for _, total, _ in steps)
    result = BenchResult.model_validate_json((tmp_path / "out" / "bench.json").read_text())
    assert {r.mode for r in result.runs} == {"ar", "sd", "ssd", "auto"}
    assert {r.prompt_id for r in result.runs} == {"my-code", "my-edit"}
    assert len(result.runs) == 4 * 2
    assert {r.category for r in result.summary} == {"all", "code", "code-edit"}
    assert all(r.tokens >= 1 for r in result.runs)
    assert result.peer.available is False and "not available" in result.peer.note
    ar = {r.prompt_id: r.output_sha for r in result.runs if r.mode == "ar"}
    # greedy on the small pair, whose batched and one-token logits are bitwise equal (test_backend.py,
    # test_lossless.py): every mode gives ar's answer, no near-tie excuses a difference
    differ = [(r.mode, r.prompt_id) for r in result.runs if r.output_sha != ar[r.prompt_id]]
    assert not differ, differ
