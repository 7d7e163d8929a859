// What kvpress's ScorerPress does with a score (POLICIES.md "kvpress's presses"): after the
// prompt, each cache head of the layer keeps its kv_budget highest-scoring slots (ties keep the
// more recent, POLICIES.md "Ties"); heads within the budget keep everything.
#pragma once

#include <vector>

#include "kernels/policies/policy.h"

namespace kvb::policies {

// Whether a head of `layer` holds more than `budget` slots (the layer has something to evict).
inline bool over_budget(const kernels::KvCache& cache, int layer, int budget) {
  for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
    if (cache.length(layer, h) > budget) return true;
  }
  return false;
}

// Fills `plan` for layer plan.layer() of `cache` from f32 rows (score_layer, h) of `score`, one
// per cache head, each as long as its head. tops: the caller's scratch.
inline void keep_top_per_head(PolicyOps& ops, const SlotRows& score, int score_layer,
                              const kernels::KvCache& cache, int budget,
                              std::vector<KeepTop>* tops, kernels::EvictionPlan& plan) {
  tops->clear();
  for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
    const int len = cache.length(plan.layer(), h);
    if (len <= budget) continue;
    tops->push_back({.head = h, .score_head = h, .len = len, .prefix = len, .k = budget});
  }
  if (!tops->empty()) ops.keep_top(score, score_layer, cache, *tops, {}, plan);
}

}  // namespace kvb::policies
