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

class LagKv final : public CacheScorer {
 public:
  explicit LagKv(const PolicyConfig& c) : CacheScorer(c) {
    sinks_ = c.options.get_int("sinks", 4, 0, 1 << 20);
    lag_ = c.options.get_int("lag", 128, 2, 1 << 16);
  }

  std::unique_ptr<Policy> clone() const override { return std::make_unique<LagKv>(*this); }

 protected:
  // One slot is shorter than sinks + 2 x lag: a sink scores 1, else (0 - 0) / (1 - 0) = 0.
  float lone_score() const override { return sinks_ > 0 ? 1.0f : 0.0f; }
  SlotRows& score(PolicyOps& ops, const LayerStats& st, const kernels::KvIndex& cache) override {
    SlotRows& score = rows_of(score_.rows, ops, SlotType::kF32, 1, cache.shape().num_kv_heads);
    ops.lag_scores(score, 0, cache, st.layer, sinks_, lag_);
    return score;
  }

 private:
  int sinks_ = 4;
  int lag_ = 128;
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
