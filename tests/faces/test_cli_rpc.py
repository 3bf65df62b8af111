"""--rpc and `ssd-edge rpc-server` without the compiled library: the option's layers (flag > env >
config file), its validation with the flag named, an unreachable server at start (one line,
exit 7, before llama.cpp is loaded), the bench's flag, and the launcher's exec'd command line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ssd_edge.bench import machine as bench_machine, run as bench
from ssd_edge.settings import engine_config, resolve
from ssd_edge.errors import ConfigError, RPCError
from test_cli import clean_env, one_error, run  # noqa: F401 (clean_env: test_cli's autouse fixture, here too)

REPO = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rpc_layers_flag_env_file(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('rpc = "10.0.0.3:50052"\n')
    assert engine_config(resolve({"model": "t.gguf", "config": str(cfg)}, {})).target.rpc == ["10.0.0.3:50052"]
    env = {"SSD_EDGE_RPC": "10.0.0.2:50052,10.0.0.9:7000"}
    s = resolve({"model": "t.gguf", "config": str(cfg)}, env)
    assert s.sources["rpc"] == "SSD_EDGE_RPC"
    assert engine_config(s).target.rpc == ["10.0.0.2:50052", "10.0.0.9:7000"]
    s = resolve({"model": "t.gguf", "rpc": "127.0.0.1:50052", "config": str(cfg)}, env)
    assert s.sources["rpc"] == "--rpc" and engine_config(s).target.rpc == ["127.0.0.1:50052"]


def test_rpc_offloads_all_target_layers_unless_ngl_says_otherwise():
    ec = engine_config(resolve({"model": "t.gguf", "model_draft": "d.gguf", "rpc": "127.0.0.1:50052"}, {}))
    assert ec.target.n_gpu_layers == -1 and ec.draft.n_gpu_layers == 0 and ec.draft.rpc == []
    ec = engine_config(resolve({"model": "t.gguf", "rpc": "127.0.0.1:50052", "n_gpu_layers": 20}, {}))
    assert ec.target.n_gpu_layers == 20
    ec = engine_config(resolve({"model": "t.gguf"}, {}))
    assert ec.target.n_gpu_layers == 0 and ec.target.rpc == []


def test_a_build_with_a_local_gpu_offloads_the_whole_target_by_default(monkeypatch):
    import ssd_edge.llama.library as library

    monkeypatch.setattr(library, "gpu_offload_supported", lambda: True)  # a CUDA or Metal build with a GPU
    ec = engine_config(resolve({"model": "t.gguf", "model_draft": "d.gguf"}, {}))
    assert ec.target.n_gpu_layers == -1 and ec.draft.n_gpu_layers == 0  # the draft: -ngld, or the CPU
    assert engine_config(resolve({"model": "t.gguf", "n_gpu_layers": 0}, {})).target.n_gpu_layers == 0
    monkeypatch.setattr(library, "gpu_offload_supported", lambda: False)
    assert engine_config(resolve({"model": "t.gguf"}, {})).target.n_gpu_layers == 0


def test_rpc_invalid_names_where_it_came_from():
    with pytest.raises(ConfigError, match=r"invalid --rpc endpoint 'box'.*\(from SSD_EDGE_RPC\)"):
        engine_config(resolve({"model": "t.gguf"}, {"SSD_EDGE_RPC": "box"}))
    code, _, err = run(["generate", "-m", "t.gguf", "--rpc", "box:http", "hi"])
    assert code == 2 and "the port must be a number" in one_error(err)


def test_unreachable_server_at_start_is_one_line_exit_7(tmp_path):
    gguf = tmp_path / "t.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))  # passes the magic check; the probe fails before llama.cpp loads
    port = _closed_port()
    code, out, err = run(["generate", "-m", str(gguf), "--no-draft", "--no-calibrate", "--rpc",
                          f"127.0.0.1:{port}", "hi"])
    assert code == RPCError.exit_code == 7 and out == ""
    assert one_error(err).startswith(f"error: rpc server 127.0.0.1:{port} is unreachable")


def test_bench_takes_rpc(tmp_path, monkeypatch):
    """`ssd-edge bench --rpc` reaches the bench's engine configs: the target on the server with every
    layer, the draft here; and no calibration (a profile prices a target on this device)."""
    from ssd_edge.cli import commands as cli, measuring
    from ssd_edge.llama import backend

    seen = []
    monkeypatch.setattr(measuring, "run_bench", lambda args: seen.append(args) or 0)
    monkeypatch.setattr(backend, "system_info", lambda: "fake llama.cpp")
    t = tmp_path / "t.gguf"
    t.write_bytes(b"GGUF" + bytes(12))
    assert cli.run(["bench", "-m", str(t), "-md", str(t), "--rpc", "127.0.0.1:50052", "--modes", "ar"]) == 0
    args = seen[0].checked()
    assert args.rpc == "127.0.0.1:50052" and args.no_calibrate
    b = bench.Bench.__new__(bench.Bench)
    b.args, b.target, b.draft = args, tmp_path / "t.gguf", tmp_path / "d.gguf"
    setting = bench_machine.hardware_settings(2)["separate"]
    cfg = b.config(setting)
    assert cfg.target.rpc == ["127.0.0.1:50052"] and cfg.target.n_gpu_layers == -1 and cfg.draft.rpc == []
    assert cfg.draft.n_gpu_layers == 0


def _launch(*args: str) -> subprocess.CompletedProcess:
    """`ssd-edge rpc-server ARGS` in a child process (it exec()s), with /bin/echo standing in for the
    binary so the command line it hands over comes back on stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSD_EDGE_")}
    return subprocess.run([sys.executable, "-m", "ssd_edge.cli.commands", "rpc-server", "--binary", "/bin/echo", *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO, env=env)


@pytest.mark.skipif(not os.access("/bin/echo", os.X_OK), reason="needs /bin/echo")
def test_launcher_binds_loopback_by_default_and_warns_otherwise():
    p = _launch()
    assert p.returncode == 0 and p.stdout.split() == ["--host", "127.0.0.1", "--port", "50052"]
    assert "warning" not in p.stderr
    p = _launch("--host", "0.0.0.0", "-p", "6000", "-t", "1", "--cache")
    assert p.returncode == 0
    assert p.stdout.split() == ["--host", "0.0.0.0", "--port", "6000", "--threads", "1", "--cache"]
    assert "warning:" in p.stderr and "no authentication and no encryption" in p.stderr


def test_launcher_without_a_binary_says_how_to_build_it(tmp_path):
    code, _, err = run(["rpc-server", "--binary", str(tmp_path / "absent")])
    assert code == 1 and "scripts/build_llama_tools.sh --rpc-server-only" in one_error(err)
    code, _, err = run(["rpc-server", "--binary", "/bin/echo", "--port", "0"])
    assert code == 2 and "--port 0" in one_error(err)
