// `kvbench ls policies`: the registered names with a line of description and their options.
#include <boost/program_options.hpp>
#include <iostream>

#include "common/error.h"
#include "harness/cli.h"
#include "kernels/policies/policy.h"

namespace kvb::harness {

int cmd_ls(const std::vector<std::string>& args) {
  const std::string usage =
      "usage: kvbench ls policies\n\n"
      "Lists the registered eviction policies: name, description, and each option with its\n"
      "default (set options with --policy-opt key=value).\n";
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << usage;
    return args.empty() ? 2 : 0;
  }
  KVB_USAGE_CHECK(args.size() == 1) << "unexpected argument '" << args[1] << "'\n" << usage;
  KVB_USAGE_CHECK(args[0] == "policies") << "kvbench ls: unknown list '" << args[0]
                                         << "'; available: policies";
  for (const auto& p : policies::policy_registry()) {
    std::cout << p.name << "\n    " << p.description << "\n";
    std::vector<policies::ParamDoc> all = p.params;
    all.insert(all.end(), policies::common_params().begin(), policies::common_params().end());
    for (const auto& d : all) {
      std::cout << "    --policy-opt " << d.name << "=" << d.default_value << "  " << d.description;
      if (!d.choices.empty()) {
        std::cout << " [";
        for (size_t i = 0; i < d.choices.size(); ++i) std::cout << (i ? "|" : "") << d.choices[i];
        std::cout << "]";
      }
      std::cout << "\n";
    }
  }
  return 0;
}

}  // namespace kvb::harness
