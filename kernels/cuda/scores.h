// Accumulated attention scores as H2O accumulates them (kernels/policies/h2o.cc; POLICIES.md
// "h2o"): each step, a KV head's score row grows by its GQA group's column sums combined by
// policies::reduce_gqa (mean or max over the group's query heads). The CPU side of this op is
// reduce_gqa + an add loop inside the policy, which the parity test uses as the reference.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvb::policies {
enum class GqaReduce;  // kernels/policies/policy.h
}

namespace kvb::kernels::cuda {

// scores[h * ld + s] += reduce_g col_sums[(h * group + g) * stats_stride + s] for every KV head
// h < num_kv_heads and s < lengths[h] (device [num_kv_heads], each in [0, min(ld,
// stats_stride)], checked on the device: one stream sync). Mean adds the group's rows in
// increasing g and divides by group in f32, max takes them in the same order: the CPU's bits.
// New slots must have been zeroed by the caller (H2O starts a token's score at 0).
void accumulate_scores(float* scores, int ld, const int32_t* lengths, const float* col_sums,
                       int stats_stride, int num_kv_heads, int group, policies::GqaReduce how,
                       cudaStream_t stream = 0);

}  // namespace kvb::kernels::cuda
