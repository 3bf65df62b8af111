"""The benchmark's inputs and outputs: the shipped prompt suite, the summary
arithmetic, the goals, the llama.cpp peer's output parser, and bench.json
against its pydantic schema, from fake runs (a tiny real run on the small pair
is in tests/real/test_bench_real.py)."""

from __future__ import annotations

import json
import platform
import re
import socket
import stat
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ssd_edge.bench import args as bench_args, machine as bench_machine, peer as bench_peer, report as bench_report
from ssd_edge.bench import run as bench, schema
from ssd_edge.bench.schema import BenchResult, PeerRecord, RunRecord
from ssd_edge.bench.priced import Priced
from ssd_edge.cli import commands as cli
from ssd_edge.errors import ConfigError
from ssd_edge.llama import backend


# ---------------------------------------------------------------- the prompt suite

def test_shipped_suite_has_twenty_varied_prompts_in_every_category():
    prompts = bench_args.load_prompts()
    assert len(prompts) >= 20
    assert len({p.id for p in prompts}) == len(prompts)
    cats = {p.category for p in prompts}
    assert cats == set(schema.TEXT_CATEGORIES)
    sizes = [sum(len(m["content"]) for m in p.messages) for p in prompts]
    assert max(sizes) > 4 * min(sizes)       # varied lengths
    for p in prompts:
        assert p.messages[-1]["role"] == "user"
    # code-edit prompts hand over the code that the answer repeats
    assert all("```" in p.messages[-1]["content"] for p in prompts if p.category == "code-edit")


def test_quick_picks_one_prompt_per_category():
    quick = bench_args.quick_prompts(bench_args.load_prompts())
    assert [p.category for p in quick] == list(schema.TEXT_CATEGORIES)


def test_a_broken_prompt_file_is_a_one_line_config_error(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "category": "code", "messages": [{"role": "user", "content": "x"}]}\n{"id": 3}\n')
    with pytest.raises(ConfigError, match="line 2"):
        bench_args.load_prompts(f)
    with pytest.raises(ConfigError, match="cannot read"):
        bench_args.load_prompts(tmp_path / "missing.jsonl")


def test_hardware_settings_on_two_cores():
    s = bench_machine.hardware_settings(2)
    assert (s["separate"].target_threads, s["separate"].draft_threads) == (1, 1)
    assert (s["shared"].target_threads, s["shared"].draft_threads) == (2, 2)


# ---------------------------------------------------------------- summary arithmetic on fake runs

def run(setting="shared", mode="ar", prompt="p1", category="code", tokens=33, decode_s=4.0, **kw) -> RunRecord:
    base = dict(setting=setting, mode=mode, prompt_id=prompt, category=category, rep=0, seed=0, prompt_tokens=20,
                tokens=tokens, stop_reason="length", wall_s=decode_s + 0.5, ttft_s=0.5, decode_s=decode_s,
                tokens_per_s=(tokens - 1) / decode_s, latencies_ms=[100.0, 120.0, 300.0], drafted=0, accepted=0,
                spec_rounds=0, rounds=tokens, lookups=0, hits=0, partial_hits=0, draft_busy_s=0.0,
                target_busy_s=decode_s, peak_rss_mib=900.0, modes_run={mode: tokens}, output_sha="abc")
    base.update(kw)
    return RunRecord(**base)


def fake_runs() -> list[RunRecord]:
    out = []
    for setting in ("separate", "shared"):
        for prompt, cat in (("p1", "code"), ("p2", "prose")):
            out.append(run(setting, "ar", prompt, cat, decode_s=8.0))                       # 4 tok/s
            out.append(run(setting, "sd", prompt, cat, decode_s=5.0, drafted=40, accepted=30, spec_rounds=10))
            out.append(run(setting, "lookup", prompt, cat, decode_s=7.0, drafted=10, accepted=2, spec_rounds=5))
            out.append(run(setting, "ssd", prompt, cat, decode_s=4.0 if cat == "code" else 6.0, drafted=40,
                           accepted=30, spec_rounds=10, lookups=10, hits=7, draft_busy_s=3.0,
                           output_sha="abc" if cat == "code" else "def"))
            out.append(run(setting, "auto", prompt, cat, decode_s=4.1 if cat == "code" else 5.0, drafted=40,
                           accepted=30, spec_rounds=10, lookups=4, hits=3, modes_run={"ssd": 8, "sd": 2}))
    return out


def fake_peer() -> list[PeerRecord]:
    return [PeerRecord(setting="shared", prompt_id=p, category=c, k=k, rep=0, prompt_tokens=20, tokens=32,
                       decode_s=6.4 if k == 4 else 8.0, tokens_per_s=5.0, drafted=40, accepted=28,
                       encode_s=1.6 if k == 4 else None)
            for p, c in (("p1", "code"), ("p2", "prose")) for k in (3, 4)] + [
        PeerRecord(setting="shared", prompt_id=p, category=c, k=4, kind="lookup", rep=0, prompt_tokens=20, tokens=32,
                   decode_s=1.0, tokens_per_s=32.0, drafted=40, accepted=30) for p, c in (("p1", "code"), ("p2", "prose"))]


def test_summary_is_ratio_of_sums_and_speedups_are_within_the_setting():
    rows = bench_report.summarize(fake_runs(), fake_peer(), k=4)
    get = {(r.setting, r.mode, r.category): r for r in rows}
    ar = get[("shared", "ar", "code")]
    assert ar.tokens_per_s == pytest.approx(32 / 8.0)
    assert ar.speedup_vs_ar == pytest.approx(1.0) and ar.k == 0
    sd = get[("shared", "sd", "all")]
    assert sd.tokens_per_s == pytest.approx(64 / 10.0)
    assert sd.speedup_vs_ar == pytest.approx((64 / 10.0) / (64 / 16.0))
    assert sd.acceptance == pytest.approx(0.75) and sd.mean_accepted_len == pytest.approx(3.0)
    assert get[("shared", "ssd", "code")].hit_rate == pytest.approx(0.7)
    assert get[("shared", "auto", "all")].k is None
    assert ar.latency_p50_ms == pytest.approx(120.0)
    peer = get[("shared", "llama.cpp k=4", "code")]
    assert peer.tokens_per_s == pytest.approx(32 / 6.4) and peer.speedup_vs_ar == pytest.approx(5.0 / 4.0)
    assert peer.acceptance == pytest.approx(0.7)
    lookup = get[("shared", "llama.cpp lookup k=4", "all")]   # llama-lookup: a row of its own
    assert lookup.tokens_per_s == pytest.approx(32.0) and lookup.runs == 2


def test_the_whole_answer_is_timed_from_the_prompt_on_both_sides():
    """answer tokens/s: ours over TTFT + decode (the run's wall), llama.cpp's over its encode + decode;
    none where a peer run did not say how long its prompt took."""
    rows = bench_report.summarize(fake_runs(), fake_peer(), k=4)
    get = {(r.setting, r.mode, r.category): r for r in rows}
    assert get[("shared", "ar", "code")].answer_tokens_per_s == pytest.approx(33 / 8.5)
    assert get[("shared", "auto", "all")].answer_tokens_per_s == pytest.approx(66 / (4.6 + 5.5))
    assert get[("shared", "llama.cpp k=4", "all")].answer_tokens_per_s == pytest.approx(64 / (2 * (6.4 + 1.6)))
    assert get[("shared", "llama.cpp k=3", "all")].answer_tokens_per_s is None


def test_goals_compare_the_right_rows():
    rows = bench_report.summarize(fake_runs(), fake_peer(), k=4)
    goals = {g.name: g for g in bench_report.goals(rows, bench_args.BENCH_MODES)}
    g = goals["shared, code: auto vs ar"]                        # auto 32/4.1 vs ar 32/8
    assert g.value == pytest.approx(8.0 / 4.1) and g.met and g.threshold == ">= 0.97x"  # compute-bound: never slower
    assert goals["shared, all: auto vs ar"].threshold == ">= 0.97x"
    g = goals["shared, code: auto vs the best fixed mode"]       # ... vs ssd 32/4
    assert g.value == pytest.approx(4.0 / 4.1) and g.met and g.threshold == ">= 0.95x"
    g = goals["shared, prose: auto vs the best fixed mode"]      # auto 32/5 vs sd 32/5
    assert g.value == pytest.approx(1.0) and g.met
    g = goals["shared, all: auto's first token vs ar's"]         # the same 0.5 s first token
    assert g.value == pytest.approx(1.0) and g.met and g.threshold == "<= 1.10x"
    assert "shared, code-edit: auto vs ar" not in goals          # no code-edit prompts ran: no goal
    assert not any("llama.cpp" in name for name in goals)        # the peer bound is the stand-in's


def test_a_stand_in_setting_is_held_to_the_memory_bound_speedups():
    rows = bench_report.summarize(fake_runs(), fake_peer(), k=4)
    goals = {g.name: g for g in bench_report.goals(rows, bench_args.BENCH_MODES, stand_ins=["shared"])}
    g = goals["shared, code: auto vs ar"]
    assert g.value == pytest.approx(8.0 / 4.1) and g.met and g.threshold == ">= 1.60x"
    assert goals["shared, prose: auto vs ar"].threshold == ">= 1.15x"
    assert goals["shared, code: auto vs the best fixed mode"].threshold == ">= 0.97x"
    g = goals["shared, all: auto vs llama.cpp's speculative decoding"]
    assert g.threshold == ">= 1.25x" and "llama.cpp k=" in g.detail  # speculative-simple (lookup is faster here)
    g = goals["shared, all: auto vs llama.cpp's speculative decoding, prompt to answer"]  # k=4, the faster decode
    assert g.value == pytest.approx((66 / 10.1) / (64 / 16.0)) and g.threshold == ">= 1.25x"
    assert goals["separate, code: auto vs ar"].threshold == ">= 0.97x"  # not a stand-in setting


# ---------------------------------------------------------------- the JSON schema

def fake_result(tmp_path: Path) -> BenchResult:
    runs, peer = fake_runs(), fake_peer()
    rows = bench_report.summarize(runs, peer, k=4)
    machine = schema.MachineInfo(os="linux", machine="x86_64", cpu="cpu", cores=2, ram_gib=24.0,
                                python="3.11", llama_system_info="AVX2 = 1", load_avg_start=(0.1, 0.2, 0.3),
                                load_avg_end=(0.4, 0.5, 0.6))
    settings = list(bench_machine.hardware_settings(2).values())
    return BenchResult(
        created="2026-01-01T00:00:00+00:00", command=["ssd-edge", "bench"], duration_s=1.0, machine=machine,
        libraries=bench_machine.library_versions(),
        models=[schema.ModelInfo(role="target", name="t.gguf", path="/t.gguf", size=1),
                schema.ModelInfo(role="draft", name="d.gguf", path="/d.gguf", size=1)],
        options=schema.BenchOptions(modes=list(bench_args.BENCH_MODES), settings=["separate", "shared"], k=4, max_tokens=33,
                                   reps=1, seed=0, temperature=0.0, n_ctx=2048, quick=False, peer_k=[3, 4],
                                   categories=["code", "prose"]),
        settings=settings, engine_configs={}, prompts=bench_args.quick_prompts(bench_args.load_prompts())[:2], profile=None,
        runs=runs, peer=schema.PeerInfo(available=True, binary="/x", version="b1", note="n", runs=peer),
        summary=rows, goals=bench_report.goals(rows, bench_args.BENCH_MODES), notes=["a note"])


def test_written_json_validates_against_the_schema_and_md_and_png_exist(tmp_path):
    result = fake_result(tmp_path)
    paths = bench_report.write(result, tmp_path, plot=True)
    assert [p.name for p in paths] == ["bench.json", "bench.md", "bench.png"]
    back = BenchResult.model_validate_json((tmp_path / "bench.json").read_text())
    assert back.summary == result.summary and back.runs == result.runs
    md = (tmp_path / "bench.md").read_text()
    assert "| shared | ssd | 4 | 2+2 |" in md and "llama.cpp k=4" in md
    assert "ssd 80% sd 20%" in md                      # what auto ran
    assert "Greedy outputs identical to ar's: 14 of 16 runs" in md
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_schema_rejects_a_result_with_missing_fields(tmp_path):
    data = json.loads(fake_result(tmp_path).model_dump_json())
    del data["machine"]["cores"]
    with pytest.raises(ValueError):
        BenchResult.model_validate(data)
    data = json.loads(fake_result(tmp_path).model_dump_json())
    data["runs"][0]["tokens_per_s"] = "fast"
    with pytest.raises(ValueError):
        BenchResult.model_validate(data)


def test_the_docs_copy_keeps_the_summary_and_the_metadata_without_the_generations(tmp_path):
    """schema.summary_only (scripts/bench_for_docs.py): what docs/bench commits of a run."""
    bench_report.write(fake_result(tmp_path), tmp_path, plot=False)
    data = json.loads((tmp_path / "bench.json").read_text())
    data["machine"]["hostname"] = ""  # a field an older schema wrote stays
    copy = schema.summary_only(data)
    assert copy["runs"] == [] and copy["peer"]["runs"] == [] and data["runs"] and data["peer"]["runs"]
    assert {k: v for k, v in copy.items() if k not in ("runs", "peer", "notes")} == \
        {k: v for k, v in data.items() if k not in ("runs", "peer", "notes")}  # summary, goals, machine, ...
    assert copy["peer"]["version"] == "b1" and copy["notes"] == ["a note", schema.DOCS_COPY]
    assert schema.summary_only(copy) == copy  # a copy again: the same
    back = BenchResult.model_validate(copy)
    assert back.summary == fake_result(tmp_path).summary
    assert "| shared | ssd | 4 | 2+2 |" in bench_report.markdown(back)  # its tables still render


# ---------------------------------------------------------------- the llama.cpp peer

PEER_OUTPUT = """
main: encoded   41 tokens in    0.512 seconds, speed:   80.078 t/s
main: decoded  128 tokens in   11.213 seconds, speed:   11.415 t/s

main: n_draft   = 4
main: n_predict = 128
main: n_drafted = 120
main: n_accept  = 97
main: accept    = 80.833%
"""


def test_peer_output_parser_reads_its_timing_lines():
    r = bench_peer.parse_output(PEER_OUTPUT)
    assert (r.tokens, r.decode_s, r.tokens_per_s) == (128, 11.213, 11.415)
    assert (r.prompt_tokens, r.drafted, r.accepted, r.encode_s) == (41, 120, 97, 0.512)
    with pytest.raises(ValueError):
        bench_peer.parse_output("llama_model_load: error")


def test_peer_command_uses_the_renamed_flags_and_the_same_settings(tmp_path):
    cmd = bench_peer.command(Path("/b/llama-speculative-simple"), Path("/t.gguf"), Path("/d.gguf"),
                             tmp_path / "p.txt", k=4, target_threads=1, draft_threads=1, max_tokens=64,
                             temperature=0.0, seed=3, n_ctx=2048)
    joined = " ".join(cmd)
    for part in ("--spec-type draft-simple", "--spec-draft-n-max 4", "-t 1", "-td 1", "-n 64", "--temp 0.0",
                 "--seed 3", "-md /d.gguf"):
        assert part in joined


def test_lookup_peer_runs_the_target_alone_at_the_same_settings(tmp_path):
    cmd = bench_peer.command(Path("/b/llama-lookup"), Path("/t.gguf"), None, tmp_path / "p.txt", k=4,
                             target_threads=2, draft_threads=2, max_tokens=64, temperature=0.0, seed=3, n_ctx=2048)
    joined = " ".join(cmd)
    for part in ("/b/llama-lookup -m /t.gguf", "--spec-draft-n-max 4", "-t 2", "-n 64", "--temp 0.0", "--seed 3"):
        assert part in joined
    assert "-md" not in cmd and "-td" not in cmd


def test_peer_binary_is_found_in_a_tools_folder_or_reported_missing(tmp_path):
    assert bench_peer.find_binary(tmp_path) is None
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / bench_peer.BINARY
    exe.write_text("#!/bin/sh\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    assert bench_peer.find_binary(tmp_path) == exe


def test_peer_runs_a_binary_and_reports_its_failure(tmp_path):
    exe = tmp_path / bench_peer.BINARY
    exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{PEER_OUTPUT}\nEOF\n")
    exe.chmod(0o755)
    r = bench_peer.run(exe, Path("/t"), Path("/d"), "hello", k=4, target_threads=2, draft_threads=2, max_tokens=8,
                       temperature=0.0, seed=0, n_ctx=512)
    assert r.tokens_per_s == 11.415
    exe.write_text("#!/bin/sh\necho 'failed to load model' >&2\nexit 1\n")
    with pytest.raises(RuntimeError, match="failed to load model"):
        bench_peer.run(exe, Path("/t"), Path("/d"), "hello", k=4, target_threads=2, draft_threads=2, max_tokens=8,
                       temperature=0.0, seed=0, n_ctx=512)


# ---------------------------------------------------------------- CLI (through `ssd-edge bench`, cli/measuring.py)

def ssd_edge(args: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `ssd-edge ARGS`; neither stream is a terminal."""
    with CliRunner().isolation() as (out, err, _):
        code = cli.run(args)
        sys.stdout.flush()
        sys.stderr.flush()
        return code, out.getvalue().decode(), err.getvalue().decode()


@pytest.fixture
def pair(tmp_path, monkeypatch) -> list[str]:
    """-m/-md flags naming two GGUF-looking files; no compiled llama.cpp needed for machine_info."""
    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    t.write_bytes(b"GGUF" + b"\0" * 12)
    d.write_bytes(b"GGUF" + b"\0" * 8)
    monkeypatch.setattr(backend, "system_info", lambda: "fake llama.cpp")
    return ["-m", str(t), "-md", str(d)]


def test_cli_rejects_bad_values_with_a_one_line_error(pair):
    code, _, err = ssd_edge(["bench", *pair, "-n", "0"])
    assert code == 2 and err.strip() == "error: -n/--n-predict must be at least 1"
    code, _, err = ssd_edge(["bench", *pair, "--modes", "ar,fast"])
    assert code == 2 and "unknown fast" in err


def test_help_is_truthful_about_outputs():
    code, out, _ = ssd_edge(["bench", "--help"])
    assert code == 0
    for word in ("bench.json", "--quick", "--llama-tools", "--temp", "separate", "shared"):
        assert word in out


def test_ctrl_c_keeps_the_runs_so_far_and_exits_130(tmp_path, monkeypatch, pair):
    done = fake_runs()[:3]

    def interrupted_run(self, tick, calibrating):
        self.records.extend(done)
        raise KeyboardInterrupt

    monkeypatch.setattr(bench.Bench, "run", interrupted_run)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the files below are outside it: written by name
    code, _, err = ssd_edge(["bench", *pair, "--no-peer", "--no-plot", "-o", str(tmp_path / "out")])
    assert code == 130
    result = BenchResult.model_validate_json((tmp_path / "out" / "bench.json").read_text())
    assert result.interrupted and result.runs == done
    assert result.command == ["ssd-edge", "bench", "-m", "t.gguf", "-md", "d.gguf", "--no-peer", "--no-plot",
                              "-o", "out"]
    assert "INTERRUPTED" in (tmp_path / "out" / "bench.md").read_text()
    assert "partial results" in err


def test_portable_paths_fold_this_machines_paths_and_leave_other_slashes():
    shown = bench_machine.PortablePaths(Path("/h/.cache/ssd-edge/models"), home=Path("/h"))
    assert [shown.path(p) for p in ("/h/.cache/ssd-edge/models/qwen/t.gguf", "/h/m/d.gguf", "/srv/x/out",
                                    "qwen/t.gguf", "qwen-1.5b")] == ["qwen/t.gguf", "~/m/d.gguf", "out",
                                                                     "qwen/t.gguf", "qwen-1.5b"]
    assert shown.text("-o=/srv/out: failed to open '/h/m/d.gguf' (-f /var/p/prompt.txt)") == \
        "-o=out: failed to open '~/m/d.gguf' (-f prompt.txt)"
    kept = "12.5 tokens/s, 1/2, </s>, http://host/x, ~/m/d.gguf, a / b"
    assert shown.text(kept) == kept


def test_a_bench_result_names_no_machine(tmp_path, monkeypatch):
    """bench.json and bench.md hold no hostname and no absolute path, through the real run and result: the
    engine is a priced one over each setting's own config (its paths are not read), llama.cpp's tools are
    scripts, one of them failing with its command line. The target in the models folder is written relative
    to it, the draft under home with ~, anything else (the tools, the output, the peer's prompt file) by name."""
    from ssd_edge.bench.priced import Priced

    home = tmp_path / "home"
    models = home / ".cache" / "ssd-edge" / "models"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SSD_EDGE_HOME", str(models.parent))
    monkeypatch.delenv("SSD_EDGE_MODELS", raising=False)
    monkeypatch.delenv("SSD_EDGE_LLAMA_TOOLS", raising=False)
    monkeypatch.setattr(platform, "node", lambda: "bench-host-7f3a")
    monkeypatch.setattr(socket, "gethostname", lambda: "bench-host-7f3a")
    monkeypatch.setattr(backend, "system_info", lambda: "fake llama.cpp")
    target, draft = models / "qwen" / "t.gguf", home / "elsewhere" / "d.gguf"
    for f in (target, draft):
        f.parent.mkdir(parents=True)
        f.write_bytes(b"GGUF" + b"\0" * 12)
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / bench_peer.BINARY).write_text(f"#!/bin/sh\ncat <<'EOF'\n{PEER_OUTPUT}\nEOF\n")
    (tools / bench_peer.LOOKUP).write_text('#!/bin/sh\necho "failed to load: $@" >&2\nexit 1\n')
    for exe in tools.iterdir():
        exe.chmod(0o755)
    monkeypatch.setattr(bench.Bench, "open_engine", lambda self, cfg: Priced().engine(cfg))
    out = tmp_path / "out"
    code, _, err = ssd_edge(["bench", "-m", str(target), "-md", str(draft), "--quick", "--modes", "ar,sd",
                             "--settings", "separate", "--category", "code", "--llama-tools", str(tools),
                             f"--output={out}", "--no-plot"])
    assert code == 0, err
    text, md = (out / "bench.json").read_text(), (out / "bench.md").read_text()
    result = BenchResult.model_validate_json(text)
    assert [r.mode for r in result.runs] == ["ar", "sd"] and len(result.peer.runs) == 1  # it ran, peer and all

    assert "bench-host-7f3a" not in text + md and str(tmp_path) not in text + md
    written = json.loads(text)
    del written["prompts"]  # the suite's own text, not this machine's

    def strings(x):
        if isinstance(x, dict):
            return [s for v in x.values() for s in strings(v)]
        return [s for v in x for s in strings(v)] if isinstance(x, list) else [x] if isinstance(x, str) else []
    assert [s for s in strings(written) + md.splitlines() if re.search(r"(^|[\s'\"=(])/\w", s)] == []

    assert [(m.name, m.path) for m in result.models] == [("t.gguf", "qwen/t.gguf"), ("d.gguf", "~/elsewhere/d.gguf")]
    config = result.engine_configs["separate"]
    assert (config["target"]["path"], config["draft"]["path"]) == ("qwen/t.gguf", "~/elsewhere/d.gguf")
    assert result.command == ["ssd-edge", "bench", "-m", "qwen/t.gguf", "-md", "~/elsewhere/d.gguf", "--quick",
                              "--modes", "ar,sd", "--settings", "separate", "--category", "code",
                              "--llama-tools", "tools", "--output=out", "--no-plot"]
    assert result.peer.binary == bench_peer.BINARY
    assert len(result.peer.errors) == 1 and "failed to load: -m qwen/t.gguf " in result.peer.errors[0]
    assert " -f prompt.txt " in result.peer.errors[0]  # the peer's prompt file, in a temporary folder
    older = json.loads(text)
    older["machine"]["hostname"] = "an-old-host"  # a file written before the hostname was dropped still reads
    assert BenchResult.model_validate(older).machine == result.machine


def test_progress_is_plain_lines_on_stderr_when_it_is_not_a_terminal(tmp_path, monkeypatch, pair):
    def two_units(self, tick, calibrating):
        calibrating("target step costs, 1 thread", 0.25)
        calibrating("done", 1.0)
        for what in ("separate: warm-up", "separate: ar · p1"):
            tick(what)
            tick("")
        self.records.extend(fake_runs()[:1])

    monkeypatch.setattr(bench.Bench, "run", two_units)
    code, out, err = ssd_edge(["bench", *pair, "--no-peer", "--no-plot", "--modes", "ar", "--settings", "separate",
                               "--category", "code", "-o", str(tmp_path / "out")])
    assert code == 0, err
    total = 1 + sum(p.category == "code" for p in bench_args.load_prompts())  # the warm-up, then ar on each code prompt
    lines = [ln for ln in err.splitlines() if ln.startswith("[")]
    assert re.fullmatch(r"\[25% 0:00:0\d\] calibrating: target step costs, 1 thread", lines[0]), lines
    assert re.fullmatch(rf"\[1/{total} 0:00:0\d\] separate: warm-up", lines[1]), lines
    assert re.fullmatch(rf"\[2/{total} 0:00:0\d\] separate: ar · p1", lines[2]), lines
    assert len(lines) == 3  # "done" (at 100%) is not announced; the tables go to stdout
    assert "| separate |" in out and "\x1b[" not in err  # no bar, no cursor movement in a log


def test_a_stand_in_runs_every_setting_again_on_its_own_target(tmp_path):
    target, draft, stand_in = (tmp_path / n for n in ("t.gguf", "d.gguf", "t.bf16.gguf"))
    args = bench_args.BenchArgs(no_peer=True, stand_in="bf16").checked()
    b = bench.Bench(args, target, draft, stand_in)
    assert [s.name for s in b.settings] == ["separate", "shared", "separate bf16", "shared bf16"]
    assert [b.target_of(s) for s in b.settings] == [target, target, stand_in, stand_in]
    assert [s.stand_in for s in b.settings] == [False, False, True, True]
    assert b.config(b.settings[3]).target.path == str(stand_in)
    with pytest.raises(ConfigError, match="--stand-in: choose one of"):
        bench_args.BenchArgs(stand_in="q9").checked()


# ---------------------------------------------------------------- --priced (ssd_edge/bench/priced, bench/pricing.py)

def test_a_priced_run_needs_no_model_files_and_is_labelled_priced(tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_EDGE_HOME", str(tmp_path / "home"))
    out = tmp_path / "out"
    code, stdout, err = ssd_edge(["bench", "--priced", "h200-1.5b@0.9", "--quick", "--modes", "ar,sd",
                                  "--category", "code", "-n", "6", "-o", str(out)])
    assert code == 0, err
    result = BenchResult.model_validate_json((out / "bench.json").read_text())
    label = Priced.parse("h200-1.5b@0.9").label
    assert label.startswith("priced: H200 table h200-1.5b, draft agreement 0.9, draft on a device of its own")
    assert result.machine.priced == label and result.machine.llama_system_info.startswith("not used")
    assert [s.name for s in result.settings] == ["priced"] and label in result.settings[0].regime
    assert result.settings[0].verify_ms[:2] == [1.70, 3.42]                      # the table's own curve
    assert [m.name for m in result.models] == ["h200-1.5b-target", "h200-1.5b-draft"]
    assert [(r.mode, r.tokens) for r in result.runs] == [("ar", 6), ("sd", 6)]
    assert result.runs[0].output_sha == result.runs[1].output_sha and result.runs[1].drafted > 0
    assert not result.peer.available and "priced pair" in result.peer.note
    assert stdout.startswith(f"**{label}**") and "not a GPU measurement" in stdout
    assert f"**{label}**" in (out / "bench.md").read_text()
    assert (out / "bench.png").exists()
    assert not (tmp_path / "home").exists()                                      # no profile read or written


def test_ssds_host_time_is_reported_by_what_its_worker_did_beside_the_verify(tmp_path, monkeypatch):
    """bench.json's host ms per position, split by what the SSD worker grew beside each verify (alone,
    one branch, a tree): every position counted once; bench.md's table of it lists ssd, not sd."""
    monkeypatch.setenv("SSD_EDGE_HOME", str(tmp_path / "home"))
    out = tmp_path / "out"
    code, _, err = ssd_edge(["bench", "--priced", "h200-1.5b", "--quick", "--modes", "sd,ssd", "--category", "code",
                             "-n", "24", "-k", "8", "--no-plot", "-o", str(out)])
    assert code == 0, err
    result = BenchResult.model_validate_json((out / "bench.json").read_text())
    runs = {r.mode: r for r in result.runs}
    sd, ssd = runs["sd"], runs["ssd"]
    assert list(sd.host_by_worker) == ["alone"] and set(ssd.host_by_worker) - {"alone"}
    for run in (sd, ssd):
        assert sum(n for _, n in run.host_by_worker.values()) == run.positions
    row = next(r for r in result.summary if r.mode == "ssd" and r.category == "all")
    assert all(v > 0 for v in row.host_ms_per_position_by_worker.values())
    md = (out / "bench.md").read_text()
    table = md[md.index("Host ms/pos by what the SSD worker did"):].split("\n\n")[1]
    assert "| priced | ssd |" in table and "| priced | sd |" not in table


def test_auto_on_a_priced_pair_plans_from_a_profile_measured_on_it_in_memory(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("SSD_EDGE_HOME", str(home))
    code, _, err = ssd_edge(["bench", "--priced", "h200-1.5b", "--quick", "--modes", "auto", "--category", "code",
                             "-n", "4", "--no-plot", "-o", str(tmp_path / "out")])
    assert code == 0, err
    result = BenchResult.model_validate_json((tmp_path / "out" / "bench.json").read_text())
    prof = result.profile
    assert prof["measured_now"] and prof["device"]["machine"] == "priced"
    assert prof["device"]["cpu"].startswith("priced: H200 table h200-1.5b")
    step = prof["costs"][0]["target_ms"][0]
    assert 1.70 * 0.9 <= step < 1.70 + 10, step  # the waits aim early by their lateness: about the price
    assert [r.mode for r in result.runs] == ["ar", "auto"] and result.runs[1].auto is not None
    assert any("held in memory" in n for n in result.notes)
    assert not home.exists()                                                      # the device's profiles untouched


@pytest.mark.parametrize("args, message", [
    (["--priced", "a100"], "no price table 'a100'"),
    (["--agreement", "0.9"], "give --priced TABLE with it"),
    (["--priced", "h200-1.5b", "-m", "x.gguf"], "drop -m"),
    (["--priced", "h200-1.5b@2"], "between 0 and 1"),
])
def test_priced_flags_are_checked_in_one_line(args, message):
    code, _, err = ssd_edge(["bench", *args])
    assert code == 2 and message in err, err
