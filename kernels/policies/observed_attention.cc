// `observed_attention` (kvpress ObservedAttentionPress; the prefill score of H2O without its
// recent window; POLICIES.md "kvpress's presses"): after prefill each KV head keeps the
// kv_budget tokens with the highest average attention received from the prompt's queries. Per
// query head, a slot's score is the sum of the probabilities the block's queries gave it
// divided by how many of them saw it (causal: the block's t-th token is seen by n - t of its n
// queries); a KV head takes the mean over its query heads. kvpress's order: sum, divide, then
// the GQA mean. No decode eviction.
#include "kernels/policies/policies.h"
#include "kernels/policies/scorer.h"

namespace kvb::policies {
namespace {

class ObservedAttention final : public Policy {
 public:
  explicit ObservedAttention(const PolicyConfig& c) : Policy(c), wrap_(c) {}
  StatsRequest prefill_request(int) const override { return wrap_.request({.col_sums = true}); }
  bool decides_with_ops() const override { return true; }

  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    const int budget = wrap_.budget(st.layer, cache, kv_budget());
    if (!wrap_.acts(cache, st.layer, budget)) return;
    const int heads = cache.shape().num_kv_heads;
    const int group = st.num_heads / heads;
    PolicyOps& ops = ops_of(st);
    // Scratch rows: the query heads' scores, then the KV heads' (nothing is kept).
    SlotRows& per_query = rows_of(per_query_.rows, ops, SlotType::kF32, 1, st.num_heads);
    lens_.assign(st.num_heads, 0);
    ops.resize(per_query, 0, lens_);  // this block's queries only
    before_.resize(st.num_heads);
    for (int q = 0; q < st.num_heads; ++q) {
      lens_[q] = cache.length(st.layer, q / group);
      before_[q] = lens_[q] - st.n_new;
    }
    ops.resize_and_accumulate(per_query, 0, lens_, st.col_sums, st.stride, st.stride, 1,
                              GqaReduce::kMean);
    ops.divide_by_query_counts(per_query, 0, before_, st.n_new);
    SlotRows* score = &per_query;
    if (group > 1) {
      SlotRows& reduced = rows_of(reduced_.rows, ops, SlotType::kF32, 1, heads);
      ops.reduce_heads(per_query, 0, group, GqaReduce::kMean, reduced, 0);
      score = &reduced;
    }
    wrap_.keep(ops, *score, 0, st, cache, budget, plan);
  }

  std::unique_ptr<Policy> clone() const override {
    return std::make_unique<ObservedAttention>(*this);
  }

 private:
  ScorerWrappers wrap_;
  ScratchRows per_query_, reduced_;
  std::vector<int32_t> lens_, before_;
};

}  // namespace

PolicyInfo observed_attention_policy_info() {
  return {"observed_attention",
          "keep the kv_budget tokens with the highest attention received from the prompt's "
          "queries, averaged over the queries that saw each (ObservedAttentionPress)",
          with_wrappers({}),
          [](const PolicyConfig& c) { return std::make_unique<ObservedAttention>(c); }};
}

}  // namespace kvb::policies
