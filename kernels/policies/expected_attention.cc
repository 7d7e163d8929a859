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
  explicit ExpectedAttention(const PolicyConfig& c)
      : Policy(c), wrap_(c, /*rescores=*/false, /*chunks=*/true) {
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

  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    const int budget = wrap_.budget(st.layer, cache, kv_budget());
    if (!wrap_.acts(cache, st.layer, budget)) return;
    KVB_CHECK(st.pre_rope_queries != nullptr && st.rope != nullptr)
        << "expected_attention: the engine gave no pre-RoPE queries or RoPE parameters";
    PolicyOps& ops = ops_of(st);
    if (wrap_.chunk() == 0) {
      wrap_.keep(ops, score(ops, st, cache, 0, 0, st.block_end), 0, st, cache, budget, plan);
      return;
    }
    // kvpress's ChunkPress: each run of chunk slots scored by ExpectedAttentionPress as a prompt
    // of those tokens alone: its own queries after its own first n_sink, the future rotation from
    // its length on, its softmax and sinks. The runs' scores are gathered per head on the host
    // (one copy per head and run on a device) and written back as a row as long as the head
    // (one upload), which the wrappers keep per run.
    require_whole_prompt("expected_attention", "queries (chunk)", st, cache);
    const int heads = cache.shape().num_kv_heads, n = st.n_new, run = wrap_.chunk();
    runs_.assign(static_cast<size_t>(heads) * n, 0.0f);
    for (int c0 = 0; c0 < n; c0 += run) {
      const int len = std::min(run, n - c0);
      SlotRows& s = score(ops, st, cache, c0, len, len);
      for (int h = 0; h < heads; ++h) {
        const std::vector<float> row = ops.read_f32(s, 0, h);
        std::copy(row.begin(), row.end(), runs_.begin() + static_cast<size_t>(h) * n + c0);
      }
    }
    SlotRows& all = rows_of(all_.rows, ops, SlotType::kF32, 1, heads);
    ops.write_rows(all, 0, runs_, n);
    wrap_.keep(ops, all, 0, st, cache, budget, plan);
  }

  std::unique_ptr<Policy> clone() const override {
    return std::make_unique<ExpectedAttention>(*this);
  }

 private:
  // ExpectedAttentionPress's scores of slots [c0, c0 + count) of layer st.layer from the queries
  // of the same tokens, the future rotation starting at position `future_from` (kvpress: the
  // scored tokens' count); count 0: the whole layer (every head's slots, st's queries). One row
  // per cache head, in ops' rows.
  SlotRows& score(PolicyOps& ops, const LayerStats& st, const kernels::KvIndex& cache, int c0,
                  int count, int future_from) {
    const int heads = cache.shape().num_kv_heads, d = cache.shape().head_dim;
    const int group = st.num_heads / heads;
    LayerStats run = st;
    if (count > 0) {
      run.pre_rope_queries = st.pre_rope_queries + static_cast<size_t>(c0) * st.num_heads * d;
      run.n_new = count;
    }
    // The rotation of the next n_future_positions positions, averaged, in the rows' layout.
    const kernels::cpu::RopeParams& rp = *st.rope;
    const std::vector<float> mean_rot = kernels::cpu::rope_mean_rotation(rp, future_from, future_);
    const int half = rp.rot_dim / 2;
    rot_.adjacent = rp.style == kernels::cpu::RopeStyle::kNorm;
    rot_.rot_dim = rp.rot_dim;
    rot_.cos.assign(mean_rot.begin(), mean_rot.begin() + half);
    rot_.sin.assign(mean_rot.begin() + half, mean_rot.end());
    // Scratch (nothing is kept): the query heads' moments, then their expected logits and
    // attention, the KV heads' scores and the values' norms.
    SlotRows& moments = rows_of(moments_.rows, ops, SlotType::kF32, 1, st.num_heads);
    SlotRows* logits = &rows_of(logits_.rows, ops, SlotType::kF32, 1, st.num_heads);
    // The queries after the sinks (kvpress asserts the prompt is longer; a block of at most
    // n_sink queries keeps its last one).
    const int first = std::min(sinks_, run.n_new - 1);
    ops.query_moments(moments, 0, run, d, first, rot_, covariance_);
    const double sd = std::sqrt(static_cast<double>(d));
    ops.quadratic_scores(*logits, 0, cache, st.layer, moments, 0, group, 1.0 / sd,
                         covariance_ ? 1.0 / (2.0 * d) : 0.0);
    if (count > 0) {  // the run's slots alone
      SlotRows& part = rows_of(part_.rows, ops, SlotType::kF32, 1, st.num_heads);
      ops.slice(*logits, 0, c0, count, part, 0);
      logits = &part;
    }
    ops.softmax(*logits, 0, sinks_);
    SlotRows* score = logits;
    if (group > 1) {
      SlotRows& reduced = rows_of(reduced_.rows, ops, SlotType::kF32, 1, heads);
      ops.reduce_heads(*logits, 0, group, GqaReduce::kMean, reduced, 0);
      score = &reduced;
    }
    if (vnorm_) {
      if (epsilon_ != 0) ops.add_scalar(*score, 0, epsilon_);
      SlotRows& norms = rows_of(norms_.rows, ops, SlotType::kF32, 1, heads);
      ops.cache_norms(norms, 0, cache, st.layer, CacheRows::kValues, /*squared=*/false);
      SlotRows* n = &norms;
      if (count > 0) {
        SlotRows& part = rows_of(norms_part_.rows, ops, SlotType::kF32, 1, heads);
        ops.slice(norms, 0, c0, count, part, 0);
        n = &part;
      }
      ops.combine(*score, 0, *n, 0, Combine::kMul);
    }
    ops.fill_prefix(*score, 0, sinks_, FLT_MAX);
    return *score;
  }

  int future_ = 512;
  int sinks_ = 4;
  bool covariance_ = true;
  bool vnorm_ = true;
  float epsilon_ = 0;
  ScorerWrappers wrap_;
  kernels::ops::PairRotation rot_;
  ScratchRows moments_, logits_, reduced_, norms_, part_, norms_part_, all_;
  std::vector<float> runs_;  // chunk: the runs' scores, [head][slot]
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
