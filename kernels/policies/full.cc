// `full`: no eviction; the reference for every accuracy delta (POLICIES.md).
#include "kernels/policies/policies.h"

namespace kvb::policies {
namespace {
class Full final : public Policy {
 public:
  using Policy::Policy;
  std::unique_ptr<Policy> clone() const override { return std::make_unique<Full>(*this); }
};
}  // namespace

PolicyInfo full_policy_info() {
  PolicyInfo info{"full", "no eviction: every token stays (the reference)", {},
                  [](const PolicyConfig& c) { return std::make_unique<Full>(c); }};
  info.budgeted = false;
  return info;
}
}  // namespace kvb::policies
