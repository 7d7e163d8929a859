// `expected_attention` (kvpress ExpectedAttentionPress; Devoto et al. 2025, "Expected Attention:
// KV cache compression by estimating attention from future queries distribution"; POLICIES.md
// "kvpress's presses"): after prefill each KV head keeps the kv_budget tokens that future queries
// are expected to attend to most, weighted by their values' norms. Per query head, the prompt's
// queries after the first `n_sink` (before RoPE) give a mean and a covariance; both are rotated
// by RoPE's rotation averaged over the next `n_future_positions` positions. A key k's expected
// logit is k.mean / sqrt(d) + k^T cov k / (2 d) (the second term with `use_covariance`); a
// softmax over the slots after the sinks, the mean over the KV head's query heads, then (score +
// epsilon) x |v| with `use_vnorm`. The first n_sink slots are always kept (kvpress pads them with
// the maximum + 1; kvbench with the largest float, the same order). No decode eviction.
#include <cfloat>
#include <cmath>

#include "common/error.h"
#include "kernels/policies/policies.h"
#include "kernels/policies/scorer.h"

namespace kvb::policies {
namespace {

class ExpectedAttention final : public Policy {
 public:
  explicit ExpectedAttention(const PolicyConfig& c) : Policy(c), wrap_(c) {
    const PolicyOptions& o = c.options;
    future_ = o.get_int("n_future_positions", 512, 1, 1 << 24);
    sinks_ = o.get_int("n_sink", 4, 0, 1 << 20);
    covariance_ = o.get_bool("use_covariance", true);
    vnorm_ = o.get_bool("use_vnorm", true);
    epsilon_ = static_cast<float>(o.get_double("epsilon", 0.0, 0.0, 1e30));
  }
  StatsRequest prefill_request(int) const override {
    return wrap_.request({.pre_rope_queries = true});
  }
  bool decides_with_ops() const override { return true; }

  void on_prefill_layer(const LayerStats& st, const kernels::KvCache& cache,
                        kernels::EvictionPlan& plan) override {
    const int budget = wrap_.budget(st.layer, cache, kv_budget());
    if (!wrap_.acts(cache, st.layer, budget)) return;
    KVB_CHECK(st.pre_rope_queries != nullptr && st.rope != nullptr)
        << "expected_attention: the engine gave no pre-RoPE queries or RoPE parameters";
    const int heads = cache.shape().num_kv_heads, d = cache.shape().head_dim;
    const int group = st.num_heads / heads;
    PolicyOps& ops = ops_of(st);
    // The rotation of the next n_future_positions positions, averaged, in the rows' layout.
    const kernels::cpu::RopeParams& rp = *st.rope;
    const std::vector<float> mean_rot = kernels::cpu::rope_mean_rotation(rp, st.block_end, future_);
    const int half = rp.rot_dim / 2;
    rot_.adjacent = rp.style == kernels::cpu::RopeStyle::kNorm;
    rot_.rot_dim = rp.rot_dim;
    rot_.cos.assign(mean_rot.begin(), mean_rot.begin() + half);
    rot_.sin.assign(mean_rot.begin() + half, mean_rot.end());
    // Scratch (nothing is kept): the query heads' moments, then their expected logits and
    // attention, the KV heads' scores and the values' norms.
    SlotRows& moments = rows_of(moments_.rows, ops, SlotType::kF32, 1, st.num_heads);
    SlotRows& logits = rows_of(logits_.rows, ops, SlotType::kF32, 1, st.num_heads);
    // The queries after the sinks (kvpress asserts the prompt is longer; a block of at most
    // n_sink queries keeps its last one).
    const int first = std::min(sinks_, st.n_new - 1);
    ops.query_moments(moments, 0, st, d, first, rot_, covariance_);
    const double sd = std::sqrt(static_cast<double>(d));
    ops.quadratic_scores(logits, 0, cache, st.layer, moments, 0, group, 1.0 / sd,
                         covariance_ ? 1.0 / (2.0 * d) : 0.0);
    ops.softmax(logits, 0, sinks_);
    SlotRows* score = &logits;
    if (group > 1) {
      SlotRows& reduced = rows_of(reduced_.rows, ops, SlotType::kF32, 1, heads);
      ops.reduce_heads(logits, 0, group, GqaReduce::kMean, reduced, 0);
      score = &reduced;
    }
    if (vnorm_) {
      if (epsilon_ != 0) ops.add_scalar(*score, 0, epsilon_);
      SlotRows& norms = rows_of(norms_.rows, ops, SlotType::kF32, 1, heads);
      ops.cache_norms(norms, 0, cache, st.layer, CacheRows::kValues, /*squared=*/false);
      ops.combine(*score, 0, norms, 0, Combine::kMul);
    }
    ops.fill_prefix(*score, 0, sinks_, FLT_MAX);
    wrap_.keep(ops, *score, 0, st, cache, budget, plan);
  }

  std::unique_ptr<Policy> clone() const override {
    return std::make_unique<ExpectedAttention>(*this);
  }

 private:
  int future_ = 512;
  int sinks_ = 4;
  bool covariance_ = true;
  bool vnorm_ = true;
  float epsilon_ = 0;
  ScorerWrappers wrap_;
  kernels::ops::PairRotation rot_;
  ScratchRows moments_, logits_, reduced_, norms_;
};

}  // namespace

PolicyInfo expected_attention_policy_info() {
  return {
      "expected_attention",
      "keep the sinks and the kv_budget tokens future queries are expected to attend to most "
      "(the prompt's query statistics under RoPE's average rotation), times their values' "
      "norms (ExpectedAttentionPress)",
      with_wrappers(
          {{"n_future_positions", "512", "future positions whose RoPE rotation is averaged", {}},
           {"n_sink", "4", "first tokens always kept, and left out of the query statistics", {}},
           {"use_covariance",
            "true",
            "add the queries' covariance term k^T cov k / (2 d)",
            {"true", "false"}},
           {"use_vnorm",
            "true",
            "multiply the expected attention by the value's L2 norm",
            {"true", "false"}},
           {"epsilon", "0", "added to the expected attention before the value norm", {}}}),
      [](const PolicyConfig& c) { return std::make_unique<ExpectedAttention>(c); }};
}

}  // namespace kvb::policies
