// `pyramidkv` (POLICIES.md; PyramidKV as in Ada-KV's code, beta = 20): `snapkv` with per-layer
// budgets decreasing linearly from layer 0 to layer L-1 (kernels/cpu/budget.h
// pyramid_layer_budgets, integer arithmetic as written, so the mean may exceed kv_budget - w);
// every KV head of layer l keeps its top budget_l prefix tokens plus the w window tokens.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/budget.h"
#include "kernels/policies/policies.h"
#include "kernels/policies/snapkv_family.h"

namespace kvb::policies {
namespace {

class PyramidKv final : public SnapKvFamily {
 public:
  explicit PyramidKv(const PolicyConfig& c)
      : SnapKvFamily(c),
        beta_(c.options.get_int("beta", 20, 1, 1 << 20)),
        kvpress_(c.options.get_string("formula", "ada_kv", {"ada_kv", "kvpress"}) == "kvpress") {}
  std::unique_ptr<Policy> clone() const override { return std::make_unique<PyramidKv>(*this); }

 protected:
  void allocate(PolicyOps&, const SlotRows& s, int layer, int prompt_len, int w,
                const kernels::KvIndex&, int32_t* budgets) override {
    // n in the formula is the prompt length: the layer's longest head (all heads are equal
    // after a fresh prefill).
    if (kvpress_) {
      const int b = kvpress_budget(layer, prompt_len) - window();
      for (int h = 0; h < s.heads(); ++h) budgets[h] = std::max(0, b);
      return;
    }
    const std::vector<int32_t> per_layer = kernels::cpu::pyramid_layer_budgets(
        kv_budget(), w, prompt_len, config_.shape.num_layers, beta_);
    for (int h = 0; h < s.heads(); ++h) budgets[h] = per_layer[layer];
  }

 private:
  // kvpress 0.5.5 PyramidKVPress.get_layer_budget, in doubles as Python computes it: the tokens
  // layer `layer` keeps, window included, of an n-token prompt. X = n x (1 - c) with kvpress's
  // compression_ratio c (budget_fraction), or kv_budget for a token budget.
  int kvpress_budget(int layer, int n) const {
    const double kept = config_.budget_fraction > 0 ? n * config_.budget_fraction : kv_budget();
    const double w = window();
    double min_num = kept / beta_;
    double max_num = kept * 2 - min_num;
    if (max_num >= n - w) {
      max_num = n - w;
      min_num = kept * 2 - max_num;
    }
    // Python's round(): halves to even, as nearbyint in the default rounding mode.
    if (!(n >= max_num && max_num >= min_num && min_num >= w)) {
      return std::max(1, static_cast<int>(std::nearbyint(kept)));
    }
    const int layers = config_.shape.num_layers;
    const double steps = layers > 1 ? (max_num - min_num) / (layers - 1) : 0.0;
    return static_cast<int>(std::nearbyint(max_num - layer * steps));
  }

  int beta_ = 20;
  bool kvpress_ = false;
};

}  // namespace

PolicyInfo pyramidkv_policy_info() {
  std::vector<ParamDoc> params = snapkv_score_params();
  params.push_back(
      {"beta", "20", "pyramid steepness: the last layer selects about (kv_budget - w) / beta", {}});
  params.push_back({"formula",
                    "ada_kv",
                    "per-layer budgets: Ada-KV's integer formula, or kvpress PyramidKVPress's "
                    "(floats from the compression_ratio, round(); uniform when its smallest layer "
                    "would hold less than the window)",
                    {"ada_kv", "kvpress"}});
  return {"pyramidkv",
          "PyramidKV: SnapKV with per-layer budgets decreasing linearly over layers (Ada-KV's "
          "formula)",
          params, [](const PolicyConfig& c) { return std::make_unique<PyramidKv>(c); }};
}

}  // namespace kvb::policies
