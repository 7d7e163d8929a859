// Causal multi-head attention with grouped-query heads over a per-head variable-length cache
// (CPU reference). Query head h reads KV head h / (num_heads / num_kv_heads).
#pragma once

#include "kernels/kv_cache.h"

namespace kvb::kernels::cpu {

struct AttentionArgs {
  float* out;             // [n, num_heads, head_dim]
  const float* q;         // [n, num_heads, head_dim], post-RoPE
  LayerKvView kv;         // the layer's cache; the last n slots of every head are the n queries' own
  int n = 0;              // query tokens
  int num_heads = 0;
  float scale = 0;        // usually 1/sqrt(head_dim)
};

// Query i of n (0-based) sees slots [0, length(head) - n + i] of its KV head: everything cached
// before the block plus the block's tokens up to itself. Softmax in f32 with max subtraction;
// one score row per thread, never an n x n matrix.
void attention(const AttentionArgs& args);

}  // namespace kvb::kernels::cpu
