// `noncausal_attn` (kvpress NonCausalAttnPress; Chari & Van Durme 2025, "Compactor: Calibrated
// Query-Agnostic KV Cache Compression with Approximate Leverage Scores", its attention half):
// after prefill each KV head keeps the kv_budget tokens that the prompt's own queries attend to
// most when every query sees every key of its chunk of `chunk_size` tokens (no causal mask,
// no 1 / sqrt(d)): the attention summed over the chunk's queries (chunk_attention_sums, with
// kvpress's padding of a short last chunk), averaged over the KV head's query heads, times the
// value's L2 norm, averaged over 3 neighbours (zeros past the ends, divided by 3), then
// standardised over the layer's heads together (kvpress's z-score: it decides nothing for a
// per-head top-k, but the wrappers' thresholds and cross-head choices read it). Prefill only.
#include "common/error.h"
#include "kernels/policies/compactor_parts.h"
#include "kernels/policies/policies.h"
#include "kernels/policies/scorer.h"

namespace kvb::policies {
namespace {

class NonCausalAttn final : public Policy {
 public:
  explicit NonCausalAttn(const PolicyConfig& c) : Policy(c), wrap_(c) {
    chunk_ = c.options.get_int("chunk_size", 256, 1, 1 << 16);
    refuse_cross_head_wrappers_under_tp(c);
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
        << "noncausal_attn: the engine gave no pre-RoPE queries or RoPE parameters";
    require_whole_prompt("noncausal_attn", "queries", st, cache);
    PolicyOps& ops = ops_of(st);
    SlotRows& pooled = noncausal_scores(ops, st, cache, 0, st.n_new, chunk_, scratch_);
    wrap_.keep(ops, pooled, 0, st, cache, budget, plan);
  }

  std::unique_ptr<Policy> clone() const override { return std::make_unique<NonCausalAttn>(*this); }

 private:
  int chunk_ = 256;
  ScorerWrappers wrap_;
  NonCausalScratch scratch_;
};

}  // namespace

PolicyInfo noncausal_attn_policy_info() {
  return {"noncausal_attn",
          "keep the kv_budget tokens the prompt's own queries attend to most when each sees every "
          "key of its chunk (no causal mask), times their values' norms, pooled over 3 "
          "neighbours and standardised over the layer (NonCausalAttnPress)",
          with_wrappers({{"chunk_size",
                          "256",
                          "tokens per chunk of the non-causal attention (the last chunk is "
                          "padded as kvpress pads it)",
                          {}}}),
          [](const PolicyConfig& c) { return std::make_unique<NonCausalAttn>(c); }};
}

}  // namespace kvb::policies
