// The policy registry: an explicit, greppable table (STYLE.md), in the order `kvbench ls
// policies` prints, followed by the policies a build compiles in from outside the tree
// (extra_policies.h; empty unless CMake's KVBENCH_EXTRA_POLICIES names folders).
#include <algorithm>

#include "common/error.h"
#include "kernels/policies/extra_policies.h"
#include "kernels/policies/policies.h"

namespace kvb::policies {
const std::vector<PolicyInfo>& policy_registry() {
  static const std::vector<PolicyInfo> table = append_extra_policies(
      {
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
          keydiff_policy_info(),
          observed_attention_policy_info(),
          cur_policy_info(),
          lagkv_policy_info(),
          expected_attention_policy_info(),
          noncausal_attn_policy_info(),
          leverage_policy_info(),
          compactor_policy_info(),
          qfilter_policy_info(),
          finch_policy_info(),
          kvzip_policy_info(),
          think_policy_info(),
          simlayerkv_policy_info(),
          duo_attention_policy_info(),
          python_policy_info(),
      },
      extra_policies());
  return table;
}

std::vector<PolicyInfo> append_extra_policies(std::vector<PolicyInfo> table,
                                              std::span<const ExtraPolicy> extras) {
  const size_t builtin = table.size();
  std::vector<const char*> sources(builtin, nullptr);  // per entry: its extra's file, or none
  for (const ExtraPolicy& x : extras) {
    PolicyInfo info = x.info();
    const bool snake =
        !info.name.empty() && std::all_of(info.name.begin(), info.name.end(), [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
        });
    KVB_USAGE_CHECK(snake) << "extra policy file " << x.source << ": its policy name '" << info.name
                           << "' must be snake_case ([a-z0-9_]+), as every policy name";
    KVB_USAGE_CHECK(info.make != nullptr) << "extra policy file " << x.source << ": policy '"
                                          << info.name << "' has no make function";
    for (size_t i = 0; i < table.size(); ++i) {
      if (table[i].name != info.name) continue;
      KVB_USAGE_FAIL() << "extra policy file " << x.source << " registers the policy name '"
                       << info.name << "', which "
                       << (sources[i]
                               ? std::string("extra policy file ") + sources[i] + " registers too"
                               : std::string("is a built-in policy "
                                             "(kernels/policies/registry.cc)"))
                       << "; rename it in its PolicyInfo";
    }
    table.push_back(std::move(info));
    sources.push_back(x.source);
  }
  return table;
}

}  // namespace kvb::policies
