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
#include "kernels/policies/slot_state.h"

namespace kvb::policies {
namespace {

class H2O final : public Policy {
 public:
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
    scores_ = SlotState<float>(c.shape.num_layers, cache_kv_heads());
  }

  PrefillMode prefill_mode() const override {
    return streaming_ ? PrefillMode::kStreaming : PrefillMode::kOneshot;
  }
  StatsRequest prefill_request(int) const override { return {.col_sums = true}; }
  StatsRequest decode_request() const override { return {.col_sums = true}; }

  void on_prefill_layer(const LayerStats& st, const kernels::KvCache& cache,
                        kernels::EvictionPlan& plan) override {
    const int group = st.num_heads / cache.shape().num_kv_heads;
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      const int len = cache.length(st.layer, h);
      std::vector<float>& score = scores_.at(st.layer, h);
      // Earlier tokens (a prefill on top of a cache) keep their scores and add this block's.
      const size_t old = score.size();
      score.resize(len, 0.0f);
      std::vector<float> add(len);
      reduce_gqa(st.col_sums + static_cast<size_t>(h) * group * st.stride, st.stride, group, len,
                 gqa_, add.data());
      for (int s = 0; s < len; ++s) score[s] = (static_cast<size_t>(s) < old ? score[s] : 0.0f) + add[s];
      if (len <= kv_budget()) continue;
      // Keep the last `recent` tokens and the top-`heavy` of the rest.
      const int recent = std::min(split_.recent, len);
      std::vector<int32_t> keep(split_.heavy);
      const int got = kernels::cpu::select_topk(score.data(), len - recent, split_.heavy, keep.data());
      keep.resize(got);
      for (int s = len - recent; s < len; ++s) keep.push_back(s);
      compact(score, keep);
      plan.keep(h, std::move(keep));
    }
  }

  void on_decode_layer(const LayerStats& st, const kernels::KvCache& cache,
                       kernels::EvictionPlan& plan) override {
    const int group = st.num_heads / cache.shape().num_kv_heads;
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      const int len = cache.length(st.layer, h);
      std::vector<float>& score = scores_.at(st.layer, h);
      KVB_ASSERT(static_cast<int>(score.size()) == len - 1);
      score.push_back(0.0f);
      std::vector<float> add(len);
      reduce_gqa(st.col_sums + static_cast<size_t>(h) * group * st.stride, st.stride, group, len,
                 gqa_, add.data());
      for (int s = 0; s < len; ++s) score[s] += add[s];
      if (len <= kv_budget()) continue;
      // Candidates: slots before the recent window (promote_recent: also not the leaving one).
      const int candidates = len - split_.recent - (promote_recent_ ? 1 : 0);
      int victim;
      if (candidates <= 0) {
        victim = 0;  // no heavy part (heavy_fraction 0): behave as a window
      } else {
        victim = kernels::cpu::select_argmin(score.data(), nullptr, candidates);
      }
      plan.evict(h, victim);
      erase_slot(score, victim);
    }
  }

  size_t state_bytes() const override { return scores_.bytes(); }
  std::unique_ptr<Policy> clone() const override { return std::make_unique<H2O>(*this); }

 private:
  double heavy_fraction_ = 0.5;
  bool promote_recent_ = false;
  bool streaming_ = false;
  GqaReduce gqa_ = GqaReduce::kMean;
  kernels::cpu::HeavyRecentSplit split_;
  SlotState<float> scores_;
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
