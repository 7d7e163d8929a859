// `knorm` (kvpress KnormPress; Devoto et al. 2024, "A simple and effective L2 norm-based strategy
// for KV cache compression"; POLICIES.md "Further baselines"): after prefill keep the kv_budget
// tokens whose keys have the lowest L2 norm. Norms are of the keys before RoPE, which rotation
// preserves, so equal keys tie exactly; ties keep the more recent. No decode eviction.
#include <cmath>

#include "common/error.h"
#include "kernels/cpu/select.h"
#include "kernels/policies/policies.h"
#include "kernels/policies/slot_state.h"

namespace kvb::policies {
namespace {

class Knorm final : public Policy {
 public:
  explicit Knorm(const PolicyConfig& c) : Policy(c), norms_(c.shape.num_layers, cache_kv_heads()) {}

  // Decode asks for the keys too, only to keep every slot's norm: a later prefill on top of the
  // cache (a question after compression) compresses again over all retained slots.
  StatsRequest prefill_request(int) const override { return {.pre_rope_keys = true}; }
  StatsRequest decode_request() const override { return {.pre_rope_keys = true}; }

  void on_prefill_layer(const LayerStats& st, const kernels::KvCache& cache,
                        kernels::EvictionPlan& plan) override {
    const int heads = cache.shape().num_kv_heads;
    std::vector<float> score;
    std::vector<int32_t> keep;
    for (int h = 0; h < heads; ++h) {
      std::vector<float>& norm = append_norms(st, cache, h);
      const int len = cache.length(st.layer, h);
      if (len <= kv_budget()) continue;
      // Lowest norm first: score = -norm; select_topk keeps the higher score, ties the later slot.
      score.resize(len);
      for (int s = 0; s < len; ++s) score[s] = -norm[s];
      keep.resize(len);
      keep.resize(kernels::cpu::select_topk(score.data(), len, kv_budget(), keep.data()));
      compact(norm, keep);
      plan.keep(h, keep);
    }
  }

  void on_decode_layer(const LayerStats& st, const kernels::KvCache& cache,
                       kernels::EvictionPlan& plan) override {
    (void)plan;  // decode never evicts (the norms only keep up)
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) append_norms(st, cache, h);
  }

  size_t state_bytes() const override { return norms_.bytes(); }
  std::unique_ptr<Policy> clone() const override { return std::make_unique<Knorm>(*this); }

 private:
  // Appends the norms of the block's n_new keys to cache head h's state and returns it.
  // pre_rope_keys: [n_new, num_kv_heads (the model's), head_dim]; with gqa=expand cache head h
  // holds a copy of model KV head h / (num_heads / num_kv_heads).
  std::vector<float>& append_norms(const LayerStats& st, const kernels::KvCache& cache, int h) {
    KVB_CHECK(st.pre_rope_keys != nullptr) << "knorm: the engine gave no pre-RoPE keys";
    const int model_kv = config().shape.num_kv_heads;
    const int d = cache.shape().head_dim;
    const int src =
        cache.shape().num_kv_heads == model_kv ? h : h / (config().shape.num_heads / model_kv);
    const int len = cache.length(st.layer, h);
    const int before = len - st.n_new;
    std::vector<float>& norm = norms_.at(st.layer, h);
    if (before == 0) norm.clear();  // a fresh cache (the policy may serve several sequences)
    KVB_ASSERT(static_cast<int>(norm.size()) == before);
    for (int t = 0; t < st.n_new; ++t) {
      const float* k = st.pre_rope_keys + (static_cast<size_t>(t) * model_kv + src) * d;
      double sum = 0;  // f32 keys, squares accumulated in f64
      for (int i = 0; i < d; ++i) sum += static_cast<double>(k[i]) * k[i];
      norm.push_back(static_cast<float>(std::sqrt(sum)));
    }
    return norm;
  }

  SlotState<float> norms_;  // per slot: L2 norm of its pre-RoPE key
};

}  // namespace

PolicyInfo knorm_policy_info() {
  return {"knorm",
          "keep the kv_budget tokens whose pre-RoPE keys have the lowest L2 norm (KnormPress)",
          {},
          [](const PolicyConfig& c) { return std::make_unique<Knorm>(c); }};
}

}  // namespace kvb::policies
