// `h2o`: Heavy-Hitter Oracle (seed 000; POLICIES.md "h2o"). The budget splits into heavy hitters
// (highest accumulated attention) and a recent window. A token's score is the sum of the
// attention probabilities every query gave it since it entered the cache (normalized over the
// retained tokens; GQA: mean over the KV head's query heads). Decode evicts one token per step:
// `candidates: heavy_and_leaving` (HF real-drop code) takes the argmin over every token outside
// the recent window; `promote_recent` (FlexGen) over the heavy set only, so the token leaving the
// recent window always stays.
#include <algorithm>
#include <utility>

#include "common/error.h"
#include "kernels/cpu/budget.h"
#include "kernels/cpu/select.h"
#include "kernels/policies/policies.h"
#include "kernels/ops/policy_ops.h"

namespace kvb::policies {
namespace {

class H2O final : public Policy {
 public:
  bool evicts_at_decode() const override { return true; }
  explicit H2O(const PolicyConfig& c) : Policy(c) {
    const PolicyOptions& o = c.options;
    heavy_fraction_ = o.get_double("heavy_fraction", 0.5, 0.0, 1.0);
    promote_recent_ =
        o.get_string("candidates", "heavy_and_leaving", {"heavy_and_leaving", "promote_recent"}) ==
        "promote_recent";
    streaming_ = o.get_string("prefill", "oneshot", {"oneshot", "streaming"}) == "streaming";
    gqa_ = o.get_string("gqa_reduce", "mean", {"mean", "max"}) == "max" ? GqaReduce::kMax
                                                                        : GqaReduce::kMean;
    split_ = kernels::cpu::split_heavy_recent(c.kv_budget, heavy_fraction_);
  }

  PrefillMode prefill_mode() const override {
    return streaming_ ? PrefillMode::kStreaming : PrefillMode::kOneshot;
  }
  StatsRequest prefill_request(int) const override { return {.col_sums = true}; }
  StatsRequest decode_request() const override { return {.col_sums = true}; }
  bool decides_with_ops() const override { return true; }

  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    const int heads = cache.shape().num_kv_heads;
    PolicyOps& ops = ops_of(st);
    SlotRows& score = accumulate(ops, st, cache);
    tops_.clear();
    for (int h = 0; h < heads; ++h) {
      const int len = cache.length(st.layer, h);
      if (len <= kv_budget()) continue;
      // Keep the last `recent` tokens and the top-`heavy` of the rest.
      const int recent = std::min(split_.recent, len);
      tops_.push_back({.head = h, .score_head = h, .len = len, .prefix = len - recent,
                       .k = split_.heavy});
    }
    SlotRows* state[] = {&score};
    if (!tops_.empty()) ops.keep_top(score, st.layer, cache, tops_, state, plan);
  }

  void on_decode_layer(const LayerStats& st, const kernels::KvIndex& cache,
                       kernels::EvictionPlan& plan) override {
    const int heads = cache.shape().num_kv_heads;
    PolicyOps& ops = ops_of(st);
    if (scores_) {
      for (int h = 0; h < heads; ++h) {
        KVB_ASSERT(scores_->length(st.layer, h) == cache.length(st.layer, h) - 1);
      }
    }
    SlotRows& score = accumulate(ops, st, cache);
    tops_.clear();
    for (int h = 0; h < heads; ++h) {
      const int len = cache.length(st.layer, h);
      if (len <= kv_budget()) continue;
      // Candidates: slots before the recent window (promote_recent: also not the leaving one);
      // the lowest-ranked of them goes. None (heavy_fraction 0): slot 0 goes, as a window.
      const int candidates = len - split_.recent - (promote_recent_ ? 1 : 0);
      const int prefix = candidates <= 0 ? 1 : candidates;
      tops_.push_back({.head = h, .score_head = h, .len = len, .prefix = prefix, .k = prefix - 1});
    }
    SlotRows* state[] = {&score};
    if (!tops_.empty()) ops.keep_top(score, st.layer, cache, tops_, state, plan);
  }

  size_t state_bytes() const override { return scores_.bytes(); }
  std::unique_ptr<Policy> clone() const override { return std::make_unique<H2O>(*this); }

 private:
  // Each head's scores grow to its length (new tokens start at 0; earlier tokens, e.g. before a
  // prefill on top of a cache, keep theirs) and add this block's GQA-reduced column sums.
  SlotRows& accumulate(PolicyOps& ops, const LayerStats& st, const kernels::KvIndex& cache) {
    const int heads = cache.shape().num_kv_heads;
    SlotRows& score = rows_of(scores_, ops, SlotType::kF32, config().shape.num_layers, heads);
    lens_.resize(heads);
    for (int h = 0; h < heads; ++h) lens_[h] = cache.length(st.layer, h);
    const int group = st.num_heads / heads;
    ops.resize_and_accumulate(score, st.layer, lens_, st.col_sums,
                              static_cast<size_t>(group) * st.stride, st.stride, group, gqa_);
    return score;
  }

  double heavy_fraction_ = 0.5;
  bool promote_recent_ = false;
  bool streaming_ = false;
  GqaReduce gqa_ = GqaReduce::kMean;
  kernels::cpu::HeavyRecentSplit split_;
  SlotRowsPtr scores_;  // per slot: accumulated attention, where the ops keep it
  std::vector<int32_t> lens_;
  std::vector<KeepTop> tops_;
};

}  // namespace

PolicyInfo h2o_policy_info() {
  return {"h2o",
          "Heavy-Hitter Oracle: heavy hitters by accumulated attention + a recent window",
          {{"heavy_fraction", "0.5", "share of the budget for heavy hitters (floor); rest recent", {}},
           {"candidates", "heavy_and_leaving",
            "decode eviction candidates: all outside the recent window (HF) or heavy only (FlexGen)",
            {"heavy_and_leaving", "promote_recent"}},
           {"prefill", "oneshot", "compress once after the prompt, or stream it token by token",
            {"oneshot", "streaming"}},
           {"gqa_reduce", "mean", "how a KV head's score combines its query heads", {"mean", "max"}}},
          [](const PolicyConfig& c) { return std::make_unique<H2O>(c); }};
}

}  // namespace kvb::policies
