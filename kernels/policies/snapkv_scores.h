// The SnapKV family's observation-window scores (POLICIES.md `snapkv`, "GQA statistics"; SnapKV
// and the Ada-KV code): from the last w prompt queries' probabilities, per KV head, the columns of
// the prefix keys (every slot before the window) reduced over the w queries, then over the
// group's query heads, then pooled along the token axis.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/pool.h"
#include "kernels/kv_cache.h"
#include "kernels/policies/policy.h"

namespace kvb::policies {

enum class WindowReduce { kMean, kSum };

struct SnapKvScoreOptions {
  int pool_kernel = 7;  // odd, >= 1 (1: no pooling)
  kernels::cpu::PoolKind pooling = kernels::cpu::PoolKind::kMax;
  WindowReduce window_reduce = WindowReduce::kMean;
  GqaReduce gqa_reduce = GqaReduce::kMean;
};

// Reads pool_kernel, pooling, window_reduce and gqa_reduce (usage errors name what is allowed).
SnapKvScoreOptions read_snapkv_score_options(const PolicyOptions& options);
// The documentation of those four options plus `window`, shared by every family member.
std::vector<ParamDoc> snapkv_score_params();

// Pooled prefix scores of every KV head of one layer. Head h has prefix length
// lengths[h] = max(0, len_h - w); its scores are scores[h * ld + j] for j < lengths[h]
// (the rest of the row is 0). ld = the largest prefix length.
struct PrefixScores {
  int ld = 0;
  std::vector<float> scores;     // [num_kv_heads, ld]
  std::vector<int32_t> lengths;  // [num_kv_heads]
};

// stats.last_probs: [stats.num_heads, stats.last_w, stats.stride]; the window is the last
// w = stats.last_w slots of every head (the block's last w queries). cache gives the lengths;
// its num_kv_heads must divide stats.num_heads (query heads h*g..h*g+g-1 belong to KV head h).
// Accumulates in f32: the window sum in query order, divided by w for `mean`.
PrefixScores snapkv_prefix_scores(const LayerStats& stats, const kernels::KvCache& cache,
                                  const SnapKvScoreOptions& options);

}  // namespace kvb::policies
