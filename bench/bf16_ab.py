#!/usr/bin/env python3
"""A/B of the CPU engine's f32 reference against --dtype bf16 weights (issue 16 item 6).

Runs bench_engine alternately on the f32 benchmarks and their bm_bf16_* twins, PAIRS times
(A B A B ...), each run a fresh process, and prints per benchmark the median over the pairs of
each run's median tok/s, with the bf16/f32 ratio; the load average before every run goes to
stderr. Two rates per benchmark: tokens per second of the process's CPU time ([cpu], the work,
meaningful with OMP_NUM_THREADS=1 on a shared machine) and of wall-clock time ([wall]). Usage: bench/bf16_ab.py BUILD/bench/bench_engine [PAIRS] [THREADS (default 1)]
"""
import json
import os
import re
import statistics
import subprocess
import sys

F32 = r"^bm_(prefill/smollm2/512|decode_batch/smollm2/512/(1|4)/|f32_wide_.*)"
BF16 = r"^bm_(bf16_prefill/smollm2/512|bf16_decode_batch/smollm2/512/(1|4)/|bf16_wide_.*)"


def run(bench, filt, threads):
    load = os.getloadavg()[0]
    out = subprocess.run([bench, f"--benchmark_filter={filt}", "--benchmark_format=json"],
                         capture_output=True, text=True, check=True,
                         env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    res = {}
    for b in json.loads(out.stdout)["benchmarks"]:
        if b.get("run_type") == "aggregate":
            continue
        name = re.sub(r"bm_(bf16_|f32_)?", "", b["run_name"]).split("/iterations")[0]
        # tok/s is a rate over real time (UseRealTime) or over the main thread's CPU time.
        real = b["run_name"].endswith("real_time")
        tokens = b["tok/s"] * (b["real_time"] if real else b["cpu_time"])  # x time unit
        res.setdefault(name + " [cpu]", []).append(tokens / b["cpu_time"])
        res.setdefault(name + " [wall]", []).append(tokens / b["real_time"])
    return load, {k: statistics.median(v) for k, v in res.items()}


def main():
    bench = sys.argv[1]
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    a, b = {}, {}
    for i in range(pairs):
        for filt, acc, tag in ((F32, a, "f32"), (BF16, b, "bf16")):
            load, res = run(bench, filt, threads)
            print(f"pair {i} {tag}: load {load:.1f} " +
                  " ".join(f"{k}={v:.1f}" for k, v in sorted(res.items())), file=sys.stderr)
            for k, v in res.items():
                acc.setdefault(k, []).append(v)
    print("| benchmark | f32 tok/s | bf16 tok/s | bf16/f32 (median of pair ratios) |")
    print("|---|---:|---:|---:|")
    for k in sorted(a):
        if k not in b:
            continue
        ratios = [y / x for x, y in zip(a[k], b[k])]
        print(f"| {k} | {statistics.median(a[k]):.1f} | {statistics.median(b[k]):.1f} | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")


if __name__ == "__main__":
    main()
