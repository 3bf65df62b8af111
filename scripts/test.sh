#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite: the fast offline
# tests, the real small-model group (`real`) and the default-pair group
# (`default_pair`, pulls the 1.6 GB Qwen pair on first use). Extra arguments go
# to pytest, e.g. `scripts/test.sh -m "not real and not default_pair"` for the
# fast group alone.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec "$root/.venv/bin/python" -m pytest "$@"
