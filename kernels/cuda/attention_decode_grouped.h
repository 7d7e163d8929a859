// The GQA-grouped decode partial pass (n == 1) of cuda::attention (issue 16 item 3): one block per
// (KV head, chunk) reads each K/V row once for all the group's query heads, in 16-byte vectors,
// decode_rows keys per row group in flight at once. attention.cu runs it where the streamed kernel
// (attention_decode_stream.h) does not take the layer, or when asked (kDecodeGrouped); its partial
// states feed the same combine and probability kernels. Internal to the attention kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/kv_cache_device.h"

namespace kvb::kernels::cuda {

// How the grouped kernel would run a decode step; lanes == 0 when it cannot take the shape (the
// caller then uses the per-query-head kernel). Splits: enough blocks to fill a large GPU
// (decode_blocks over the KV heads; 0: 256), never chunks under 64 keys. rows: the kernel's
// kRows (decode_rows; 0: 4, the fastest measured: bench/README.md, H200 2026-11-26, bf16 32K
// 283 -> 215 us against rows 1, f32 496 -> 275).
struct GroupedPlan {
  int lanes = 0, splits = 0, chunk = 0, rows = 1;
  size_t smem = 0;
};

GroupedPlan plan_grouped(KvDtype dtype, int d, int group, int num_kv_heads, int max_len,
                         const void* keys, const void* values, int decode_rows, int decode_blocks);

// The partial pass: part_ml [num_heads, p.splits], part_acc [num_heads, p.splits, d], raw scaled
// scores to scores[h * stride + key] when scores is not null. One launch, stream-ordered.
void launch_grouped(const attn::Common& c, KvDtype dtype, const void* keys, const void* values,
                    int num_kv_heads, const GroupedPlan& p, float2* part_ml, float* part_acc,
                    float* scores, int stride, cudaStream_t stream);

}  // namespace kvb::kernels::cuda
