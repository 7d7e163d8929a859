// `streaming_llm`: attention sinks + a recent window (POLICIES.md "streaming_llm"; Xiao et al.,
// StreamingLLM, mit-han-lab StartRecentKVCache). Keeps the first `sinks` tokens and the most
// recent `kv_budget - sinks`, after prefill and at every decode step. `positions: rolling` and
// `evict: before_attention` together reproduce the original code (keys rotated by their index in
// the cache; the cache trimmed before the new query attends, so it sees one key fewer).
#include <limits>
#include <utility>

#include "common/error.h"
#include "kernels/policies/policies.h"
#include "kernels/ops/slot_state.h"

namespace kvb::policies {
namespace {

class StreamingLlm final : public Policy {
 public:
  bool evicts_at_decode() const override { return true; }
  explicit StreamingLlm(const PolicyConfig& c) : Policy(c) {
    const PolicyOptions& o = c.options;
    sinks_ = o.get_int("sinks", 4, 0, std::numeric_limits<int>::max());
    // rerotate: Policy's (kvpress KeyRerotationPress after the prompt), not a rolling cache.
    rolling_ = o.get_string("positions", "true", {"true", "rolling", "rerotate"}) == "rolling";
    before_ = o.get_string("evict", "after_attention", {"after_attention", "before_attention"}) ==
              "before_attention";
    streaming_ = o.get_string("prefill", "oneshot", {"oneshot", "streaming"}) == "streaming";
    // The recent window must hold at least the newest token, or decode would evict what it adds.
    KVB_USAGE_CHECK(c.kv_budget > sinks_)
        << "policy streaming_llm: --kv-budget " << c.kv_budget << " must exceed sinks=" << sinks_
        << " (the budget includes the sink tokens; use a budget of at least " << sinks_ + 1
        << " or fewer sinks)";
  }

  PrefillMode prefill_mode() const override {
    return streaming_ ? PrefillMode::kStreaming : PrefillMode::kOneshot;
  }
  bool rolling_positions() const override { return rolling_; }
  bool evict_before_attention() const override { return before_; }

  // No statistics: the rule depends only on slot order (slots are in position order).
  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    trim(st.layer, cache, plan);
  }
  void on_decode_layer(const LayerStats& st, const kernels::KvIndex& cache,
                       kernels::EvictionPlan& plan) override {
    trim(st.layer, cache, plan);
  }
  std::unique_ptr<Policy> clone() const override { return std::make_unique<StreamingLlm>(*this); }

 private:
  // Keeps slots [0, sinks) and the last kv_budget - sinks. The sinks stay the sequence's first
  // tokens because this rule never drops them once the cache has reached them.
  void trim(int layer, const kernels::KvIndex& cache, kernels::EvictionPlan& plan) const {
    const int recent = kv_budget() - sinks_;
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      const int len = cache.length(layer, h);
      if (len <= kv_budget()) continue;  // len > budget > sinks from here on
      plan.drop(h, sinks_, len - recent - sinks_, len);  // the oldest after the sinks
    }
  }

  int sinks_ = 4;
  bool rolling_ = false;
  bool before_ = false;
  bool streaming_ = false;
};

}  // namespace

PolicyInfo streaming_llm_policy_info() {
  return {
      "streaming_llm",
      "attention sinks: the first `sinks` tokens + the most recent kv_budget - sinks",
      {{"sinks", "4", "initial tokens always kept (inside the budget; budget must exceed it)", {}},
       {"positions",
        "true",
        "keep true positions, or cache keys before RoPE and rotate them by their cache index "
        "(original StreamingLLM), or re-rotate the kept keys to 0..n-1 once after the prompt "
        "(kvpress KeyRerotationPress; every policy's `positions: rerotate`)",
        {"true", "rolling", "rerotate"}},
       {"evict",
        "after_attention",
        "trim after the new token attended (common order) or before (original StreamingLLM)",
        {"after_attention", "before_attention"}},
       {"prefill",
        "oneshot",
        "compress once after the prompt, or stream it token by token",
        {"oneshot", "streaming"}}},
      [](const PolicyConfig& c) { return std::make_unique<StreamingLlm>(c); }};
}

}  // namespace kvb::policies
