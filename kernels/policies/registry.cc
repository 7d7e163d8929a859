// The policy registry: an explicit, greppable table (STYLE.md), in the order `kvbench ls
// policies` prints.
#include "kernels/policies/policies.h"

namespace kvb::policies {
const std::vector<PolicyInfo>& policy_registry() {
  static const std::vector<PolicyInfo> table = {
      full_policy_info(),
      window_policy_info(),
      h2o_policy_info(),
      subgen_policy_info(),
      subgen_kcenter_policy_info(),
      snapkv_policy_info(),
      pyramidkv_policy_info(),
      ada_snapkv_policy_info(),
      ada_pyramidkv_policy_info(),
      streaming_llm_policy_info(),
      scissorhands_policy_info(),
      tova_policy_info(),
      knorm_policy_info(),
      random_policy_info(),
      python_policy_info(),
  };
  return table;
}
}  // namespace kvb::policies
