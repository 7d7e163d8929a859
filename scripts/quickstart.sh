#!/usr/bin/env bash
# The README's main job: sets up (system packages, models), builds kvbench and runs it.
# For now: greedy chat generation with SmolLM2-135M-Instruct on one prompt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
bash scripts/fetch_models.sh
build="${KVB_BUILD_DIR:-build}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" --target kvbench
"$build/kvbench" generate --model models/SmolLM2-135M-Instruct.Q4_1.gguf --chat \
  --prompt "${1:-What is the capital of France?}" --max-new-tokens 64 --timings
