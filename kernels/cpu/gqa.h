// GQA reduction: a group's query-head rows into one KV-head row (POLICIES.md "GQA statistics").
// The bits every policy statistic reduces with on the host; kernels/cuda/scores.cu and the
// device policy ops reduce in the same order.
#pragma once

#include <cstddef>

namespace kvb::kernels::cpu {

enum class GqaReduce { kMean, kMax };

// Mean (or max) of a GQA group's query-head rows into one KV-head row: out [len].
// rows: the group's first query head row; row_stride: distance between query-head rows.
// out[s] = rows[s] (+ or max) rows[row_stride + s] ... in increasing g, from rows[s]; mean then
// divides by float(group).
void reduce_gqa(const float* rows, size_t row_stride, int group, int len, GqaReduce how,
                float* out);

}  // namespace kvb::kernels::cpu
