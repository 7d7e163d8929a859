// The only translation unit that sees the generated header, so that a new revision recompiles
// this file alone (and relinks), not everything that reports it.
#include "harness/git_rev.h"

#include "kvb_git_rev.h"  // generated in the build tree: KVB_GIT_REV

namespace kvb::harness {

const char* git_rev() { return KVB_GIT_REV; }

}  // namespace kvb::harness
