"""scripts/setup.sh picks llama.cpp's backend from the machine: CUDA where an NVIDIA GPU and nvcc are,
Metal on Apple silicon, the CPU otherwise; SSD_EDGE_CMAKE_ARGS overrides. Tested without a GPU through
`setup.sh --print-flags` (the backend and the CMake flags, no install), with stand-in `nvidia-smi`,
`nvcc` and `uname` commands first on PATH."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[2] / "scripts" / "setup.sh"
AMX = "-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' -DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'"
SMI_GPU = "echo 'GPU 0: NVIDIA H200 (UUID: GPU-0)'"


def flags(tmp_path: Path, commands: dict[str, str], **env: str) -> tuple[str, str]:
    """(backend line, CMAKE_ARGS) that setup.sh would build with, given stand-in commands."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, body in commands.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    run_env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "SSD_EDGE_CUDA_HOME": str(tmp_path / "none"),
               **env}
    out = subprocess.run(["bash", str(SETUP), "--print-flags"], env=run_env, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    backend, args = out.stdout.rstrip("\n").splitlines()
    return backend.removeprefix("==> llama.cpp backend: "), args.removeprefix("CMAKE_ARGS=")


@pytest.fixture(autouse=True)
def x86(monkeypatch):
    if os.uname().machine != "x86_64":
        pytest.skip("the AMX flags are x86_64's")


def test_no_gpu_builds_for_the_cpu_with_the_same_flags_as_before(tmp_path):
    backend, args = flags(tmp_path, {})
    assert backend == "cpu (no GPU found)"
    assert args == f"-DGGML_RPC=ON {AMX} "  # the string the cached CPU wheel is keyed by


def test_an_nvidia_gpu_and_nvcc_build_cuda(tmp_path):
    backend, args = flags(tmp_path, {"nvidia-smi": SMI_GPU, "nvcc": "echo nvcc"})
    assert backend == f"cuda (an NVIDIA GPU and {tmp_path / 'bin' / 'nvcc'})"
    assert args == f"-DGGML_RPC=ON {AMX} -DGGML_CUDA=on "


def test_nvcc_is_found_in_the_cuda_home_too(tmp_path):
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (home / "bin" / "nvcc").chmod(0o755)
    backend, args = flags(tmp_path, {"nvidia-smi": SMI_GPU}, SSD_EDGE_CUDA_HOME=str(home))
    assert backend.startswith("cuda") and "-DGGML_CUDA=on" in args


def test_a_gpu_without_nvcc_builds_for_the_cpu_and_says_why(tmp_path):
    backend, args = flags(tmp_path, {"nvidia-smi": SMI_GPU})
    assert backend.startswith("cpu (an NVIDIA GPU, but no CUDA compiler") and "GGML_CUDA" not in args


def test_nvidia_smi_without_a_gpu_is_no_gpu(tmp_path):
    backend, args = flags(tmp_path, {"nvidia-smi": "echo 'No devices were found'; exit 6", "nvcc": "echo"})
    assert backend == "cpu (no GPU found)" and "GGML_CUDA" not in args


def test_apple_silicon_builds_metal_without_the_amx_flags(tmp_path):
    uname = 'case "$1" in -s) echo Darwin ;; -m) echo arm64 ;; *) echo Darwin ;; esac'
    backend, args = flags(tmp_path, {"uname": uname})
    assert backend == "metal (Apple silicon)"
    assert args == "-DGGML_RPC=ON -DGGML_METAL=on "


def test_ssd_edge_cmake_args_overrides_the_detected_backend(tmp_path):
    backend, args = flags(tmp_path, {"nvidia-smi": SMI_GPU, "nvcc": "echo"}, SSD_EDGE_CMAKE_ARGS="-DGGML_CUDA=off")
    assert backend == "as SSD_EDGE_CMAKE_ARGS says"
    assert args == f"-DGGML_RPC=ON {AMX} -DGGML_CUDA=off"
    _, args = flags(tmp_path / "no-gpu", {}, SSD_EDGE_CMAKE_ARGS="-DGGML_VULKAN=on", SSD_EDGE_NO_RPC="1")
    assert args == f"{AMX} -DGGML_VULKAN=on"  # other flags add to the detected (CPU) build
