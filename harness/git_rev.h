// The git revision this binary was built from (cmake/git_rev.cmake, run at every build):
// a 12-digit short hash, with "-dirty" when tracked files differed from that commit, or
// "unknown" outside a git work tree. Recorded in every run's provenance (runs.git_rev).
#pragma once

namespace kvb::harness {

const char* git_rev();

}  // namespace kvb::harness
