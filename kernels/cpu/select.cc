// Deterministic top-k / argmin, CPU reference (POLICIES.md "Ties"). Every candidate becomes one
// 64-bit key (score_order_key << 32 | index): distinct indices make the keys distinct, so "the k
// largest keys" is a unique set and the tie rule (higher index kept) falls out of the key itself.
#include "kernels/cpu/select.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "common/error.h"

namespace kvb::kernels::cpu {
namespace {

uint64_t rank_key(const float* scores, int32_t i) {
  return (static_cast<uint64_t>(score_order_key(scores[i])) << 32) | static_cast<uint32_t>(i);
}

// Candidates are the keys of the eligible indices, in increasing index order. Selects the k
// largest keys (nth_element: O(n) on average) and writes their indices in increasing order.
int topk_of_keys(std::vector<uint64_t>& keys, int k, int32_t* out) {
  const int m = static_cast<int>(keys.size());
  if (k <= 0 || m == 0) return 0;
  if (k >= m) {
    for (int j = 0; j < m; ++j) out[j] = static_cast<int32_t>(keys[j] & 0xffffffffu);
    return m;
  }
  std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<uint64_t>());
  for (int j = 0; j < k; ++j) out[j] = static_cast<int32_t>(keys[j] & 0xffffffffu);
  std::sort(out, out + k);
  return k;
}

int topk_range_impl(const float* scores, const uint8_t* eligible, int begin, int end, int k,
                    int32_t* out, std::vector<uint64_t>& keys) {
  keys.clear();
  if (k <= 0 || end <= begin) return 0;
  keys.reserve(end - begin);
  for (int i = begin; i < end; ++i) {
    if (eligible == nullptr || eligible[i]) keys.push_back(rank_key(scores, i));
  }
  return topk_of_keys(keys, k, out);
}

}  // namespace

int select_topk(const float* scores, int n, int k, int32_t* out) {
  KVB_CHECK(n >= 0) << "select_topk: n = " << n;
  std::vector<uint64_t> keys;
  return topk_range_impl(scores, nullptr, 0, n, k, out, keys);
}

int select_topk_range(const float* scores, int begin, int end, int k, int32_t* out) {
  KVB_CHECK(0 <= begin && begin <= end) << "select_topk_range: [" << begin << ", " << end << ")";
  std::vector<uint64_t> keys;
  return topk_range_impl(scores, nullptr, begin, end, k, out, keys);
}

int select_topk_masked(const float* scores, const uint8_t* eligible, int n, int k, int32_t* out) {
  KVB_CHECK(n >= 0) << "select_topk_masked: n = " << n;
  std::vector<uint64_t> keys;
  return topk_range_impl(scores, eligible, 0, n, k, out, keys);
}

void select_topk_rows(const float* scores, int rows, int ld, const int32_t* lengths,
                      const int32_t* k, int32_t* out, int32_t* counts) {
  KVB_CHECK(rows >= 0 && ld >= 0) << "select_topk_rows: rows = " << rows << ", ld = " << ld;
  for (int r = 0; r < rows; ++r) {
    KVB_CHECK(0 <= lengths[r] && lengths[r] <= ld) << "select_topk_rows: row " << r << " length "
                                                   << lengths[r] << " outside [0, " << ld << "]";
  }
#pragma omp parallel if (rows > 1)
  {
    std::vector<uint64_t> keys;
#pragma omp for schedule(dynamic)
    for (int r = 0; r < rows; ++r) {
      const size_t off = static_cast<size_t>(r) * ld;
      counts[r] = topk_range_impl(scores + off, nullptr, 0, lengths[r], k[r], out + off, keys);
    }
  }
}

int select_argmin(const float* scores, const uint8_t* eligible, int n) {
  KVB_CHECK(n >= 0) << "select_argmin: n = " << n;
  int best = -1;
  uint64_t best_key = 0;
  for (int i = 0; i < n; ++i) {
    if (eligible != nullptr && !eligible[i]) continue;
    // The lowest key loses; keys of equal scores grow with the index, so the older one loses.
    const uint64_t key = rank_key(scores, i);
    if (best < 0 || key < best_key) {
      best = i;
      best_key = key;
    }
  }
  return best;
}

}  // namespace kvb::kernels::cpu
