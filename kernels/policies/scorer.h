// What kvpress's ScorerPress does with a score (POLICIES.md "kvpress's presses"): after the
// prompt, each cache head of the layer keeps its kv_budget highest-scoring slots (ties keep the
// more recent, POLICIES.md "Ties"); heads within the budget keep everything.
#pragma once

#include <algorithm>
#include <cfloat>
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
                              const kernels::KvCache& cache, int budget, std::vector<KeepTop>* tops,
                              kernels::EvictionPlan& plan) {
  tops->clear();
  for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
    const int len = cache.length(plan.layer(), h);
    if (len <= budget) continue;
    tops->push_back({.head = h, .score_head = h, .len = len, .prefix = len, .k = budget});
  }
  if (!tops->empty()) ops.keep_top(score, score_layer, cache, *tops, {}, plan);
}

// kvpress's AdaKVPress over a scorer (POLICIES.md "kvpress's presses", the option `ada: true`):
// the layer keeps heads x budget slots in all, each head at least its top max(1, int(budget x
// alpha_safeguard)). Each row's top int(budget x alpha) entries are raised to the largest float
// (fill_top), the layer's top heads x budget entries across heads are counted per head
// (count_top_across_heads: equal scores, the more recent first), and each head keeps its count
// of its own top. kvpress masks the pruned slots in attention; kvbench evicts them.
struct AdaScorer {
  bool ada = false;
  double alpha_safeguard = 0.2;

  explicit AdaScorer(const PolicyOptions& o)
      : ada(o.get_bool("ada", false)),
        alpha_safeguard(o.get_double("alpha_safeguard", 0.2, 0.0, 1.0)) {}
  // The two options, for a scorer's PolicyInfo.
  static std::vector<ParamDoc> params() {
    return {{"ada",
             "false",
             "Ada-KV's allocation (kvpress AdaKVPress): the layer's heads x kv_budget best slots "
             "across heads, each head keeping at least alpha_safeguard x kv_budget",
             {"true", "false"}},
            {"alpha_safeguard", "0.2", "with ada: the share of kv_budget every head keeps", {}}};
  }
  // Fills `plan` from the score rows (score_layer, h), one per cache head: keep_top_per_head,
  // or with ada the allocation above (the rows are changed: the safeguarded entries).
  void keep(PolicyOps& ops, SlotRows& score, int score_layer, const kernels::KvCache& cache,
            int budget, std::vector<KeepTop>* tops, kernels::EvictionPlan& plan) const {
    if (!ada) {
      keep_top_per_head(ops, score, score_layer, cache, budget, tops, plan);
      return;
    }
    const int heads = cache.shape().num_kv_heads, layer = plan.layer();
    // At least one slot per head: kvpress's alpha 0 can leave a head none (its attention then
    // divides 0 by 0).
    const int safe = std::max(1, static_cast<int>(budget * alpha_safeguard));
    ops.fill_top(score, score_layer, safe, FLT_MAX);
    const std::vector<int32_t> counts = ops.count_top_across_heads(
        score, score_layer, cache, layer, static_cast<int64_t>(heads) * budget);
    tops->clear();
    for (int h = 0; h < heads; ++h) {
      const int len = cache.length(layer, h);
      if (len <= counts[h]) continue;
      tops->push_back({.head = h, .score_head = h, .len = len, .prefix = len, .k = counts[h]});
    }
    if (!tops->empty()) ops.keep_top(score, score_layer, cache, *tops, {}, plan);
  }
};

// A scorer's PolicyInfo parameters followed by AdaScorer's.
inline std::vector<ParamDoc> with_ada(std::vector<ParamDoc> params) {
  for (ParamDoc& p : AdaScorer::params()) params.push_back(std::move(p));
  return params;
}

}  // namespace kvb::policies
