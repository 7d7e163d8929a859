// The policy registry: an explicit, greppable table (STYLE.md), in the order `kvbench ls
// policies` prints.
#include "kernels/policies/policies.h"

namespace kvb::policies {
const std::vector<PolicyInfo>& policy_registry() {
  static const std::vector<PolicyInfo> table = {
      full_policy_info(),
      window_policy_info(),
      h2o_policy_info(),
  };
  return table;
}
}  // namespace kvb::policies
