// Runs the kvbench CLI in this process, the way `kvbench ARGS...` would, with stdout and stderr
// captured (tests of subcommands that print tables or errors).
#pragma once

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "harness/cli.h"

namespace kvb::testing {

// Returns the exit code; *out and *err get what was printed (when given).
inline int kvbench(std::vector<std::string> args, std::string* out = nullptr,
                   std::string* err = nullptr) {
  args.insert(args.begin(), "kvbench");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  std::ostringstream o, e;
  std::streambuf* old_out = std::cout.rdbuf(o.rdbuf());
  std::streambuf* old_err = std::cerr.rdbuf(e.rdbuf());
  const int rc = harness::run_cli(static_cast<int>(argv.size()), argv.data());
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  if (out) *out = o.str();
  if (err) *err = e.str();
  return rc;
}

}  // namespace kvb::testing
