// One style (colour and marker) per policy, fixed by its name across every report (issue 34):
// every registered policy has its own place in results::policy_style_order(), no two share a
// style, `full` keeps its own, and a name kvbench does not know (a user's policy) gets the same
// style every time, never one of kvbench's policies'.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "kernels/policies/policy.h"
#include "results/report.h"

namespace kvb::results {
namespace {

TEST(ReportStyles, EveryRegisteredPolicyHasItsOwnFixedStyle) {
  const std::vector<std::string>& order = policy_style_order();
  std::set<int> seen;
  for (const policies::PolicyInfo& p : policies::policy_registry()) {
    if (p.name == "full") continue;
    EXPECT_NE(std::find(order.begin(), order.end(), p.name), order.end())
        << "policy " << p.name << " has no place in results::policy_style_order(): append it";
    const int i = policy_style_index(p.name);
    EXPECT_TRUE(seen.insert(i).second) << p.name << " shares style " << i;
    EXPECT_LT(i, static_cast<int>(order.size()));
  }
  // Pinned: a policy's style never moves when others are added.
  EXPECT_EQ(policy_style_index("window"), 0);
  EXPECT_EQ(policy_style_index("h2o"), 1);
  EXPECT_EQ(policy_style_index("snapkv"), 4);
  EXPECT_EQ(policy_style_index("lagkv"), 16);
}

TEST(ReportStyles, UnknownNamesHashPastKvbenchsOwn) {
  const int known = static_cast<int>(policy_style_order().size());
  for (const char* name : {"my_method", "h2o_v2", "x", "snapkv "}) {
    const int i = policy_style_index(name);
    EXPECT_GE(i, known) << name;
    EXPECT_LT(i, kPolicyStyles) << name;
    EXPECT_EQ(policy_style_index(name), i) << name;  // the same in every report
  }
}

}  // namespace
}  // namespace kvb::results
