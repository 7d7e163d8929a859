// `pyramidkv` (POLICIES.md; PyramidKV as in Ada-KV's code, beta = 20): `snapkv` with per-layer
// budgets decreasing linearly from layer 0 to layer L-1 (kernels/cpu/budget.h
// pyramid_layer_budgets, integer arithmetic as written, so the mean may exceed kv_budget - w);
// every KV head of layer l keeps its top budget_l prefix tokens plus the w window tokens.
#include "kernels/cpu/budget.h"
#include "kernels/policies/policies.h"
#include "kernels/policies/snapkv_family.h"

namespace kvb::policies {
namespace {

class PyramidKv final : public SnapKvFamily {
 public:
  explicit PyramidKv(const PolicyConfig& c)
      : SnapKvFamily(c), beta_(c.options.get_int("beta", 20, 1, 1 << 20)) {}
  std::unique_ptr<Policy> clone() const override { return std::make_unique<PyramidKv>(*this); }

 protected:
  void allocate(PolicyOps&, const SlotRows& s, int layer, int prompt_len, int w,
                const kernels::KvCache&, int32_t* budgets) override {
    // n in the formula is the prompt length: the layer's longest head (all heads are equal
    // after a fresh prefill).
    const std::vector<int32_t> per_layer = kernels::cpu::pyramid_layer_budgets(
        kv_budget(), w, prompt_len, config_.shape.num_layers, beta_);
    for (int h = 0; h < s.heads(); ++h) budgets[h] = per_layer[layer];
  }

 private:
  int beta_ = 20;
};

}  // namespace

PolicyInfo pyramidkv_policy_info() {
  std::vector<ParamDoc> params = snapkv_score_params();
  params.push_back(
      {"beta", "20", "pyramid steepness: the last layer selects about (kv_budget - w) / beta", {}});
  return {"pyramidkv",
          "PyramidKV: SnapKV with per-layer budgets decreasing linearly over layers (Ada-KV's "
          "formula)",
          params, [](const PolicyConfig& c) { return std::make_unique<PyramidKv>(c); }};
}

}  // namespace kvb::policies
