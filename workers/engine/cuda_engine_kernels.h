// Small element-wise kernels of the GPU engine that have no CPU op of their own (the CPU engine
// does these in plain loops in cpu_backend.cc): embedding gather, residual add, GQA expansion of new
// K/V rows, widening a KV buffer to f32. Device pointers; stream-ordered; host-validated.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/kv_cache_device.h"

namespace kvb::engine::gpu {

// x[t, :] = table[tokens[t], :] * scale for t < n (Gemma's sqrt(dim); 1: a copy); tokens
// already validated in [0, vocab).
void embed_rows(float* x, const float* table, const int32_t* tokens, int n, int dim, float scale,
                cudaStream_t stream);
// x[i] += y[i].
void add_inplace(float* x, const float* y, size_t count, cudaStream_t stream);
// dst[t, h, :] = src[t, h / (heads_out / kv_heads), :]: [n, kv_heads, hd] -> [n, heads_out, hd].
void expand_gqa(float* dst, const float* src, int n, int kv_heads, int heads_out, int head_dim,
                cudaStream_t stream);
// dst[i] = float(src[i]) for `count` elements of `dtype`.
void widen_to_f32(float* dst, const void* src, kernels::cuda::KvDtype dtype, size_t count,
                  cudaStream_t stream);
// dst[i] = i for i < count.
void iota(int32_t* dst, int count, cudaStream_t stream);
// The columns of src [n, sum of widths] into parts: dst[p][t, j] = src[t, begin_p + j] for
// j < width[p], begin_p the widths before p (a fused projection's output into its matrices').
struct ColumnSplit {
  float* dst[3] = {};
  int width[3] = {};
  int parts = 0;
};
void split_columns(const float* src, int n, const ColumnSplit& split, cudaStream_t stream);

}  // namespace kvb::engine::gpu
