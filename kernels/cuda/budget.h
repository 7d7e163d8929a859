// The data-parallel step of Ada-KV's budget allocation, CUDA twin of
// kernels/cpu/budget.h global_topk_counts (the rest of cpu/budget is host arithmetic).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/budget.h"

namespace kvb::kernels::cuda {

using cpu::RaggedScores;  // here its scores, positions (nullable) and lengths are device pointers

// counts[h] (device [num_heads]) = how many of the k highest-ranked (head, slot) entries lie in
// head h, ranking exactly as the CPU: higher score, then the more recent position, then the
// lower head index (NaN lowest, -0 == +0). k >= total: every entry counts; k <= 0: none.
// One block: radix select of the k-th (score, position) key, then per head the entries above it
// plus, in increasing head order, the ones equal to it until k are taken. Lengths are checked on
// the device (one stream sync).
void global_topk_counts(const RaggedScores& s, int k, int32_t* counts, cudaStream_t stream = 0);
// The same counts, stream-ordered and without the device check (no sync, nothing copied): for a
// caller whose lengths are in [0, ld] by construction (CudaPolicyOps writes them itself). With a
// length outside, counts are left unwritten.
void global_topk_counts_unchecked(const RaggedScores& s, int k, int32_t* counts,
                                  cudaStream_t stream = 0);

}  // namespace kvb::kernels::cuda
