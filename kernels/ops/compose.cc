// Compositions of the policy ops vocabulary (policy_ops.h): written once against the table.
#include <algorithm>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/budget.h"
#include "kernels/ops/policy_ops.h"

namespace kvb::kernels::ops {

kernels::LayerKvView host_layer(PolicyOps& ops, const kernels::KvIndex& cache, int layer,
                                kernels::KvCache* scratch) {
  const kernels::KvCache& storage = kernels::storage_of(cache);
  KVB_CHECK(layer >= 0 && layer < cache.shape().num_layers)
      << "host_layer: layer " << layer << " of " << cache.shape().num_layers;
  if (storage.host_rows()) return storage.rows_f32(layer);
  KVB_CHECK(scratch != nullptr) << "host_layer: a device's rows need a scratch cache to land in";
  const int heads = cache.shape().num_kv_heads, d = cache.shape().head_dim;
  int longest = 0;
  for (int h = 0; h < heads; ++h) longest = std::max(longest, cache.length(layer, h));
  *scratch = kernels::KvCache({1, heads, d}, longest);
  for (int h = 0; h < heads; ++h) {
    const int len = cache.length(layer, h);
    const std::vector<float> k = ops.read_cache_rows(cache, layer, h, 0, len, CacheRows::kKeys);
    const std::vector<float> v = ops.read_cache_rows(cache, layer, h, 0, len, CacheRows::kValues);
    const int32_t* pos = cache.layer(layer).position(h);
    for (int s = 0; s < len; ++s) {
      scratch->append(0, h, &k[static_cast<size_t>(s) * d], &v[static_cast<size_t>(s) * d],
                      pos[s]);
    }
  }
  return scratch->rows_f32(0);
}

void use_window(const WindowProbs& probs, LayerStats* st) {
  st->last_probs = probs.data();
  st->last_w = probs.w();
  st->stride = probs.stride();
}

void window_scores(PolicyOps& ops, SlotRows& scores, int score_layer, WindowScratch& scratch,
                   const LayerStats& st, const kernels::KvIndex& cache,
                   const WindowScoreOptions& opt) {
  const int kv_heads = cache.shape().num_kv_heads;
  const int w = st.last_w;
  KVB_CHECK(st.last_probs != nullptr && w >= 1)
      << "SnapKV scoring needs the last-w probabilities (last_w = " << w << ")";
  KVB_CHECK(kv_heads >= 1 && st.num_heads % kv_heads == 0)
      << st.num_heads << " query heads do not group into " << kv_heads << " KV heads";
  KVB_CHECK(scores.type() == SlotType::kF32 && scores.heads() == kv_heads)
      << "window scores: " << scores.heads() << " rows for " << kv_heads << " cache heads";
  KVB_CHECK(opt.pool_kernel >= 1 && opt.pool_kernel % 2 == 1)
      << "window scores: pool kernel " << opt.pool_kernel << " must be odd and >= 1";
  ops.require_own(scores);
  const int group = st.num_heads / kv_heads;
  std::vector<int32_t> lengths(st.num_heads);  // each query head sums its KV head's prefix
  for (int h = 0; h < kv_heads; ++h) {
    const int len = cache.length(st.layer, h);
    KVB_CHECK(len <= st.stride) << "head " << h << " holds " << len << " slots, stats stride "
                                << st.stride;
    std::fill_n(lengths.begin() + static_cast<size_t>(h) * group, group, std::max(0, len - w));
  }
  // Scratch made by these ops for these shapes (remade when a call brings others).
  auto fit = [&](SlotRowsPtr& rows, int heads) -> SlotRows& {
    if (!rows || rows->heads() != heads) {
      rows = SlotRowsPtr(ops.make_rows(SlotType::kF32, 1, heads));
    }
    ops.require_own(*rows);
    return *rows;
  };
  SlotRows& per_query = fit(scratch.per_query, st.num_heads);
  SlotRows& reduced = fit(scratch.reduced, kv_heads);
  ops.window_sum(per_query, 0, st, lengths, opt.window_reduce, opt.queries);
  ops.reduce_heads(per_query, 0, group, opt.gqa_reduce, reduced, 0);
  ops.pool(reduced, 0, scores, score_layer, opt.pool_kernel, opt.pooling);
}

void window_scores(PolicyOps& ops, SlotRows& scores, int score_layer, const LayerStats& st,
                   const kernels::KvIndex& cache, const WindowScoreOptions& options) {
  WindowScratch scratch;
  window_scores(ops, scores, score_layer, scratch, st, cache, options);
}

void append_negated_key_norms(PolicyOps& ops, SlotRows& rows, const LayerStats& st,
                              const kernels::KvIndex& cache, int model_kv_heads, int expand) {
  KVB_CHECK(st.pre_rope_keys != nullptr) << "knorm: the engine gave no pre-RoPE keys";
  const int heads = cache.shape().num_kv_heads;
  KVB_CHECK(rows.heads() == heads) << "key norms: " << rows.heads() << " rows for " << heads
                                   << " cache heads";
  std::vector<int32_t> before(heads);
  for (int h = 0; h < heads; ++h) {
    before[h] = cache.length(st.layer, h) - st.n_new;
    KVB_CHECK(before[h] >= 0) << "key norms: head " << h << " holds "
                              << cache.length(st.layer, h) << " slots, the block " << st.n_new;
  }
  ops.require_own(rows);
  ops.append_norms(rows, st.layer, before, st.pre_rope_keys, st.n_new, model_kv_heads,
                   cache.shape().head_dim, expand);
  ops.scale(rows, st.layer, before, -1.0f);
}

void negated_popcount(PolicyOps& ops, const SlotRows& bits, int layer, SlotRows& out,
                      int out_layer) {
  ops.popcount(bits, layer, out, out_layer);
  const std::vector<int32_t> from_start(out.heads(), 0);
  ops.scale(out, out_layer, from_start, -1.0f);
}

std::vector<int32_t> ada_head_budgets(PolicyOps& ops, const SlotRows& scores, int score_layer,
                                      const kernels::KvIndex& cache, int layer, int base,
                                      double alpha) {
  KVB_CHECK(base >= 0) << "ada base budget = " << base;
  const int heads = scores.heads();
  const std::vector<int32_t> counts = ops.count_top_across_heads(
      scores, score_layer, cache, layer, static_cast<int64_t>(heads) * base);
  std::vector<int32_t> lengths(heads), budgets(heads);
  for (int h = 0; h < heads; ++h) lengths[h] = scores.length(score_layer, h);
  cpu::ada_budgets_from_counts(counts.data(), lengths.data(), heads, base, alpha, budgets.data());
  return budgets;
}

}  // namespace kvb::kernels::ops
