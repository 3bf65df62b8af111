#!/usr/bin/env bash
# Build llama.cpp's own command-line tools (the peer column of `ssd-edge bench`)
# from the very llama.cpp sources that the pinned llama-cpp-python source
# distribution carries, so the peer runs the same kernels as ssd-edge.
#
#   scripts/build_llama_tools.sh                    # -> ~/.cache/ssd-edge/llama-tools/bin
#   scripts/build_llama_tools.sh --rpc-server-only  # -> ~/.cache/ssd-edge/rpc-server/VERSION-HASH/ggml-rpc-server
#
# Built targets: llama-speculative-simple (draft-model speculation), llama-lookup
# (n-gram lookup decoding),
# llama-simple (plain decoding), llama-bench, llama-server (constrained decoding,
# the peer of `ssd-edge bench --prompts structured`; built without its web UI,
# nothing downloaded) and ggml-rpc-server (llama.cpp's
# rpc-server, the other side of `--rpc`; `ssd-edge rpc-server` launches it).
# Same AMX-safe flags as scripts/setup.sh (see FIELD_NOTES: AMX tile
# instructions trap in the VM), plus -DGGML_RPC=ON. The build runs under
# `nice -n 15`: the cores are usually shared.
#
# --rpc-server-only builds ggml-rpc-server alone (ggml, its CPU backend and
# the RPC backend: a few minutes) into a folder named after the version and a
# hash of the flags, reuses it when it is already there, and prints the
# binary's path as its last line (the real tests call it this way).
#
# Environment:
#   SSD_EDGE_LLAMA_TOOLS  output folder (default ~/.cache/ssd-edge/llama-tools)
#   SSD_EDGE_CMAKE_ARGS   extra CMake flags, appended
#   SSD_EDGE_NO_AMX_FIX   set to 1 to drop the AMX-off flags
#   JOBS                  parallel compile jobs (default: number of cores)
#   PYTHON                interpreter whose pip downloads the sdist (default .venv/bin/python)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
llama_version="0.3.36"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/ssd-edge"
out="${SSD_EDGE_LLAMA_TOOLS:-$cache_root/llama-tools}"
python="${PYTHON:-$root/.venv/bin/python}"
[[ -x "$python" ]] || python=python3
jobs="${JOBS:-$(nproc)}"
targets=(llama-speculative-simple llama-lookup llama-simple llama-bench llama-server ggml-rpc-server)
rpc_only=0
for arg in "$@"; do
  case "$arg" in
    --rpc-server-only) rpc_only=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d'; exit 0 ;;
    *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
  esac
done

amx_off="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if [[ "${SSD_EDGE_NO_AMX_FIX:-0}" == "1" || "$(uname -m)" != "x86_64" ]]; then
  cflags=""
else
  cflags="$amx_off"
fi

if [[ "$rpc_only" == "1" ]]; then
  flags_hash="$(printf '%s|%s|%s' "$llama_version" "$cflags" "${SSD_EDGE_CMAKE_ARGS:-}" | sha256sum | cut -c1-16)"
  rpc_out="$cache_root/rpc-server/$llama_version-$flags_hash"
  if [[ -x "$rpc_out/ggml-rpc-server" ]]; then
    echo "==> reusing $rpc_out/ggml-rpc-server" >&2
    echo "$rpc_out/ggml-rpc-server"
    exit 0
  fi
  targets=(ggml-rpc-server)
fi

src_root="$out/src"
mkdir -p "$src_root"
sdist="$(ls "$src_root"/llama_cpp_python-"$llama_version".tar.gz 2>/dev/null || true)"
if [[ -z "$sdist" ]]; then
  echo "==> downloading the llama-cpp-python $llama_version source distribution"
  "$python" -m pip download -q --no-deps --no-binary llama-cpp-python -d "$src_root" \
    "llama-cpp-python==$llama_version"
  sdist="$(ls "$src_root"/llama_cpp_python-"$llama_version".tar.gz)"
fi
src="$src_root/llama_cpp_python-$llama_version"
if [[ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]]; then
  echo "==> unpacking $(basename "$sdist")"
  tar -xzf "$sdist" -C "$src_root"
fi
llama="$src/vendor/llama.cpp"

build="$out/build"
[[ "$rpc_only" == "1" ]] && build="$rpc_out.build"
echo "==> configuring llama.cpp (C/CXX flags: ${cflags:-none}; -DGGML_RPC=ON)"
nice -n 15 cmake -S "$llama" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="$cflags" -DCMAKE_CXX_FLAGS="$cflags" -DGGML_RPC=ON \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  ${SSD_EDGE_CMAKE_ARGS:-} >/dev/null

echo "==> building ${targets[*]} with $jobs jobs (several minutes on 2 cores)"
nice -n 15 cmake --build "$build" --target "${targets[@]}" -j "$jobs"

if [[ "$rpc_only" == "1" ]]; then
  mkdir -p "$rpc_out.tmp"
  cp -f "$build/bin/ggml-rpc-server" "$rpc_out.tmp/ggml-rpc-server"
  printf 'llama-cpp-python %s\nflags %s %s\n' "$llama_version" "${cflags:-none}" "${SSD_EDGE_CMAKE_ARGS:-}" \
    > "$rpc_out.tmp/BUILD_INFO"
  rm -rf "$rpc_out" && mv "$rpc_out.tmp" "$rpc_out" && rm -rf "$build"
  echo "==> done" >&2
  echo "$rpc_out/ggml-rpc-server"
  exit 0
fi

mkdir -p "$out/bin"
for t in "${targets[@]}"; do
  cp -f "$build/bin/$t" "$out/bin/$t"
done
printf 'llama-cpp-python %s\nflags %s\n' "$llama_version" "${cflags:-none}" > "$out/bin/BUILD_INFO"
echo "==> done: $out/bin"
ls -1 "$out/bin"
