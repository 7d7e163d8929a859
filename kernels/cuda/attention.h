// Causal GQA attention over the ragged per-head device cache, CUDA twin of
// kernels/cpu/attention.h, with the same optional statistics (DESIGN.md "Policy"): column sums
// of the causal probabilities over the n queries and the probabilities of the last w queries.
// Query head h reads KV head h / (num_heads / num_kv_heads). Keys/values f32 or bf16 (the
// cache's dtype), queries/outputs/statistics f32, all arithmetic in f32.
#pragma once

#include <cuda_runtime.h>

#include <span>

#include "kernels/cuda/kv_cache_device.h"

namespace kvb::kernels::cuda {

constexpr int kMaxHeadDim = 256;  // per-lane registers hold head_dim / 32 <= 8 output columns
constexpr int kMaxDecodeBlocks = 65535;  // AttentionArgs::decode_blocks (a grid's y extent)

// AttentionArgs::decode_kernel: which partial pass a decode step (n == 1) runs.
// The default is the streamed kernel where it takes the layer (else the grouped one): on an H200
// (2026-11-26, bench_cuda_engine, Llama-3-8B shape, bf16, 3 interleaved pairs) it took `full`
// at 32K from 76.9 to 87.3 decode tok/s (medians) and at 4K from 109.9 to 111.3, h2o at 4K
// from 107.7 to 109.6; in bench_cuda_kernels faster in every row but one (bf16 4K, equal) and
// bf16 32K 227 -> 167 us.
constexpr int kDecodeDefault = 0;   // kDecodeStreamed where it takes the layer, else grouped
constexpr int kDecodeGrouped = 1;   // the GQA-grouped register kernel (or per query head)
constexpr int kDecodeStreamed = 2;  // attention_decode_stream.h, where it takes the layer
// attention_decode_mma.h (bf16 tensor cores: the query and the probabilities rounded to bf16, the
// prefill tensor-core kernel's contract) where it takes the layer: a bf16 cache and no
// statistics asked; otherwise what kDecodeDefault runs. Opt-in until measured on a GPU.
constexpr int kDecodeTensorCore = 3;

// cpu::AttentionArgs with the device view of the layer (flat buffer, per-head offsets) in place
// of LayerKvView. All pointers are device pointers.
struct AttentionArgs {
  float* out = nullptr;      // [n, num_heads, head_dim]
  const float* q = nullptr;  // [n, num_heads, head_dim], post-RoPE
  DeviceLayerKvView kv;      // the last n slots of every head are the n queries' own
  int n = 0;
  int num_heads = 0;
  float scale = 0;
  float* col_sums = nullptr;    // [num_heads, stats_stride]
  float* last_probs = nullptr;  // [num_heads, last_w, stats_stride]
  int last_w = 0;               // 1 <= last_w <= n when last_probs is set
  int stats_stride = 0;         // >= the longest head; entries past a head's visible keys are 0
  // Sliding-window attention (Gemma 3's local layers, Mistral, Phi-3), as cpu::AttentionArgs:
  // > 0 limits query i to the last `window` of its visible slots (its own included). No
  // statistics with a window.
  int window = 0;
  // Prefill blocks (n >= 2) over a bf16 cache on the bf16 tensor-core kernel
  // (attention_prefill_mma.h: queries and probabilities rounded to bf16, f32 accumulation)
  // where it takes the shape; otherwise, and always for an f32 cache or n == 1, the exact f32
  // kernels below. The engine asks for it on bf16 caches; the f32 cache stays the reference.
  bool tensor_core_prefill = false;
  // Tuning of the grouped decode kernel (n == 1, see below), for A/B measurements
  // (bench_cuda_kernels); 0 keeps the measured default. Ignored by prefill (n >= 2) and by the
  // per-query-head decode kernel; the result is the same softmax up to f32 summation order.
  // decode_rows: keys a row group loads (K and V) before any math and folds into its online
  // softmax at once, 1, 2 or 4 (0: 4). decode_blocks: the target number of blocks over all KV
  // heads, 1 .. kMaxDecodeBlocks (0: 256), e.g. a few per multiprocessor; never more splits of a
  // head than 64-key chunks of the longest head.
  int decode_rows = 0;
  int decode_blocks = 0;
  // kDecodeDefault (= kDecodeStreamed), kDecodeGrouped, kDecodeStreamed (where the streamed
  // kernel cannot take the layer, the grouped path runs) or kDecodeTensorCore (where it cannot,
  // the default). decode_blocks applies to all (streamed and tensor cores: 0 means as many
  // blocks as fit on every multiprocessor at once); decode_rows to the grouped one.
  int decode_kernel = kDecodeDefault;
};

// Query i of n sees slots [0, length(head) - n + i] (with a window W: only the last W of them).
// Two paths:
//  - n >= 2 (prefill): flash-style tiles, a block holds 16 (query, head-of-group) rows and
//    streams 32-key K/V tiles through shared memory with an online softmax (no n x n matrix);
//    statistics, when requested, come from a second pass over key tiles that recomputes each
//    probability exactly as exp(s - m) / l from the first pass's row maxima and sums; a column
//    sum adds its queries in a fixed blockwise order (deterministic, not the CPU's order).
//    With tensor_core_prefill on a bf16 cache: attention_prefill_mma.h instead.
//  - n == 1 (decode): split-K (flash-decoding), partial softmax states merged in chunk order;
//    probabilities from the raw scores the first pass stores. Where head_dim splits into 16-byte
//    vectors over a power of two of lanes (bf16: 8..256 in powers of two; f32: 4..256) and the
//    GQA group is at most 8, one block per (KV head, chunk) reads each K/V row once for all the
//    group's query heads (issue 16 item 3), decode_rows keys per row group in flight at once,
//    about decode_blocks blocks; otherwise one block per (query head, 256 keys). By default
//    (and with kDecodeStreamed), where it takes the layer: attention_decode_stream.h (K/V tiles
//    through a cp.async pipeline in shared memory, one block per (KV head, chunk)) instead;
//    kDecodeGrouped keeps the grouped kernel; kDecodeTensorCore runs attention_decode_mma.h on a
//    bf16 cache when no statistics are asked.
// Validates shapes against the view's host lengths and throws kvb::Error. Stream-ordered.
void attention(const AttentionArgs& args, cudaStream_t stream = 0);

// Decode steps (n == 1 each) of several sequences over their own caches that share a shape
// (num_heads, the view's num_kv_heads, head_dim and dtype, window, scale; each its own decode
// settings): every sequence gets the bits attention() gives it alone (outputs, statistics), in
// fewer launches: the streamed and tensor-core partial passes take up to kMaxDecodeSeqs (16)
// sequences a launch, then one combine and, where any sequence asked for statistics, one
// probabilities launch per 16 (issue 16 items 1 and 3: a bundle's decode batch). A sequence
// whose layer the grouped or per-query-head kernel takes gets its own partial launch. Validates
// every sequence before any CUDA call (attention()'s checks, n == 1, the shared shape). Returns
// the kernel launches made. Stream-ordered.
int attention_batch(std::span<const AttentionArgs> seqs, cudaStream_t stream = 0);

}  // namespace kvb::kernels::cuda
