#!/usr/bin/env bash
# The GPU checks of a lent `device` machine, as one prepared command per stage (each fits one
# 10-minute call; run from the repository root there, after scripts/device_build.sh). Logs go
# to $OUT (the device tool's return folder) or ./device-out.
#   bash scripts/device_check.sh tests     # ctest -L cuda: every twin's parity (policy ops and
#                                          # tensor-core prefill included), then the engine tests
#   bash scripts/device_check.sh kernels   # bench_cuda_kernels (decode/prefill attention, H2O)
#   bash scripts/device_check.sh engine    # bench_cuda_engine: Llama-3-8B shape, bf16, 4K and
#                                          # 32K, every policy at budget 1024 (issue 13's table)
# A whole lease in two calls (timed on an H200, 2026-11-26, third lease: first 306 s (build,
# tests 57 s, kernels; since then up to 70 s more: the CUDA graphs' A/B), second 400 s (tests
# 78 s, engine 240 s, A/B ~80 s); the second within the 30 s the machine stays warm, with a
# timeout_s of 600):
#   bash scripts/device_check.sh first     # build, ctest -L cuda without SmolLM2, the kernel
#                                          # bench, graphs off/on in the engine (call 1 carries
#                                          # .device/debs .device/shared .device/minja
#                                          # .device/model.part-aa .device/model.sha256)
#   bash scripts/device_check.sh second    # joins SmolLM2 (call 2 carries .device/model.part-ab),
#                                          # its GPU tests (cut at 150 s), the engine bench: every
#                                          # policy at 4K (cut at 180 s), five at 32K (80 s),
#                                          # then the decode kernels' A/B in the engine (100 s:
#                                          # streamed against tensor cores), then a batch of
#                                          # 8 sequences (60 s)
# Usage: bash scripts/device_check.sh tests|kernels|engine [extra args for the bench]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
stage="${1:-}"
shift || true
out="${OUT:-$root/device-out}"
mkdir -p "$out"
build=build-gpu
case "$stage" in
  first | second)
    bash scripts/device_build.sh >"$out/build_$stage.log" 2>&1 || {
      tail -n 40 "$out/build_$stage.log"
      exit 1
    }
    ;;
esac
[ -f /tmp/kvb-prefix/env.sh ] && . /tmp/kvb-prefix/env.sh
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
  first)
    t0=$(date +%s)
    timeout 300 ctest --test-dir "$build" -L cuda -E 'Smol|DecodeBatch' --timeout 150 -j 8 \
      --output-on-failure >"$out/ctest_first.log" 2>&1 || true
    echo "ctest: $(($(date +%s) - t0)) s"
    grep -E "tests passed|\((Failed|Timeout)\)" "$out/ctest_first.log" || tail -n 20 "$out/ctest_first.log"
    # The bookworm Google Benchmark takes --benchmark_min_time as a plain number of seconds.
    timeout 240 "$build/bench/bench_cuda_kernels" --benchmark_min_time=0.2 "$@" \
      >"$out/bench_cuda_kernels.txt" 2>"$out/bench_cuda_kernels.err" || echo "kernels: rc $?"
    grep -E "_median|GB|TFLOP" "$out/bench_cuda_kernels.err" | head -n 3 || true
    grep -c "correct=1" "$out/bench_cuda_kernels.txt" | sed 's/^/rows with correct=1: /'  || true
    # The decode kernels again with the memory pool keeping its memory across the timing's syncs
    # (the engine syncs once a step; the bench once a call, where ~41 us of cudaMallocAsync
    # re-mapping showed in every 4K row of the second lease).
    timeout 60 "$build/bench/bench_cuda_kernels" --benchmark_min_time=0.2 --pool-keep-mib=256 \
      '--benchmark_filter=bm_decode_attention(_stream|_mma)?/ctx:(4096|32768)/bf16:1/probs:0/ragged:0' \
      >"$out/bench_cuda_kernels_pool.txt" 2>&1 || echo "kernels (pool kept): rc $?"
    # Decode steps as CUDA graphs against launched one by one (issue 16 item 5), interleaved in
    # one process (off on off on off on): a short and a 4K context, where launches weigh most;
    # `wait ms` near `step ms` says the step was device-bound already. The graphs' law (same
    # bits) is CudaGraphsStories above and CudaGraphsSmol in `second`.
    timeout 70 stdbuf -oL "$build/bench/bench_cuda_engine" --models llama8b \
      --contexts 512,4096 --budgets 1024 --steps 32 --policies full,h2o,window \
      --graphs off,on --repeat 3 >"$out/bench_engine_graphs.txt" 2>&1 || true
    cat "$out/bench_engine_graphs.txt"
    awk -f scripts/bench_medians.awk "$out/bench_engine_graphs.txt" | tee "$out/bench_engine_graphs_medians.txt" || true
    ;;
  second)
    t0=$(date +%s)
    timeout 150 ctest --test-dir "$build" -L cuda -R 'Smol|DecodeBatch' --timeout 140 -j 8 \
      --output-on-failure >"$out/ctest_second.log" 2>&1 || true
    echo "ctest: $(($(date +%s) - t0)) s"
    grep -E "tests passed|\((Failed|Timeout|Skipped)\)" "$out/ctest_second.log" || tail -n 20 "$out/ctest_second.log"
    # Line-buffered, so that rows printed before the cut come back. Every policy at 4K (SubGen
    # last: its first compression bisects radii on the host), then the 32K rows that matter.
    timeout 180 stdbuf -oL "$build/bench/bench_cuda_engine" --models llama8b \
      --contexts 4096 --budgets 1024 --steps 32 \
      --policies full,window,h2o,tova,random,scissorhands,knorm,streaming_llm,snapkv,pyramidkv,ada_snapkv,ada_pyramidkv,subgen_kcenter,subgen \
      "$@" >"$out/bench_cuda_engine.txt" 2>&1 || true
    timeout 80 stdbuf -oL "$build/bench/bench_cuda_engine" --models llama8b \
      --contexts 32768 --budgets 1024 --steps 32 --policies full,window,h2o,tova,snapkv \
      "$@" >>"$out/bench_cuda_engine.txt" 2>&1 || true
    cat "$out/bench_cuda_engine.txt"
    # The decode attention kernels in the engine, interleaved in one process (A B A B A B): the
    # default (streamed) against the tensor-core kernel, on policies that ask no decode
    # statistics (with statistics the tensor-core choice runs the default kernel).
    timeout 90 stdbuf -oL "$build/bench/bench_cuda_engine" --models llama8b \
      --contexts 4096,32768 --budgets 1024 --steps 32 --policies full,snapkv \
      --decode-kernels streamed,tensor --repeat 3 >"$out/bench_engine_decode_ab.txt" 2>&1 || true
    cat "$out/bench_engine_decode_ab.txt"
    awk -f scripts/bench_medians.awk "$out/bench_engine_decode_ab.txt" || true  # medians per kernel
    # A bundle's decode: 8 sequences stepping together (decode t/s is the batch's; attn/layer:
    # attention launches per layer, cuda::attention_batch), against the rows above (batch 1).
    timeout 50 stdbuf -oL "$build/bench/bench_cuda_engine" --models llama8b \
      --contexts 4096 --budgets 1024 --steps 16 --policies full,h2o --batch 8 \
      >"$out/bench_engine_batch.txt" 2>&1 || true
    cat "$out/bench_engine_batch.txt"
    ;;
  *)
    echo "usage: bash scripts/device_check.sh tests|kernels|engine|first|second [bench args]" >&2
    exit 2
    ;;
esac
