#!/usr/bin/env bash
# Sets up (system packages, models), builds and runs the whole test suite. This is the README's
# test command and what CI runs (.ci/run). Needs ../shared beside the checkout (or KVB_SHARED_DIR):
# without it the script fails rather than skipping the tests that read it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
shared="${KVB_SHARED_DIR:-$root/../shared}"
if [ ! -d "$shared/models" ] || [ ! -d "$shared/data" ]; then
  echo "test.sh: error: $shared (the project's shared models and data) is missing; put shared/ beside the checkout or set KVB_SHARED_DIR" >&2
  exit 1
fi
bash scripts/setup.sh
bash scripts/fetch_models.sh
build="${KVB_BUILD_DIR:-build}"
jobs="$(nproc 2>/dev/null || echo 2)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVB_SHARED_DIR="$shared" >/dev/null
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs" "$@"
