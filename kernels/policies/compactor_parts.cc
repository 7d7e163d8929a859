#include "kernels/policies/compactor_parts.h"

#include "kernels/cpu/sketch.h"

namespace kvb::policies {

SlotRows& noncausal_scores(PolicyOps& ops, const LayerStats& st, const kernels::KvIndex& cache,
                           int first, int count, int chunk, NonCausalScratch& scratch) {
  const int heads = cache.shape().num_kv_heads, group = st.num_heads / heads;
  SlotRows& sums = rows_of(scratch.sums.rows, ops, SlotType::kF32, 1, st.num_heads);
  ops.chunk_attention_sums(sums, 0, cache, st.layer, st, first, count, chunk);
  SlotRows* score = &sums;
  if (group > 1) {
    SlotRows& reduced = rows_of(scratch.reduced.rows, ops, SlotType::kF32, 1, heads);
    ops.reduce_heads(sums, 0, group, GqaReduce::kMean, reduced, 0);
    score = &reduced;
  }
  SlotRows& norms = rows_of(scratch.norms.rows, ops, SlotType::kF32, 1, heads);
  ops.cache_norms(norms, 0, cache, st.layer, CacheRows::kValues, /*squared=*/false);
  SlotRows* range_norms = &norms;
  if (first > 0 || count < cache.length(st.layer, 0)) {  // the range's own norms
    range_norms = &rows_of(scratch.range_norms.rows, ops, SlotType::kF32, 1, heads);
    ops.slice(norms, 0, first, count, *range_norms, 0);
  }
  ops.combine(*score, 0, *range_norms, 0, Combine::kMul);
  SlotRows& pooled = rows_of(scratch.pooled.rows, ops, SlotType::kF32, 1, heads);
  ops.pool(*score, 0, pooled, 0, 3, kernels::cpu::PoolKind::kAvg);
  ops.standardize(pooled, 0);
  return pooled;
}

SlotRows& leverage_scores(PolicyOps& ops, const LayerStats& st, const kernels::KvIndex& cache,
                          int first, int count, int k, uint64_t seed, int first_head,
                          std::vector<float>& sketch, ScratchRows& rows) {
  const int heads = cache.shape().num_kv_heads, d = cache.shape().head_dim;
  const bool adjacent = st.rope && st.rope->style == kernels::cpu::RopeStyle::kNorm;
  sketch = kernels::cpu::key_sketches(seed, st.layer, first_head, heads, d, k, adjacent,
                                      st.rope ? st.rope->rot_dim : 0);
  SlotRows& score = rows_of(rows.rows, ops, SlotType::kF32, 1, heads);
  ops.leverage_scores(score, 0, st, heads, d, first, count, sketch.data(), k);
  ops.standardize(score, 0);
  return score;
}

}  // namespace kvb::policies
