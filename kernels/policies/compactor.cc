// `compactor` (kvpress CompactorPress; Chari & Van Durme 2025, "Compactor: Calibrated
// Query-Agnostic KV Cache Compression with Approximate Leverage Scores"): after prefill each KV
// head keeps its first `sink_size_start` and last `sink_size_end` prompt tokens and the kv_budget
// best by blending x leverage + attention over the tokens between: `leverage`'s z-scored sketched
// leverage of their pre-RoPE keys and `noncausal_attn`'s z-scored chunked attention of their own
// queries, both computed over the middle tokens alone (their means, chunks, pooling and z-scores
// see only those, as kvpress slices the prompt before scoring). The protected ends score the
// layer's maximum (kvpress pads with it). `blending` defaults to the budget's compression ratio
// (kvpress's default: the press's compression_ratio; 1 - kv_budget / n for a token budget). The
// sketch is `leverage`'s (the unit's seed, rows in Hugging Face's channel order). Prefill only.
#include <algorithm>
#include <cmath>
#include <optional>

#include "common/error.h"
#include "kernels/policies/compactor_parts.h"
#include "kernels/policies/policies.h"
#include "kernels/policies/scorer.h"

namespace kvb::policies {
namespace {

class Compactor final : public Policy {
 public:
  explicit Compactor(const PolicyConfig& c) : Policy(c), wrap_(c) {
    const PolicyOptions& o = c.options;
    start_ = o.get_int("sink_size_start", 8, 0, 1 << 20);
    end_ = o.get_int("sink_size_end", 4, 0, 1 << 20);
    chunk_ = o.get_int("chunk_size", 256, 1, 1 << 16);
    k_ = o.get_int("sketch_dimension", 48, 1, kernels::ops::kMaxSketch);
    if (o.has("blending")) blending_ = o.get_double("blending", 0.0, -1e6, 1e6);
    fraction_ = c.budget_fraction;
    KVB_USAGE_CHECK(!c.tp || c.tp->size() == 1)
        << "policy compactor: its scores are standardised and padded with the maximum over every "
           "head of a layer, which tensor parallelism splits across ranks; run it without "
           "--gpus-per-worker";
  }
  StatsRequest prefill_request(int) const override {
    return wrap_.request({.pre_rope_keys = true, .pre_rope_queries = true});
  }
  bool decides_with_ops() const override { return true; }

  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    const int budget = wrap_.budget(st.layer, cache, kv_budget());
    if (!wrap_.acts(cache, st.layer, budget)) return;
    KVB_CHECK(st.pre_rope_keys != nullptr && st.pre_rope_queries != nullptr && st.rope != nullptr)
        << "compactor: the engine gave no pre-RoPE keys, queries or RoPE parameters";
    const int heads = cache.shape().num_kv_heads;
    const int n = st.n_new;
    require_whole_prompt("compactor", "keys and queries", st, cache);
    // kvpress's protected ends, and the middle they leave.
    const int left = std::min(start_, n);
    const int right = std::min(end_, std::max(0, n - left));
    const int mid = n - left - right;
    PolicyOps& ops = ops_of(st);
    SlotRows& score = rows_of(score_.rows, ops, SlotType::kF32, 1, heads);
    if (mid == 0) {  // every token protected: equal scores (the budget keeps the most recent)
      ops.resize(score, 0, std::vector<int32_t>(heads, 0));
      ops.resize(score, 0, std::vector<int32_t>(heads, n));
      wrap_.keep(ops, score, 0, st, cache, budget, plan);
      return;
    }
    // Leverage of the middle's keys (`leverage`'s sketch), z-scored, times blending.
    SlotRows& lev = leverage_scores(ops, st, cache, left, mid, k_, config().seed,
                                    tp_rank() * heads, sketch_, lev_);
    const double c = blending_ ? *blending_
                     : fraction_ > 0
                         ? 1.0 - fraction_
                         : 1.0 - static_cast<double>(kv_budget()) / static_cast<double>(n);
    ops.scale(lev, 0, std::vector<int32_t>(heads, 0), static_cast<float>(c));
    // The middle's own chunked non-causal attention (noncausal_attn's score over the middle).
    SlotRows& pooled = noncausal_scores(ops, st, cache, left, mid, chunk_, attn_);
    // blending x leverage + attention (kvpress's order: the product, then the sum), the ends
    // padded with the layer's maximum.
    ops.combine(lev, 0, pooled, 0, Combine::kAdd);
    ops.pad_with_max(lev, 0, left, right, score, 0);
    wrap_.keep(ops, score, 0, st, cache, budget, plan);
  }

  std::unique_ptr<Policy> clone() const override { return std::make_unique<Compactor>(*this); }

 private:
  int start_ = 8, end_ = 4, chunk_ = 256, k_ = 48;
  std::optional<double> blending_;
  double fraction_ = 0;
  ScorerWrappers wrap_;
  std::vector<float> sketch_;
  ScratchRows score_, lev_;
  NonCausalScratch attn_;
};

}  // namespace

PolicyInfo compactor_policy_info() {
  return {
      "compactor",
      "keep the first sink_size_start and last sink_size_end tokens and the kv_budget best by "
      "blending x sketched key leverage + the prompt's own non-causal chunked attention, each "
      "z-scored over the tokens between (CompactorPress)",
      with_wrappers({{"sink_size_start", "8", "first prompt tokens always kept", {}},
                     {"sink_size_end", "4", "last prompt tokens always kept", {}},
                     {"chunk_size", "256", "tokens per chunk of the non-causal attention", {}},
                     {"sketch_dimension",
                      "48",
                      "columns of the Gaussian sketch (at most 128), drawn from the unit's seed",
                      {}},
                     {"blending",
                      "",
                      "the leverage's weight (not given: the budget's compression ratio, kvpress's "
                      "default; 1 - kv_budget / n for a token budget)",
                      {}}}),
      [](const PolicyConfig& c) { return std::make_unique<Compactor>(c); }};
}

}  // namespace kvb::policies
