// `ada_snapkv` and `ada_pyramidkv` (POLICIES.md `ada_*`; Ada-KV, seed 004, Algorithm 2 plus the
// code's alpha floor): a layer's per-head base (snapkv: kv_budget - w; pyramidkv: the layer's
// pyramid budget) is reallocated across its KV heads by the global top-(h*base) of the pooled
// scores: B_i = round_half_even((1-alpha)*count_i + floor(alpha*base)), capped by the prefix.
// Heads of one layer end with different lengths; no decode eviction.
#include <algorithm>
#include <vector>

#include "kernels/cpu/budget.h"
#include "kernels/policies/policies.h"
#include "kernels/policies/snapkv_family.h"

namespace kvb::policies {
namespace {

class AdaKv final : public SnapKvFamily {
 public:
  AdaKv(const PolicyConfig& c, bool pyramid)
      : SnapKvFamily(c),
        pyramid_(pyramid),
        alpha_(c.options.get_double("alpha", 0.5, 0.0, 1.0)),
        beta_(pyramid ? c.options.get_int("beta", 20, 1, 1 << 20) : 0) {}
  std::unique_ptr<Policy> clone() const override { return std::make_unique<AdaKv>(*this); }

 protected:
  void allocate(int layer, int prompt_len, int w, kernels::KvCache& cache, const PrefixScores& s,
                int32_t* budgets) override {
    int base = kv_budget() - w;
    if (pyramid_) {
      base = kernels::cpu::pyramid_layer_budgets(kv_budget(), w, prompt_len,
                                                 config_.shape.num_layers, beta_)[layer];
    }
    // Ranking ties go to the more recent position (then the lower head): true positions, since
    // a cache that was compressed before holds gaps.
    const int heads = static_cast<int>(s.lengths.size());
    const kernels::LayerKvView view = cache.layer(layer);
    std::vector<int32_t> positions(static_cast<size_t>(heads) * s.ld);  // (heads, ld)
    for (int h = 0; h < heads; ++h) {
      const int32_t* pos = view.position(h);
      std::copy(pos, pos + s.lengths[h], &positions[static_cast<size_t>(h) * s.ld]);
    }
    const kernels::cpu::RaggedScores ragged{s.scores.data(), positions.data(), s.lengths.data(),
                                            heads, s.ld};
    kernels::cpu::ada_head_budgets(ragged, base, alpha_, budgets);
  }

 private:
  bool pyramid_ = false;
  double alpha_ = 0.5;
  int beta_ = 0;
};

ParamDoc alpha_param() {
  return {"alpha",
          "0.5",
          "weight of the uniform floor: B_i = round((1-alpha)*count_i + floor(alpha*base)); "
          "0 gives pure adaptive allocation",
          {}};
}

}  // namespace

PolicyInfo ada_snapkv_policy_info() {
  std::vector<ParamDoc> params = snapkv_score_params();
  params.push_back(alpha_param());
  return {"ada_snapkv",
          "Ada-SnapKV: SnapKV with per-head budgets from the layer's global top-k (Ada-KV)", params,
          [](const PolicyConfig& c) { return std::make_unique<AdaKv>(c, false); }};
}

PolicyInfo ada_pyramidkv_policy_info() {
  std::vector<ParamDoc> params = snapkv_score_params();
  params.push_back(alpha_param());
  params.push_back(
      {"beta", "20", "pyramid steepness: the last layer selects about (kv_budget - w) / beta", {}});
  return {"ada_pyramidkv",
          "Ada-PyramidKV: PyramidKV's per-layer budgets, split over heads by the global top-k "
          "(Ada-KV)",
          params, [](const PolicyConfig& c) { return std::make_unique<AdaKv>(c, true); }};
}

}  // namespace kvb::policies
