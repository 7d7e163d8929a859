// `leverage` (kvpress LeverageScorePress; Chari & Van Durme 2025, "Compactor: Calibrated
// Query-Agnostic KV Cache Compression with Approximate Leverage Scores", its leverage half): after
// prefill each KV head keeps the kv_budget tokens whose pre-RoPE keys have the highest approximate
// leverage: the keys centred over the prompt and projected by a Gaussian sketch of
// `sketch_dimension` columns scaled by 1 / sqrt(k), X, score diag(X (X^T X + jitter I)^{-1} X^T)
// (kvpress's Cholesky with jitter from 1e-2), standardised over the layer's heads together
// (kvpress's z-score). The sketch is kvbench's own, drawn from a counter per (unit seed, layer,
// global KV head) (kernels/cpu/sketch.h), its rows in Hugging Face's channel order: reproducible,
// so a unit's result repeats and a seed axis varies it; kvpress draws torch.randn, which
// compare_kvpress.py replaces by the same values to compare keep-sets. Prefill only.
#include "common/error.h"
#include "kernels/policies/compactor_parts.h"
#include "kernels/policies/policies.h"
#include "kernels/policies/scorer.h"

namespace kvb::policies {
namespace {

class Leverage final : public Policy {
 public:
  explicit Leverage(const PolicyConfig& c) : Policy(c), wrap_(c) {
    k_ = c.options.get_int("sketch_dimension", 48, 1, kernels::ops::kMaxSketch);
    refuse_cross_head_wrappers_under_tp(c);
  }
  StatsRequest prefill_request(int) const override {
    return wrap_.request({.pre_rope_keys = true});
  }
  bool decides_with_ops() const override { return true; }

  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    const int budget = wrap_.budget(st.layer, cache, kv_budget());
    if (!wrap_.acts(cache, st.layer, budget)) return;
    KVB_CHECK(st.pre_rope_keys != nullptr) << "leverage: the engine gave no pre-RoPE keys";
    require_whole_prompt("leverage", "keys", st, cache);
    PolicyOps& ops = ops_of(st);
    SlotRows& score = leverage_scores(ops, st, cache, 0, st.n_new, k_, config().seed,
                                      tp_rank() * cache.shape().num_kv_heads, sketch_, score_);
    wrap_.keep(ops, score, 0, st, cache, budget, plan);
  }

  std::unique_ptr<Policy> clone() const override { return std::make_unique<Leverage>(*this); }

 private:
  int k_ = 48;
  ScorerWrappers wrap_;
  std::vector<float> sketch_;
  ScratchRows score_;
};

}  // namespace

PolicyInfo leverage_policy_info() {
  return {"leverage",
          "keep the kv_budget tokens whose pre-RoPE keys have the highest approximate leverage "
          "under a Gaussian sketch drawn from the unit's seed, standardised over the layer "
          "(LeverageScorePress)",
          with_wrappers({{"sketch_dimension",
                          "48",
                          "columns of the Gaussian sketch (at most 128); the sketch is drawn "
                          "from the unit's seed, layer and head",
                          {}}}),
          [](const PolicyConfig& c) { return std::make_unique<Leverage>(c); }};
}

}  // namespace kvb::policies
