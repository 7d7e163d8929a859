// SnapKV-family score options (POLICIES.md `snapkv`). The scores (window reduce per query head,
// GQA reduce into the KV head before pooling, as the Ada-KV gqa_support code averages the
// window-mean scores of a group, then pool1d over the head's own prefix) are the ops table's
// window_scores: kernels/ops/cpu_policy_ops.cc and kernels/cuda/cuda_policy_ops.cu.
#include "kernels/policies/snapkv_scores.h"

#include "common/error.h"

namespace kvb::policies {

SnapKvScoreOptions read_snapkv_score_options(const PolicyOptions& o) {
  SnapKvScoreOptions s;
  s.pool_kernel = o.get_int("pool_kernel", 7, 1, 1023);
  KVB_USAGE_CHECK(s.pool_kernel % 2 == 1)
      << "policy option pool_kernel=" << s.pool_kernel
      << " must be odd (same padding), e.g. 1 (no pooling), 3, 5 or 7";
  s.pooling = o.get_string("pooling", "max", {"max", "avg"}) == "avg"
                  ? kernels::cpu::PoolKind::kAvg
                  : kernels::cpu::PoolKind::kMax;
  s.window_reduce = o.get_string("window_reduce", "mean", {"mean", "sum"}) == "sum"
                        ? WindowReduce::kSum
                        : WindowReduce::kMean;
  s.gqa_reduce = o.get_string("gqa_reduce", "mean", {"mean", "max"}) == "max" ? GqaReduce::kMax
                                                                              : GqaReduce::kMean;
  return s;
}

std::vector<ParamDoc> snapkv_score_params() {
  return {
      {"window",
       "32",
       "observation window w inside the budget; effective w = max(1, min(window, kv_budget/2))",
       {}},
      {"pool_kernel", "7", "1-D pooling kernel over token scores (odd; 1: no pooling)", {}},
      {"pooling", "max", "pooling kind (stride 1, same padding)", {"max", "avg"}},
      {"window_reduce", "mean", "how the w window queries combine", {"mean", "sum"}},
      {"gqa_reduce",
       "mean",
       "how a KV head's score combines its query heads (before pooling)",
       {"mean", "max"}},
  };
}

}  // namespace kvb::policies
