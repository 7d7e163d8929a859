// Prefill attention on bf16 tensor cores (issue 16 item 4): the n >= 2 path of cuda::attention
// for a bf16 cache when AttentionArgs::tensor_core_prefill asks for it. Flash-style
// (FlashAttention-2 tiling): mma.sync m16n8k16 with bf16 operands and f32 accumulators, an online
// softmax in f32, the causal (and sliding-window) mask of attention.h over the ragged per-head
// cache, one KV tile in shared memory serving the query heads of its GQA group. The statistics come
// from a second pass that recomputes every score with the same instructions and takes p = exp(s -
// m) / l with the first pass's per-row (m, l), i.e. exp(s - lse) without rounding lse.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/attention.h"

namespace kvb::kernels::cuda {

// Whether the tensor-core kernel takes this layer: a bf16 cache, head_dim one of 32, 64, 96, 128,
// 256 (one compiled instance each), keys and values 16-byte aligned, and a device of compute
// capability >= 8.0 (mma.sync bf16). Otherwise cuda::attention runs the exact f32 kernel.
bool prefill_mma_supported(const DeviceLayerKvView& kv);

// The tensor-core path for a prefill block (a.n >= 2, already validated by cuda::attention).
// Numerics: each query is rounded to bf16 (nearest even), keys and values are the cache's bf16,
// scores accumulate in f32 inside the tensor cores, the softmax runs in f32, and the
// probabilities are rounded to bf16 for the P x V product (f32 accumulation). Hence, against the
// f32 reference fed the bf16-rounded queries: outputs within 2^-9 max|v| plus the f32 score
// error; statistics within the f32 score error (they never see a rounded probability).
// row_stats: device [num_heads, n] scratch for (row max, row sum); needed only with statistics.
// Launches 1 kernel, 2 with statistics (which col_sums/last_probs the caller has zeroed).
// Stream-ordered, no host synchronisation.
void prefill_mma(const AttentionArgs& a, int group, int max_len, float2* row_stats,
                 cudaStream_t stream);

}  // namespace kvb::kernels::cuda
