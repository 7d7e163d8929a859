// `simlayerkv` (kvpress SimLayerKVPress; Zhang et al. 2024, "SimLayerKV: A Simple Framework for
// Generalized Layer-Level KV Cache Reduction"; kernels/policies/README.md "kvpress's presses"):
// after prefill a layer is lazy when the prompt's last `n_last` queries put more than
// `lazy_threshold` of their attention (the mean over the layer's query heads and those queries) on
// the first `n_initial` tokens and the `n_recent` tokens before the last n_last; a lazy layer
// keeps its first n_initial tokens and its last n_recent - n_last, the others keep everything. A
// prompt of at most n_initial + n_recent + n_last tokens is not compressed. kv_budget sets
// n_recent unless it is given: n_recent = kv_budget - n_initial + n_last, so that a lazy layer
// holds kv_budget tokens. kvpress's lazy_threshold 1.0 (its default) compresses nothing; its
// authors suggest 0.9 for Llama 3, 0.65 for Llama 2, 0.8 for Mistral and 0.85 for Qwen. With
// heads of different lengths (a prompt after a compression) each KV head sums its own prefix and
// recent tokens and the layer takes their mean. The decision reads one row per KV head back to
// the host (on a device: a copy and a sync per head, a prefill cost). No decode eviction.
#include <algorithm>

#include "common/error.h"
#include "kernels/policies/policies.h"

namespace kvb::policies {
namespace {

class SimLayerKv final : public Policy {
 public:
  explicit SimLayerKv(const PolicyConfig& c) : Policy(c) {
    const PolicyOptions& o = c.options;
    threshold_ = o.get_double("lazy_threshold", 1.0, 0.0, 1.0);
    n_last_ = o.get_int("n_last", 1, 1, 1 << 16);
    n_initial_ = o.get_int("n_initial", 4, 0, 1 << 20);
    const int derived = std::max(n_last_ + 1, kv_budget() - n_initial_ + n_last_);
    n_recent_ = o.get_int("n_recent", derived, n_last_ + 1, 1 << 30);
  }
  StatsRequest prefill_request(int) const override { return {.last_w = n_last_}; }
  bool decides_with_ops() const override { return true; }

  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    if (threshold_ >= 1.0) return;  // kvpress: a threshold of 1 compresses nothing
    const int heads = cache.shape().num_kv_heads, group = st.num_heads / heads;
    const int min_length = n_initial_ + n_recent_ + n_last_;
    bool longer = false;
    for (int h = 0; h < heads; ++h) longer |= cache.length(st.layer, h) > min_length;
    if (!longer) return;
    KVB_CHECK(st.last_w >= 1)
        << "simlayerkv: the engine gave no attention rows of the last queries";
    PolicyOps& ops = ops_of(st);
    // Scratch: the last queries' mean attention per query head, then its mean per KV head.
    SlotRows& per_query = rows_of(per_query_.rows, ops, SlotType::kF32, 1, st.num_heads);
    SlotRows& reduced = rows_of(reduced_.rows, ops, SlotType::kF32, 1, heads);
    lens_.resize(st.num_heads);
    for (int q = 0; q < st.num_heads; ++q) lens_[q] = cache.length(st.layer, q / group);
    ops.window_sum(per_query, 0, st, lens_, WindowReduce::kMean);
    ops.reduce_heads(per_query, 0, group, GqaReduce::kMean, reduced, 0);
    // The attention on the first n_initial and the n_recent before the last n_last keys.
    double score = 0;
    for (int h = 0; h < heads; ++h) {
      const std::vector<float> row = ops.read_f32(reduced, 0, h);
      const int len = static_cast<int>(row.size());
      const int end = std::max(0, len - n_last_), recent = std::max(0, end - n_recent_);
      double s = 0;
      for (int j = 0; j < std::min(n_initial_, end); ++j) s += row[j];
      for (int j = std::max(recent, std::min(n_initial_, end)); j < end; ++j) s += row[j];
      score += s / heads;
    }
    if (score <= threshold_) return;
    const int keep_recent = n_recent_ - n_last_;
    for (int h = 0; h < heads; ++h) {
      const int len = cache.length(st.layer, h);
      if (len <= min_length) continue;
      plan.drop(h, n_initial_, len - n_initial_ - keep_recent, len);
    }
  }

  std::unique_ptr<Policy> clone() const override { return std::make_unique<SimLayerKv>(*this); }

 private:
  double threshold_ = 1.0;
  int n_last_ = 1, n_initial_ = 4, n_recent_ = 1024;
  ScratchRows per_query_, reduced_;
  std::vector<int32_t> lens_;
};

}  // namespace

PolicyInfo simlayerkv_policy_info() {
  return {"simlayerkv",
          "lazy layers (the last queries' attention mostly on the first and recent tokens) keep "
          "only those; the other layers keep everything (SimLayerKVPress)",
          {{"lazy_threshold",
            "1.0",
            "a layer is lazy when the attention share exceeds this (1: never; the authors use "
            "0.9 for Llama 3, 0.85 for Qwen)",
            {}},
           {"n_last", "1", "last prompt queries whose attention decides", {}},
           {"n_initial", "4", "first tokens a lazy layer keeps", {}},
           {"n_recent",
            "kv_budget - n_initial + n_last",
            "recent window: a lazy layer keeps its last n_recent - n_last tokens",
            {}}},
          [](const PolicyConfig& c) { return std::make_unique<SimLayerKv>(c); }};
}

}  // namespace kvb::policies
