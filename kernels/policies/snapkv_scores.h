// The options of the SnapKV family's observation-window scores (POLICIES.md `snapkv`, "GQA
// statistics"; SnapKV and the Ada-KV code): from the last w prompt queries' probabilities, per KV
// head, the columns of the prefix keys (every slot before the window) reduced over the w queries,
// then over the group's query heads, then pooled along the token axis. The scores themselves are
// the ops table's window_scores (kernels/ops/policy_ops.h), on the host or on a device.
#pragma once

#include <vector>

#include "kernels/policies/policy.h"

namespace kvb::policies {

// The scores' options are the ops' (kernels/ops/policy_ops.h WindowScoreOptions).
using SnapKvScoreOptions = WindowScoreOptions;

// Reads pool_kernel, pooling, window_reduce and gqa_reduce (usage errors name what is allowed).
SnapKvScoreOptions read_snapkv_score_options(const PolicyOptions& options);
// The documentation of those four options plus `window`, shared by every family member.
std::vector<ParamDoc> snapkv_score_params();

}  // namespace kvb::policies
