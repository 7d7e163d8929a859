// Model and ModelConfig methods, and the check that a policy has global layers to act on.
#include "workers/engine/model.h"

#include <cmath>

#include "common/error.h"

namespace kvb::engine {

float ModelConfig::softmax_scale() const {
  return attn_scale > 0 ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

void require_policy_layers(const std::string& policy, const std::string& model, int global_layers,
                           int max_window) {
  KVB_USAGE_CHECK(policy == "full" || global_layers > 0)
      << "policy '" << policy << "' on model '" << model << "': every layer of the model slides "
      << "over a window of " << max_window << " tokens, which alone bounds its cache; eviction "
      << "policies act on global layers only, so this policy would run exactly as full. Run only "
      << "full on this model";
}

size_t Model::num_parameters() const {
  size_t n = token_embedding.size() + final_norm.size() + output.size() + blocks_only_params;
  for (const auto& l : layers) {
    n += l.attn_norm.size() + l.wq.size() + l.wk.size() + l.wv.size() + l.bq.size() +
         l.bk.size() + l.bv.size() + l.q_norm.size() + l.k_norm.size() + l.wo.size() +
         l.ffn_norm.size() + l.w_gate.size() + l.w_up.size() + l.w_down.size() +
         l.post_attn_norm.size() + l.post_ffn_norm.size();
  }
  return n;
}

}  // namespace kvb::engine
