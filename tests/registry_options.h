// The options a test gives a registered policy when it runs every entry of the registry
// (policies::policy_registry()): none, except for policies that cannot be made without one.
// `python` needs its script: the example H2O (attention sums, per-head keep), so a registry loop
// runs a Python scorer through the same path as the native ones. One place for this knowledge:
// a new policy with a required option adds its line here.
#pragma once

#include <map>
#include <string>

namespace kvb::testing_registry {

inline std::map<std::string, std::string> required_options(const std::string& policy) {
  if (policy == "python") return {{"file", std::string(KVB_EXAMPLES_DIR) + "/policies/h2o.py"}};
  return {};
}

}  // namespace kvb::testing_registry
