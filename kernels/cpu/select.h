// Deterministic top-k and argmin over f32 scores, the selection step every eviction policy shares
// (POLICIES.md "Ties": ties go to the more recent token, i.e. the higher index, being kept).
// One total order decides everything: a beats b when its score is larger, or the scores are equal
// and its index is higher. NaN ranks below every number (kept last, evicted first); -0 == +0.
#pragma once

#include <cstdint>
#include <cstring>

namespace kvb::kernels::cpu {

// Maps a score to an unsigned key with the same order (larger score -> larger key); NaN -> 0,
// below -inf; -0 and +0 share a key so that their tie is broken by index like any other tie.
// Shared with the CUDA twin (radix select over (key << 32 | index)).
inline uint32_t score_order_key(float score) {
  if (score != score) return 0u;    // NaN
  if (score == 0.0f) score = 0.0f;  // folds -0 into +0
  uint32_t bits;
  std::memcpy(&bits, &score, sizeof bits);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// scores: [n]. Writes the indices of the min(max(k, 0), n) highest-ranked scores to out, in
// increasing index order, and returns how many it wrote (k >= n: all; k <= 0: none).
int select_topk(const float* scores, int n, int k, int32_t* out);

// As select_topk among indices [begin, end) of scores (0 <= begin <= end); out holds absolute
// indices. Policies use it to select within the prefix before a protected recent window.
int select_topk_range(const float* scores, int begin, int end, int k, int32_t* out);

// As select_topk among the indices i with eligible[i] != 0 (eligible: [n], nullable = all).
int select_topk_masked(const float* scores, const uint8_t* eligible, int n, int k, int32_t* out);

// Per-row top-k with per-row lengths and budgets (one KV head per row: SnapKV, Ada-KV).
// scores: [rows, ld]; lengths: [rows] (row r uses its first lengths[r] <= ld entries);
// k: [rows]; out: [rows, ld], row r's first counts[r] entries are its selection in increasing
// index order; counts: [rows] = min(max(k[r], 0), lengths[r]). Rows run in parallel (OpenMP).
void select_topk_rows(const float* scores, int rows, int ld, const int32_t* lengths,
                      const int32_t* k, int32_t* out, int32_t* counts);

// scores: [n]; eligible: [n], nullable = all eligible. Returns the index of the lowest-ranked
// eligible score, i.e. the token to evict: the smallest score, and among equal scores the lower
// index (the older token goes, the more recent stays). Returns -1 when none is eligible.
int select_argmin(const float* scores, const uint8_t* eligible, int n);

}  // namespace kvb::kernels::cpu
