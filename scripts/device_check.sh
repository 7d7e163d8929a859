#!/usr/bin/env bash
# The GPU checks of a lent `device` machine, as one prepared command per stage (each fits one
# 10-minute call; run from the repository root there, after scripts/device_build.sh). Logs go
# to $OUT (the device tool's return folder) or ./device-out.
#   bash scripts/device_check.sh tests     # ctest -L cuda: every twin's parity (policy ops and
#                                          # tensor-core prefill included), then the engine tests
#   bash scripts/device_check.sh kernels   # bench_cuda_kernels (decode/prefill attention, H2O)
#   bash scripts/device_check.sh engine    # bench_cuda_engine: Llama-3-8B shape, bf16, 4K and
#                                          # 32K, every policy at budget 1024 (issue 13's table)
# Usage: bash scripts/device_check.sh tests|kernels|engine [extra args for the bench]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
stage="${1:-}"
shift || true
out="${OUT:-$root/device-out}"
mkdir -p "$out"
[ -f /tmp/kvb-prefix/env.sh ] && . /tmp/kvb-prefix/env.sh
build=build-gpu
[ -d "$build" ] || { echo "device_check.sh: no $build (run scripts/device_build.sh first)" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >"$out/gpu.csv" 2>&1 || true
case "$stage" in
  tests)
    ctest --test-dir "$build" -L cuda --output-on-failure --timeout 300 -j 4 \
      >"$out/ctest_cuda.log" 2>&1 || { tail -n 80 "$out/ctest_cuda.log"; exit 1; }
    tail -n 5 "$out/ctest_cuda.log"
    ;;
  kernels)
    "$build/bench/bench_cuda_kernels" "$@" >"$out/bench_cuda_kernels.txt" 2>"$out/bench_cuda_kernels.err"
    cat "$out/bench_cuda_kernels.txt"
    ;;
  engine)
    "$build/bench/bench_cuda_engine" --models llama8b --contexts 4096,32768 --budgets 1024 \
      --policies all --steps 32 "$@" | tee "$out/bench_cuda_engine.txt"
    ;;
  *)
    echo "usage: bash scripts/device_check.sh tests|kernels|engine [bench args]" >&2
    exit 2
    ;;
esac
