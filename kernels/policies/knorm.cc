// `knorm` (kvpress KnormPress; Devoto et al. 2024, "A simple and effective L2 norm-based strategy
// for KV cache compression"; POLICIES.md "Further baselines"): after prefill keep the kv_budget
// tokens whose keys have the lowest L2 norm. Norms are of the keys before RoPE, which rotation
// preserves, so equal keys tie exactly; ties keep the more recent. No decode eviction.
#include <cmath>

#include "common/error.h"
#include "kernels/cpu/select.h"
#include "kernels/policies/policies.h"
#include "kernels/ops/policy_ops.h"

namespace kvb::policies {
namespace {

class Knorm final : public Policy {
 public:
  explicit Knorm(const PolicyConfig& c) : Policy(c) {}

  // Decode asks for the keys too, only to keep every slot's norm: a later prefill on top of the
  // cache (a question after compression) compresses again over all retained slots.
  StatsRequest prefill_request(int) const override { return {.pre_rope_keys = true}; }
  StatsRequest decode_request() const override { return {.pre_rope_keys = true}; }
  bool decides_with_ops() const override { return true; }

  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    PolicyOps& ops = ops_of(st);
    SlotRows& score = append_norms(ops, st, cache);
    // Lowest norm first: the state holds -norm; keep_top keeps the higher score, ties the later.
    tops_.clear();
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      const int len = cache.length(st.layer, h);
      if (len <= kv_budget()) continue;
      tops_.push_back({.head = h, .score_head = h, .len = len, .prefix = len, .k = kv_budget()});
    }
    SlotRows* state[] = {&score};
    if (!tops_.empty()) ops.keep_top(score, st.layer, cache, tops_, state, plan);
  }

  void on_decode_layer(const LayerStats& st, const kernels::KvIndex& cache,
                       kernels::EvictionPlan& plan) override {
    (void)plan;  // decode never evicts (the norms only keep up)
    append_norms(ops_of(st), st, cache);
  }

  size_t state_bytes() const override { return norms_.bytes(); }
  std::unique_ptr<Policy> clone() const override { return std::make_unique<Knorm>(*this); }

 private:
  // Appends the (negated) norms of the block's n_new keys to every cache head's state.
  // pre_rope_keys: [n_new, num_kv_heads (the model's), head_dim]; with gqa=expand cache head h
  // holds a copy of model KV head h / (num_heads / num_kv_heads).
  SlotRows& append_norms(PolicyOps& ops, const LayerStats& st, const kernels::KvIndex& cache) {
    KVB_CHECK(st.pre_rope_keys != nullptr) << "knorm: the engine gave no pre-RoPE keys";
    const int model_kv = config().shape.num_kv_heads;
    const int heads = cache.shape().num_kv_heads;
    const int expand = heads == model_kv ? 1 : config().shape.num_heads / model_kv;
    SlotRows& norms = rows_of(norms_, ops, SlotType::kF32, config().shape.num_layers, heads);
    append_negated_key_norms(ops, norms, st, cache, model_kv, expand);
    return norms;
  }

  SlotRowsPtr norms_;  // per slot: -(L2 norm of its pre-RoPE key)
  std::vector<KeepTop> tops_;
};

}  // namespace

PolicyInfo knorm_policy_info() {
  return {"knorm",
          "keep the kv_budget tokens whose pre-RoPE keys have the lowest L2 norm (KnormPress)",
          {},
          [](const PolicyConfig& c) { return std::make_unique<Knorm>(c); }};
}

}  // namespace kvb::policies
