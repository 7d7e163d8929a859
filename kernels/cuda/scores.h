// Accumulated attention scores as H2O accumulates them (kernels/policies/h2o.cc; POLICIES.md
// "h2o"): each step, a KV head's score row grows by its GQA group's column sums combined by
// cpu::reduce_gqa (mean or max over the group's query heads). The CPU side of this op is
// reduce_gqa + an add loop inside the policy, which the parity test uses as the reference.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/gqa.h"
#include "kernels/cuda/kv_cache_device.h"

namespace kvb::kernels::cuda {

// scores[h * ld + s] += reduce_g col_sums[(h * group + g) * stats_stride + s] for every KV head
// h < num_kv_heads and s < lengths[h] (device [num_kv_heads], each in [0, min(ld,
// stats_stride)], checked on the device: one stream sync). Mean adds the group's rows in
// increasing g and divides by group in f32, max takes them in the same order: the CPU's bits.
// New slots must have been zeroed by the caller (H2O starts a token's score at 0).
// A bad length throws after the kernel ran: the valid heads have been updated by then (the
// check is an invariant of the caller's cache, not a recoverable condition).
void accumulate_scores(float* scores, int ld, const int32_t* lengths, const float* col_sums,
                       int stats_stride, int num_kv_heads, int group, cpu::GqaReduce how,
                       cudaStream_t stream = 0);

// Scissorhands' importance history (kernels/policies/scissorhands.cc `update`; POLICIES.md
// "scissorhands"): each slot keeps one bit per query of the last `history` queries, set when the
// GQA-mean probability that query gave the slot was below its threshold (1 / visible keys, or
// 1 / (position + 1) with inv_position). All pointers device; sizes checked against the view's
// host lengths (no sync).
struct HistoryBitsArgs {
  uint64_t* bits = nullptr;  // [num_kv_heads, ld]: slots below len - n_new hold the old bits
  int ld = 0;
  DeviceLayerKvView kv;               // lengths (this block appended) and positions
  const float* last_probs = nullptr;  // [num_heads, last_w, stride], attention's statistic
  int stride = 0;
  int last_w = 0;  // recorded queries: the block's last last_w (1 <= last_w <= n_new)
  int n_new = 0;   // tokens this block appended
  int num_heads = 0;
  int history = 0;  // 1..64 bits kept per slot
  bool inv_position = false;
};
// Per slot, as the policy's loop: a fresh head (no earlier slots) starts from zeros; new slots
// start from zero; the block's unrecorded queries shift the old bits; then one shift-in per
// recorded query in order, masked to `history` bits. Bitwise equal to the policy.
void scissorhands_update_bits(const HistoryBitsArgs& args, cudaStream_t stream = 0);

}  // namespace kvb::kernels::cuda
