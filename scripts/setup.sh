#!/usr/bin/env bash
# Set up ssd-edge in a virtual environment (default: ./.venv).
#
# llama-cpp-python is compiled from source. The default native build crashes
# with "Illegal instruction" on CPUs that advertise Intel AMX inside VMs that
# trap the tile instructions, so AMX is switched off by default; everything
# else stays native (AVX-512, VNNI, weight repacking).
#
# The GPU backend is chosen from the machine: CUDA where an NVIDIA GPU
# (nvidia-smi lists one) and CUDA's compiler (nvcc, on PATH or in
# /usr/local/cuda/bin) are present, Metal on Apple silicon, else the CPU alone.
# The line "==> llama.cpp backend: ..." says which and why.
#
#   bash scripts/setup.sh --print-flags   print the backend and the CMake flags it
#                                         would build with, and exit (no install)
#
# Environment:
#   SSD_EDGE_CMAKE_ARGS  extra CMake flags for llama.cpp, e.g. "-DGGML_CUDA=on"
#                        (NVIDIA) or "-DGGML_METAL=on" (macOS). Appended to the
#                        AMX-safe defaults; naming -DGGML_CUDA or -DGGML_METAL here
#                        replaces the detected backend (e.g. "-DGGML_CUDA=off").
#   SSD_EDGE_NO_AMX_FIX  set to 1 to drop the AMX-off flags (e.g. on macOS/ARM).
#   SSD_EDGE_NO_RPC      set to 1 to build without llama.cpp's RPC backend
#                        (-DGGML_RPC=ON is on by default: it lets --rpc put the
#                        target's layers on other machines, see docs/rpc.md).
#   SSD_EDGE_VENV        where to create the virtual environment (default .venv).
#   SSD_EDGE_EXTRAS      pip extras to install (default "test").
#   PYTHON               the interpreter to build the venv from (default python3).
#
# The built llama-cpp-python wheel is kept in a folder named after a hash of
# its CMake flags (under ~/.cache/ssd-edge/wheels), so a second install takes
# seconds and a wheel built with other flags is never silently reused.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SSD_EDGE_VENV:-$root/.venv}"
extras="${SSD_EDGE_EXTRAS:-test}"
python="${PYTHON:-python3}"
llama_version="0.3.36"

# The GPU backend this machine can build: "cuda", "metal" or "cpu", and why (one line on stdout).
detect_backend() {
  local user="${SSD_EDGE_CMAKE_ARGS:-}"
  if [[ "$user" == *-DGGML_CUDA* || "$user" == *-DGGML_METAL* ]]; then
    echo "as SSD_EDGE_CMAKE_ARGS says"
    return
  fi
  if [[ "$(uname -s)" == "Darwin" && "$(uname -m)" == "arm64" ]]; then
    echo "metal (Apple silicon)"
    return
  fi
  local nvcc
  nvcc="$(command -v nvcc || true)"
  local home="${SSD_EDGE_CUDA_HOME:-/usr/local/cuda}"
  [[ -z "$nvcc" && -x "$home/bin/nvcc" ]] && nvcc="$home/bin/nvcc"
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
    if [[ -n "$nvcc" ]]; then
      echo "cuda (an NVIDIA GPU and $nvcc)"
    else
      echo "cpu (an NVIDIA GPU, but no CUDA compiler: install the CUDA toolkit for nvcc, or set SSD_EDGE_CMAKE_ARGS)"
    fi
    return
  fi
  echo "cpu (no GPU found)"
}

backend="$(detect_backend)"
case "$backend" in
  cuda*) gpu_args="-DGGML_CUDA=on" ;;
  metal*) gpu_args="-DGGML_METAL=on" ;;
  *) gpu_args="" ;;
esac
if [[ "$backend" == cuda* && "$(command -v nvcc || true)" == "" ]]; then
  export PATH="${SSD_EDGE_CUDA_HOME:-/usr/local/cuda}/bin:$PATH"  # CMake finds CUDA through nvcc
fi

amx_off="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
# (the CPU build's flags are the same string as before backends were detected: its cached wheel is reused)
if [[ "${SSD_EDGE_NO_AMX_FIX:-0}" == "1" || "$(uname -m)" != "x86_64" ]]; then
  cmake_args="${gpu_args:+$gpu_args }${SSD_EDGE_CMAKE_ARGS:-}"
else
  cmake_args="-DCMAKE_C_FLAGS='$amx_off' -DCMAKE_CXX_FLAGS='$amx_off' ${gpu_args:+$gpu_args }${SSD_EDGE_CMAKE_ARGS:-}"
fi
if [[ "${SSD_EDGE_NO_RPC:-0}" != "1" ]]; then
  cmake_args="-DGGML_RPC=ON $cmake_args"
fi
echo "==> llama.cpp backend: $backend"
if [[ "${1:-}" == "--print-flags" ]]; then
  echo "CMAKE_ARGS=$cmake_args"
  exit 0
fi
flags_hash="$(printf '%s|%s|%s' "$llama_version" "$cmake_args" "$("$python" -c 'import sys; print(sys.version_info[:2])')" | sha256sum | cut -c1-16)"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/ssd-edge"
wheel_dir="$cache_root/wheels/llama-cpp-python-$llama_version-$flags_hash"

if [[ ! -x "$venv/bin/python" ]]; then
  echo "==> creating virtual environment $venv"
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip

if ! ls "$wheel_dir"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "==> building llama-cpp-python $llama_version (takes ~8 minutes on 2 cores)"
  echo "    CMAKE_ARGS=$cmake_args"
  mkdir -p "$wheel_dir.tmp"
  CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$venv/bin/python" -m pip wheel --no-deps --no-cache-dir --no-binary llama-cpp-python \
    -w "$wheel_dir.tmp" "llama-cpp-python==$llama_version"
  rm -rf "$wheel_dir" && mv "$wheel_dir.tmp" "$wheel_dir"
else
  echo "==> reusing llama-cpp-python wheel from $wheel_dir"
fi

# pip keeps an installed llama-cpp-python of the same version whatever flags built it: a venv
# made with other flags (before -DGGML_RPC=ON, say) gets this wheel put in its place.
if [[ -f "$venv/.ssd-edge-cmake-args" && "$(cat "$venv/.ssd-edge-cmake-args")" != "$cmake_args" ]]; then
  echo "==> the venv's llama-cpp-python was built with other flags: reinstalling it"
  "$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel_dir"/llama_cpp_python-*.whl
fi
echo "==> installing ssd-edge[$extras]"
"$venv/bin/python" -m pip install -q --find-links "$wheel_dir" "llama-cpp-python==$llama_version" \
  -e "$root[$extras]"
echo "$cmake_args" > "$venv/.ssd-edge-cmake-args"
echo "==> done: $venv"
