// SnapKV-family prefix scores (POLICIES.md `snapkv`, "GQA statistics"): window reduce per query
// head, GQA reduce into the KV head (before pooling, as the Ada-KV gqa_support code averages the
// window-mean scores of a group), then pool1d over the head's own prefix.
#include "kernels/policies/snapkv_scores.h"

#include <algorithm>

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

PrefixScores snapkv_prefix_scores(const LayerStats& st, const kernels::KvCache& cache,
                                  const SnapKvScoreOptions& opt) {
  const int kv_heads = cache.shape().num_kv_heads;
  const int w = st.last_w;
  KVB_CHECK(st.last_probs != nullptr && w >= 1)
      << "SnapKV scoring needs the last-w probabilities (last_w = " << w << ")";
  KVB_CHECK(st.num_heads % kv_heads == 0)
      << st.num_heads << " query heads do not group into " << kv_heads << " KV heads";
  const int group = st.num_heads / kv_heads;

  PrefixScores out;
  out.lengths.resize(kv_heads);
  for (int h = 0; h < kv_heads; ++h) {
    const int len = cache.length(st.layer, h);
    KVB_CHECK(len <= st.stride) << "head " << h << " holds " << len << " slots, stats stride "
                                << st.stride;
    out.lengths[h] = std::max(0, len - w);
    out.ld = std::max(out.ld, out.lengths[h]);
  }
  out.scores.assign(static_cast<size_t>(kv_heads) * out.ld, 0.0f);
  if (out.ld == 0) return out;

  std::vector<float> per_query(static_cast<size_t>(group) * out.ld);  // (group, ld)
  std::vector<float> reduced(out.ld);
  for (int h = 0; h < kv_heads; ++h) {
    const int prefix = out.lengths[h];
    if (prefix == 0) continue;
    // Window reduce for each query head of the group: (group, prefix).
    for (int g = 0; g < group; ++g) {
      const float* probs =
          st.last_probs + static_cast<size_t>(h * group + g) * w * st.stride;  // (w, stride)
      float* row = &per_query[static_cast<size_t>(g) * out.ld];
      std::fill(row, row + prefix, 0.0f);
      for (int a = 0; a < w; ++a) {
        const float* p = probs + static_cast<size_t>(a) * st.stride;
        for (int j = 0; j < prefix; ++j) row[j] += p[j];
      }
      if (opt.window_reduce == WindowReduce::kMean) {
        // Divide (not multiply by 1/w) so that mean equals torch's .mean rounding.
        for (int j = 0; j < prefix; ++j) row[j] /= static_cast<float>(w);
      }
    }
    reduce_gqa(per_query.data(), out.ld, group, prefix, opt.gqa_reduce, reduced.data());
    kernels::cpu::pool1d(reduced.data(), &out.scores[static_cast<size_t>(h) * out.ld], 1, prefix,
                         opt.pool_kernel, opt.pooling);
  }
  return out;
}

}  // namespace kvb::policies
