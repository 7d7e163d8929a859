// `window` (Local): keep the most recent kv_budget tokens, after prefill and at every decode step
// (POLICIES.md).
#include "kernels/policies/policies.h"

namespace kvb::policies {
namespace {
class Window final : public Policy {
 public:
  bool evicts_at_decode() const override { return true; }
  using Policy::Policy;
  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    trim(st.layer, cache, plan);
  }
  void on_decode_layer(const LayerStats& st, const kernels::KvIndex& cache,
                       kernels::EvictionPlan& plan) override {
    trim(st.layer, cache, plan);
  }
  std::unique_ptr<Policy> clone() const override { return std::make_unique<Window>(*this); }

 private:
  void trim(int layer, const kernels::KvIndex& cache, kernels::EvictionPlan& plan) const {
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      const int len = cache.length(layer, h);
      if (len > kv_budget()) plan.drop(h, 0, len - kv_budget(), len);  // the oldest go
    }
  }
};
}  // namespace

PolicyInfo window_policy_info() {
  return {"window", "keep the most recent kv_budget tokens (Local attention)", {},
          [](const PolicyConfig& c) { return std::make_unique<Window>(c); }};
}
}  // namespace kvb::policies
