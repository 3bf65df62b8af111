#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite, layer by layer:
#   unit, engine, faces   fast, offline, no model (a plain `pytest` runs these alone)
#   real                  the small real pair (SmolLM2-135M and a truncated draft of it)
#   default_pair          the default Qwen pair (pulls 1.6 GB on first use)
# The closing summary prints the slowest tests and the time of each layer.
#
#   scripts/test.sh             every layer (CI runs this: .ci/run)
#   scripts/test.sh --full      the release check: the long lossless protocol
#                               (every prompt, every mode, 128 tokens) on both pairs
#   scripts/test.sh ARGS...     other arguments go to pytest, e.g. tests/unit -x
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"

layers=(--real --default-pair)
args=()
for arg in "$@"; do
  if [[ "$arg" == "--full" ]]; then
    layers+=(--full)
  else
    args+=("$arg")
  fi
done

start=$(date +%s)
status=0
"$root/.venv/bin/python" -m pytest "${layers[@]}" --no-silent-skip --durations=15 "${args[@]}" || status=$?
echo "scripts/test.sh: tests took $(( $(date +%s) - start )) s (setup.sh not counted), exit status $status"
exit "$status"
