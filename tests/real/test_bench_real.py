"""A tiny real benchmark on the small pair writes a bench.json that validates."""

from __future__ import annotations

from ssd_edge import bench
from ssd_edge.bench import BenchResult


def test_tiny_real_bench_on_the_small_pair_writes_valid_json(small_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_EDGE_HOME", str(tmp_path / "home"))  # no profile: auto without calibration
    target, draft = small_pair
    code = bench.cli_main(["-m", str(target), "-md", str(draft), "--quick", "--modes", "ar,sd,ssd,auto",
                           "--settings", "separate", "--category", "code,code-edit", "-n", "8", "--no-peer",
                           "--no-calibrate", "--no-plot", "-o", str(tmp_path / "out")])
    assert code == 0
    result = BenchResult.model_validate_json((tmp_path / "out" / "bench.json").read_text())
    assert {r.mode for r in result.runs} == {"ar", "sd", "ssd", "auto"}
    assert len(result.runs) == 4 * 2
    assert {r.category for r in result.summary} == {"all", "code", "code-edit"}
    assert all(r.tokens >= 1 for r in result.runs)
    assert result.peer.available is False and "not available" in result.peer.note
    ar = {r.prompt_id: r.output_sha for r in result.runs if r.mode == "ar"}
    same = sum(r.output_sha == ar[r.prompt_id] for r in result.runs if r.mode != "ar")
    assert same >= len(result.runs) - len(ar) - 2   # greedy: identical but for rare near-ties
