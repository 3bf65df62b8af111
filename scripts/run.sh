#!/usr/bin/env bash
# Set up, fetch the default model pair (checksums verified) and run it (mode auto):
# the main job of ssd-edge, from a fresh clone. Arguments replace the prompt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
ssd="$root/.venv/bin/ssd-edge"
"$ssd" models pull
"$ssd" models derive-draft   # the draft requantized to Q4_0 (seconds; faster on AVX-512 CPUs)
prompt="${*:-Write a Python function that returns the n-th Fibonacci number, with a docstring.}"
exec "$ssd" generate --chat -n 200 "$prompt"
