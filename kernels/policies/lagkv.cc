// `lagkv` (kvpress LagKVPress; Liang et al. 2025, "LagKV: lag-relative information of the KV
// cache tells which tokens are important"; POLICIES.md "kvpress's presses"): after prefill the
// prompt after `sinks` tokens is cut into partitions of `lag` tokens; each partition's tokens
// are ranked by how much their keys and values vary, normalised by the next partition's
// per-channel range (policy_ops.h lag_scores), and each head keeps its kv_budget best: the sinks
// and the last partition (with the remainder) first, then the tokens of highest rank in every
// partition. Equal ranks across partitions are exact ties: kvbench keeps the more recent
// partition's token, kvpress whichever torch.topk returns. A prompt shorter than sinks + 2 lag
// keeps the sinks and the most recent tokens. No decode eviction. kvpress's cross_scoring
// variant is not offered.
#include "kernels/policies/policies.h"
#include "kernels/policies/scorer.h"

namespace kvb::policies {
namespace {

class LagKv final : public Policy {
 public:
  explicit LagKv(const PolicyConfig& c) : Policy(c), wrap_(c, /*rescores=*/true) {
    sinks_ = c.options.get_int("sinks", 4, 0, 1 << 20);
    lag_ = c.options.get_int("lag", 128, 2, 1 << 16);
  }
  StatsRequest prefill_request(int) const override { return wrap_.request({}); }
  bool decides_with_ops() const override { return true; }

  StatsRequest decode_request() const override { return wrap_.decode_request(); }

  void on_prefill_layer(const LayerStats& st, const kernels::KvCache& cache,
                        kernels::EvictionPlan& plan) override {
    decide(st, cache, wrap_.budget(st.layer, cache, kv_budget()), plan);
  }
  // decode_interval: the cache scored again and compressed back to kv_budget.
  void on_decode_layer(const LayerStats& st, const kernels::KvCache& cache,
                       kernels::EvictionPlan& plan) override {
    if (wrap_.decode_due(st.layer, cache.shape().num_layers)) decide(st, cache, kv_budget(), plan);
  }

  void decide(const LayerStats& st, const kernels::KvCache& cache, int budget,
              kernels::EvictionPlan& plan) {
    if (!over_budget(cache, st.layer, budget)) return;
    PolicyOps& ops = ops_of(st);
    SlotRows& score = rows_of(score_.rows, ops, SlotType::kF32, 1, cache.shape().num_kv_heads);
    ops.lag_scores(score, 0, cache, st.layer, sinks_, lag_);
    wrap_.keep(ops, score, 0, st, cache, budget, plan);
  }

  std::unique_ptr<Policy> clone() const override { return std::make_unique<LagKv>(*this); }

 private:
  int sinks_ = 4;
  int lag_ = 128;
  ScorerWrappers wrap_;
  ScratchRows score_;
};

}  // namespace

PolicyInfo lagkv_policy_info() {
  return {
      "lagkv",
      "keep the sinks, the last partition and the tokens that vary most relative to the next "
      "partition of `lag` tokens (LagKVPress)",
      with_wrappers({{"sinks", "4", "first tokens always kept", {}},
                     {"lag", "128", "tokens per partition (each is scored against the next)", {}}}),
      [](const PolicyConfig& c) { return std::make_unique<LagKv>(c); }};
}

}  // namespace kvb::policies
