#!/usr/bin/env python3
"""Decode attention with per-slot probabilities: kvbench's kernel vs PyTorch's eager attention
with output_attentions, on the same shapes, in the same run (issue 7's PyTorch comparison).

H2O-style Python implementations need the attention weights of every decode step, so they run
Hugging Face transformers' eager attention with output_attentions=True. Its math (LlamaAttention
eager path, transformers 4.46.3): repeat_kv on K and V (copies each KV head for its query
heads), Q K^T / sqrt(d), softmax in f32 cast back to the input dtype, times V, with the weights
returned. This script times exactly that (transformers' own repeat_kv), and for context torch's
scaled_dot_product_attention (fused, no weights, GQA without copies), against kvbench's decode attention with the
probabilities (and without) at one layer of Llama-3-8B's shape: 32 query heads, 8 KV heads,
head_dim 128, one query, every KV head holding `ctx` tokens.

  cpu:  kvbench side = build/bench/bench_attention (kernels/cpu, f32), torch f32 on the CPU,
        both with the same thread count.
  cuda: kvbench side = bench_cuda_kernels' bm_decode_attention (kernels/cuda, bf16 K/V,
        ragged:0), torch bf16 on the GPU, timed with CUDA events.

Before timing, torch's eager output is checked against its SDPA output. kvbench's rows check
themselves against a double-precision loop (counter `correct`; a wrong row is an error here).

  .venv-ref/bin/python bench/torch_eager_attention.py --device cpu --threads 2
  python3 bench/torch_eager_attention.py --device cuda --bench build-gpu/bench/bench_cuda_kernels

Versions are printed. Measured on the CPU (2026-11-22, 2-core AMD EPYC VM, 2 threads each, torch
2.5.1, transformers 4.46.3, f32), ms per decode step of one layer:

  | ctx   | kvbench +probs | kvbench | eager +weights | SDPA (gqa) | eager / kvbench+probs |
  | 1024  |   1.13         |   1.10  |    3.55        |   17.3     |  3.1                  |
  | 4096  |   4.86         |   4.59  |   56.5         |   83.6     | 11.6                  |
  | 16384 |  20.3          |  23.2   |  244           |  371       | 12.0                  |
  | 32768 |  38.9          |  40.8   |  502           |  763       | 12.9                  |

kvbench reads 256 MiB of f32 K/V at 32K (6.9 GB/s); eager's repeat_kv writes 4 copies of it
first. On the CPU torch's SDPA with enable_gqa is slower still (its math fallback). The GPU
figures (the issue's ask) have not been measured: no GPU was available.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

try:
    import torch
    import transformers
    from transformers.models.llama.modeling_llama import repeat_kv
except ImportError as e:  # pragma: no cover - environment problem, said plainly
    sys.exit(f"torch_eager_attention.py: error: {e}; run it with .venv-ref/bin/python "
             "(scripts/ref_env.sh creates it)")

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def eager_with_weights(q, k, v):
    """The eager path of LlamaAttention.forward (transformers 4.46.3), weights returned."""
    groups = q.shape[1] // k.shape[1]
    k = repeat_kv(k, groups)
    v = repeat_kv(v, groups)
    w = torch.matmul(q, k.transpose(2, 3)) / (q.shape[-1] ** 0.5)
    w = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, v), w


def sdpa(q, k, v):
    """torch's fused attention (no weights), reading the KV heads in place (enable_gqa, torch
    >= 2.5) rather than repeat_kv copies: the fastest torch path, for context."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def time_ms(fn, device, reps):
    """Median milliseconds of `reps` calls after 2 warm-ups."""
    for _ in range(2):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def kvbench_times(bench, device, contexts, threads):
    """{(ctx, probs): ms} from the kvbench benchmark binary (Google Benchmark JSON)."""
    if not os.access(bench, os.X_OK):
        sys.exit(f"torch_eager_attention.py: error: {bench} is not an executable benchmark; build "
                 "it (cmake --build build --target bench_attention, or bench_cuda_kernels in a "
                 "CUDA build) or pass --bench PATH")
    ctx_re = "|".join(str(c) for c in contexts)
    if device == "cpu":
        filt = f"bm_decode_attention/ctx:({ctx_re})/"
    else:
        filt = f"bm_decode_attention/ctx:({ctx_re})/bf16:1/probs:[01]/ragged:0"
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    r = subprocess.run([bench, f"--benchmark_filter={filt}", "--benchmark_format=json"],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"torch_eager_attention.py: error: {bench} exited {r.returncode}:\n{r.stderr}")
    try:
        data = json.loads(r.stdout)
    except json.JSONDecodeError:
        sys.exit(f"torch_eager_attention.py: error: {bench} printed no JSON:\n{r.stdout[:2000]}")
    out = {}
    for b in data.get("benchmarks", []):
        if b.get("error_occurred"):
            sys.exit(f"torch_eager_attention.py: error: {b['name']}: {b.get('error_message')}")
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        parts = dict(p.split(":") for p in b["name"].split("/")[1:] if ":" in p)
        if "ctx" not in parts:
            continue
        unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
        out[(int(parts["ctx"]), int(parts["probs"]))] = b["real_time"] * unit
    missing = [(c, p) for c in contexts for p in (0, 1) if (c, p) not in out]
    if missing:
        sys.exit(f"torch_eager_attention.py: error: {bench} gave no rows for {missing}")
    return out, data.get("context", {})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--bench", help="kvbench benchmark binary (default: build/bench/bench_attention "
                                    "on cpu, build-gpu/bench/bench_cuda_kernels on cuda)")
    ap.add_argument("--contexts", default="1024,4096,16384,32768",
                    help="comma-separated KV lengths per head")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads for both sides (0: each side's default)")
    ap.add_argument("--reps", type=int, default=10, help="timed calls per torch row (median)")
    a = ap.parse_args()
    try:
        contexts = [int(x) for x in a.contexts.split(",")]
    except ValueError:
        sys.exit(f"torch_eager_attention.py: error: --contexts {a.contexts!r}: expected integers "
                 "like 1024,4096")
    if not contexts or min(contexts) < 1:
        sys.exit("torch_eager_attention.py: error: --contexts must list positive lengths")
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_eager_attention.py: error: --device cuda but torch sees no GPU")
    bench = a.bench or ("build/bench/bench_attention" if a.device == "cpu"
                        else "build-gpu/bench/bench_cuda_kernels")
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = torch.float32 if a.device == "cpu" else torch.bfloat16
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device "
          f"{a.device} ({torch.cuda.get_device_name() if a.device == 'cuda' else 'cpu'}), "
          f"dtype {dtype}, torch threads {torch.get_num_threads()}")
    ours, ctx_info = kvbench_times(bench, a.device, contexts, a.threads)
    print(f"kvbench: {bench} ({ctx_info.get('num_cpus', '?')} CPUs, "
          f"OMP_NUM_THREADS={a.threads or 'default'})")
    g = torch.Generator().manual_seed(0)
    rows = []
    for ctx in contexts:
        q = (torch.rand(1, HEADS, 1, HEAD_DIM, generator=g) * 4 - 2).to(a.device, dtype)
        k = (torch.rand(1, KV_HEADS, ctx, HEAD_DIM, generator=g) * 4 - 2).to(a.device, dtype)
        v = (torch.rand(1, KV_HEADS, ctx, HEAD_DIM, generator=g) * 2 - 1).to(a.device, dtype)
        with torch.no_grad():
            o_eager, w = eager_with_weights(q, k, v)
            o_sdpa = sdpa(q, k, v)
            tol = 1e-4 if dtype == torch.float32 else 3e-2
            err = (o_eager.float() - o_sdpa.float()).abs().max().item()
            if err > tol:
                sys.exit(f"torch_eager_attention.py: error: ctx {ctx}: eager and SDPA differ by "
                         f"{err} (> {tol})")
            if abs(w.float().sum(-1).mean().item() - 1) > 1e-2:
                sys.exit(f"torch_eager_attention.py: error: ctx {ctx}: eager weights do not sum to 1")
            t_eager = time_ms(lambda: eager_with_weights(q, k, v), a.device, a.reps)
            t_sdpa = time_ms(lambda: sdpa(q, k, v), a.device, a.reps)
        rows.append((ctx, ours[(ctx, 1)], ours[(ctx, 0)], t_eager, t_sdpa))
        del q, k, v, o_eager, w, o_sdpa
    print()
    print("| ctx | kvbench +probs ms | kvbench ms | torch eager +weights ms | torch SDPA ms | "
          "eager+weights / kvbench+probs | SDPA / kvbench |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for ctx, kp, k0, te, ts in rows:
        print(f"| {ctx} | {kp:.3f} | {k0:.3f} | {te:.3f} | {ts:.3f} | {te / kp:.2f} | "
              f"{ts / k0:.2f} |")


if __name__ == "__main__":
    main()
