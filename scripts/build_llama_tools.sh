#!/usr/bin/env bash
# Build llama.cpp's own command-line tools (the peer column of `ssd-edge bench`)
# from the very llama.cpp sources that the pinned llama-cpp-python source
# distribution carries, so the peer runs the same kernels as ssd-edge.
#
#   scripts/build_llama_tools.sh            # -> ~/.cache/ssd-edge/llama-tools/bin
#
# Built targets: llama-speculative-simple (draft-model speculation),
# llama-simple (plain decoding) and llama-bench. Same AMX-safe flags as
# scripts/setup.sh (see FIELD_NOTES: AMX tile instructions trap in the VM).
# The build runs under `nice -n 15`: the cores are usually shared.
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
targets=(llama-speculative-simple llama-simple llama-bench)

amx_off="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if [[ "${SSD_EDGE_NO_AMX_FIX:-0}" == "1" || "$(uname -m)" != "x86_64" ]]; then
  cflags=""
else
  cflags="$amx_off"
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
echo "==> configuring llama.cpp (C/CXX flags: ${cflags:-none})"
nice -n 15 cmake -S "$llama" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="$cflags" -DCMAKE_CXX_FLAGS="$cflags" \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
  ${SSD_EDGE_CMAKE_ARGS:-} >/dev/null

echo "==> building ${targets[*]} with $jobs jobs (several minutes on 2 cores)"
nice -n 15 cmake --build "$build" --target "${targets[@]}" -j "$jobs"

mkdir -p "$out/bin"
for t in "${targets[@]}"; do
  cp -f "$build/bin/$t" "$out/bin/$t"
done
printf 'llama-cpp-python %s\nflags %s\n' "$llama_version" "${cflags:-none}" > "$out/bin/BUILD_INFO"
echo "==> done: $out/bin"
ls -1 "$out/bin"
