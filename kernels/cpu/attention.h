// Causal multi-head attention with grouped-query heads over a per-head variable-length cache
// (CPU reference), optionally returning the statistics eviction policies read (DESIGN.md
// "Policy"): column sums of the causal probabilities and the probabilities of the last w queries.
// Query head h reads KV head h / (num_heads / num_kv_heads).
#pragma once

#include <span>

#include "kernels/kv_cache.h"

namespace kvb::kernels::cpu {

struct AttentionArgs {
  float* out;             // [n, num_heads, head_dim]
  const float* q;         // [n, num_heads, head_dim], post-RoPE
  LayerKvView kv;         // the layer's cache; the last n slots of every head are the n queries' own
  int n = 0;              // query tokens
  int num_heads = 0;
  float scale = 0;        // usually 1/sqrt(head_dim)
  // Optional statistics, per query head, indexed by the slot of the query's KV head; rows have
  // `stats_stride` entries (>= the longest head), entries past a head's length are left 0.
  float* col_sums = nullptr;    // [num_heads, stats_stride]: sum over the n queries of p[i][slot]
  float* last_probs = nullptr;  // [num_heads, last_w, stats_stride]: p of queries n-last_w..n-1
  int last_w = 0;               // 1 <= last_w <= n when last_probs is set
  int stats_stride = 0;
  // A prefill continued from a checkpoint (workers/prefix_store.h): col_sums already hold the
  // sums of the earlier queries, and this call adds its queries to them (in the same order one
  // call over all the queries would, so the bits are that call's) instead of starting from 0.
  bool accumulate_col_sums = false;
  // Sliding-window attention (Gemma's local layers): > 0 limits query i to the last `window`
  // of its visible slots (its own included), which are consecutive positions in a sliding
  // layer's cache. No statistics with a window.
  int window = 0;
  // The softmax's exponential: std::exp's bits (exp_floats; the f32 reference) or, set by
  // --dtype native, exp_fast (kernels/cpu/exp_fast.h: a float polynomial within 2 ulp, the same
  // bits on every path, about 3.6x faster). Everything else is the same either way.
  bool fast_exp = false;
};

// Query i of n (0-based) sees slots [0, length(head) - n + i] of its KV head: everything cached
// before the block plus the block's tokens up to itself (with a window W: only the slots
// [max(0, length - n + i - W + 1), length - n + i]). Softmax in f32 with max subtraction and a
// double sum; never an n x n matrix (blocks of 32 queries). Scores and P x V in matmul's
// summation order. Column sums add queries in increasing order (deterministic); when they are
// requested, threads split query heads rather than queries. The bits do not depend on the
// thread count; test_attention_cpu pins them to a plain transcription of the definition.
void attention(const AttentionArgs& args);

// Several independent calls (a decode batch's sequences, one layer): the results of
// attention(calls[i]) for every i, bit for bit, with the KV heads of all the calls shared among
// the threads in one parallel region (calls of fewer than 32 queries; larger ones run one
// after another). The calls must not write to the same memory.
void attention_batch(std::span<const AttentionArgs> calls);

}  // namespace kvb::kernels::cpu
