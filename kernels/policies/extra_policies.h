// Policies compiled in from outside the tree (CMake option KVBENCH_EXTRA_POLICIES; the guide in
// kernels/policies/README.md). Each *.cc of the named folders defines
// `kvb::policies::PolicyInfo <stem>_policy_info()` (stem: the file name without .cc); CMake writes
// the list of those functions into the build tree (generated/extra_policies.cc, by
// cmake/extra_policies.cmake), and the registry appends it after the built-in table: an explicit
// list, no static-init registration (STYLE.md). Without the option the list is empty.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "kernels/policies/policy.h"

namespace kvb::policies {

struct ExtraPolicy {
  const char* source = nullptr;    // the .cc file it was compiled from (absolute; for messages)
  PolicyInfo (*info)() = nullptr;  // that file's <stem>_policy_info
};

// make_policy's validation (budget, options against the entry's ParamDocs) for a given entry,
// registered or not (config.name must be info.name): what the tests of a policy use where this
// build's registry does not list it (kernels/policies/README.md "The laws").
std::unique_ptr<Policy> make_policy(const PolicyInfo& info, const PolicyConfig& config);

// This build's extra policies, in the order of KVBENCH_EXTRA_POLICIES (folders) and file names.
std::span<const ExtraPolicy> extra_policies();

// `table` followed by every extra's entry. A usage error naming the source file (and, for a
// clash, the other entry) when an extra's name is not snake_case ([a-z0-9_]+), is a name already
// in the table or another extra's, or the entry has no `make`.
std::vector<PolicyInfo> append_extra_policies(std::vector<PolicyInfo> table,
                                              std::span<const ExtraPolicy> extras);

}  // namespace kvb::policies
