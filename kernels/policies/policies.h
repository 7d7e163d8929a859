// The registry entries of every policy, one function per file in kernels/policies/.
#pragma once

#include "kernels/policies/policy.h"

namespace kvb::policies {
PolicyInfo full_policy_info();
PolicyInfo window_policy_info();
PolicyInfo h2o_policy_info();
}  // namespace kvb::policies
