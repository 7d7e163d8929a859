// `random`: seeded uniform eviction (POLICIES.md "Further baselines"; kvpress RandomPress), the
// floor any real policy must beat. After prefill each head keeps a uniformly random
// kv_budget-subset; at each decode step it evicts one uniformly random token. Every draw comes
// from a counter-based generator keyed by (config.seed, layer, global head, step, token
// position), so a unit is reproducible and independent of thread order and of tensor
// parallelism; no state is carried between steps.
#include <algorithm>
#include <cstdint>
#include <utility>

#include "kernels/policies/policies.h"

namespace kvb::policies {
namespace {

// splitmix64's finalizer (Steele et al. 2014): a bijection that mixes every input bit.
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// One 64-bit draw per (seed, layer, head, step, position): a chain of splitmix64 over the fields.
// The chain up to the step is the same for every slot of a head: draw_prefix computes it once,
// draw finishes it per position.
uint64_t draw_prefix(uint64_t seed, int layer, int head, int32_t step) {
  uint64_t x = splitmix64(seed);
  x = splitmix64(x ^ static_cast<uint32_t>(layer));
  x = splitmix64(x ^ static_cast<uint32_t>(head));
  return splitmix64(x ^ static_cast<uint32_t>(step));
}
uint64_t draw(uint64_t prefix, int32_t position) {
  return splitmix64(prefix ^ static_cast<uint32_t>(position));
}

class Random final : public Policy {
 public:
  bool evicts_at_decode() const override { return true; }
  using Policy::Policy;
  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    evict(st.layer, cache, plan);
  }
  void on_decode_layer(const LayerStats& st, const kernels::KvIndex& cache,
                       kernels::EvictionPlan& plan) override {
    evict(st.layer, cache, plan);
  }
  std::unique_ptr<Policy> clone() const override { return std::make_unique<Random>(*this); }

 private:
  // Each over-budget head draws a fresh i.i.d. key per slot and keeps the kv_budget smallest:
  // a uniformly random kv_budget-subset (in decode, with kv_budget + 1 slots, a uniformly random
  // victim). The step is the position of the newest token, so every step draws anew.
  void evict(int layer, const kernels::KvIndex& cache, kernels::EvictionPlan& plan) const {
    const kernels::LayerIndexView view = cache.layer(layer);
    std::vector<std::pair<uint64_t, int32_t>> keys;
    std::vector<int32_t> keep;
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      const int len = cache.length(layer, h);
      if (len <= kv_budget()) continue;
      const int32_t* pos = view.position(h);
      const int32_t step = pos[len - 1];
      // Global head indices: a tensor-parallel rank draws what one device draws for that head.
      const uint64_t prefix = draw_prefix(config().seed, layer, global_head(h), step);
      // Ties between 64-bit draws are practically impossible; the slot index settles them anyway.
      if (len == kv_budget() + 1) {
        // One slot goes (a decode step): the largest (draw, slot) pair, the one nth_element
        // would leave past the kv_budget smallest; a scan instead of a partition and a sort.
        int victim = 0;
        uint64_t largest = draw(prefix, pos[0]);
        for (int s = 1; s < len; ++s) {
          const uint64_t d = draw(prefix, pos[s]);
          if (d >= largest) {  // a later slot wins a tie, as the pair order says
            largest = d;
            victim = s;
          }
        }
        plan.evict(h, victim);
        continue;
      }
      keys.resize(len);
      for (int s = 0; s < len; ++s) keys[s] = {draw(prefix, pos[s]), s};
      std::nth_element(keys.begin(), keys.begin() + kv_budget(), keys.end());
      keep.resize(kv_budget());
      for (int i = 0; i < kv_budget(); ++i) keep[i] = keys[i].second;
      std::sort(keep.begin(), keep.end());
      plan.keep(h, keep);
    }
  }
};

}  // namespace

PolicyInfo random_policy_info() {
  return {"random",
          "seeded uniform eviction after prefill and at each decode step (a floor to beat)",
          {},
          [](const PolicyConfig& c) { return std::make_unique<Random>(c); }};
}

}  // namespace kvb::policies
