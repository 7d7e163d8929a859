// Budget allocation arithmetic (POLICIES.md "Integer budgets", `pyramidkv`, `ada_*`), host
// reference. The Ada-KV global top-k ranks (score, position, head) triples with one comparator so
// that the CUDA and multi-GPU versions have a single order to reproduce.
#include "kernels/cpu/budget.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/select.h"

namespace kvb::kernels::cpu {

HeavyRecentSplit split_heavy_recent(int kv_budget, double heavy_fraction) {
  KVB_USAGE_CHECK(kv_budget >= 0) << "kv_budget must be >= 0, got " << kv_budget;
  KVB_USAGE_CHECK(heavy_fraction >= 0.0 && heavy_fraction <= 1.0)
      << "heavy_fraction must be in [0, 1], got " << heavy_fraction;
  HeavyRecentSplit s;
  s.heavy = static_cast<int>(std::floor(static_cast<double>(kv_budget) * heavy_fraction));
  s.recent = kv_budget - s.heavy;
  return s;
}

ScissorhandsSplit scissorhands_split(int kv_budget) {
  KVB_USAGE_CHECK(kv_budget >= 2)
      << "scissorhands needs kv_budget >= 2 (drop = floor(B/2) must be >= 1), got " << kv_budget;
  ScissorhandsSplit s;
  s.recent = std::min(32, kv_budget / 4);
  s.drop = kv_budget / 2;
  return s;
}

int snapkv_window(int kv_budget, int window) {
  KVB_USAGE_CHECK(kv_budget >= 1) << "kv_budget must be >= 1, got " << kv_budget;
  KVB_USAGE_CHECK(window >= 1) << "window must be >= 1, got " << window;
  return std::max(1, std::min(window, kv_budget / 2));
}

KCenterSplit subgen_kcenter_split(int kv_budget, int recent) {
  KVB_USAGE_CHECK(kv_budget >= 0) << "kv_budget must be >= 0, got " << kv_budget;
  if (recent < 0) recent = kv_budget / 2;
  KVB_USAGE_CHECK(recent <= kv_budget)
      << "recent (" << recent << ") must not exceed kv_budget (" << kv_budget << ")";
  KCenterSplit s;
  s.recent = recent;
  s.centres = kv_budget - recent;
  return s;
}

std::vector<int32_t> pyramid_layer_budgets(int kv_budget, int window, int prompt_len,
                                           int num_layers, int beta) {
  KVB_USAGE_CHECK(num_layers >= 1) << "num_layers must be >= 1, got " << num_layers;
  KVB_USAGE_CHECK(beta >= 1) << "pyramid beta must be >= 1, got " << beta;
  KVB_USAGE_CHECK(window >= 0 && window <= kv_budget)
      << "window " << window << " must be in [0, kv_budget = " << kv_budget << "]";
  KVB_CHECK(prompt_len >= 0) << "prompt_len = " << prompt_len;
  const int prefix = std::max(0, prompt_len - window);
  if (prompt_len <= kv_budget) {
    // No compression (POLICIES.md `snapkv`): the whole prefix stays in every layer.
    return std::vector<int32_t>(num_layers, prefix);
  }
  // Here prefix = n - w > base >= 0, so every quantity below is >= 0 and C++ '/' equals the
  // reference's floor division.
  const int base = kv_budget - window;
  int min_budget = base / beta;
  int max_budget = 2 * base - min_budget;
  if (max_budget >= prefix) {
    max_budget = prefix;
    min_budget = 2 * base - max_budget;
  }
  const int step = num_layers > 1 ? (max_budget - min_budget) / (num_layers - 1) : 0;
  KVB_ASSERT(min_budget >= 0 && step >= 0) << "min " << min_budget << " step " << step;
  std::vector<int32_t> budgets(num_layers);
  for (int l = 0; l < num_layers; ++l) budgets[l] = max_budget - l * step;
  return budgets;
}

namespace {

// One (head, slot) entry of the Ada-KV global ranking; `better` is the total order.
struct RankedEntry {
  uint32_t score_key;
  int32_t position;
  int32_t head;
};

bool better(const RankedEntry& a, const RankedEntry& b) {
  if (a.score_key != b.score_key) return a.score_key > b.score_key;
  if (a.position != b.position) return a.position > b.position;
  return a.head < b.head;
}

void check_ragged(const RaggedScores& s) {
  KVB_CHECK(s.num_heads >= 0 && s.ld >= 0)
      << "RaggedScores: num_heads = " << s.num_heads << ", ld = " << s.ld;
  for (int h = 0; h < s.num_heads; ++h) {
    KVB_CHECK(0 <= s.lengths[h] && s.lengths[h] <= s.ld)
        << "RaggedScores: head " << h << " length " << s.lengths[h] << " outside [0, " << s.ld
        << "]";
  }
}

// Round half to even, written out so that it does not depend on the FP rounding mode.
float round_half_even(float x) {
  const float f = std::floor(x);
  const float d = x - f;  // exact: x and f share an exponent range
  if (d > 0.5f) return f + 1.0f;
  if (d < 0.5f) return f;
  return std::fmod(f, 2.0f) == 0.0f ? f : f + 1.0f;
}

}  // namespace

void global_topk_counts(const RaggedScores& s, int k, int32_t* counts) {
  check_ragged(s);
  std::fill(counts, counts + s.num_heads, 0);
  if (k <= 0) return;
  std::vector<RankedEntry> entries;
  for (int h = 0; h < s.num_heads; ++h) {
    const size_t row = static_cast<size_t>(h) * s.ld;
    for (int j = 0; j < s.lengths[h]; ++j) {
      const int32_t pos = s.positions ? s.positions[row + j] : j;
      entries.push_back({score_order_key(s.scores[row + j]), pos, h});
    }
  }
  const size_t take = std::min(entries.size(), static_cast<size_t>(k));
  if (take < entries.size()) {
    std::nth_element(entries.begin(), entries.begin() + take, entries.end(), better);
  }
  for (size_t i = 0; i < take; ++i) ++counts[entries[i].head];
}

void ada_budgets_from_counts(const int32_t* counts, const int32_t* lengths, int num_heads, int base,
                             double alpha, int32_t* budgets) {
  KVB_USAGE_CHECK(alpha >= 0.0 && alpha <= 1.0) << "ada alpha must be in [0, 1], got " << alpha;
  KVB_CHECK(base >= 0 && num_heads >= 0) << "base = " << base << ", num_heads = " << num_heads;
  // torch: round(cnts * (1 - alpha) + int(base * alpha)) on an f32 tensor.
  const float adaptive_weight = static_cast<float>(1.0 - alpha);
  const float floor_part = static_cast<float>(std::floor(static_cast<double>(base) * alpha));
  for (int h = 0; h < num_heads; ++h) {
    KVB_CHECK(0 <= counts[h] && counts[h] <= lengths[h])
        << "head " << h << ": count " << counts[h] << ", length " << lengths[h];
    const float b = round_half_even(static_cast<float>(counts[h]) * adaptive_weight + floor_part);
    budgets[h] = std::min(static_cast<int32_t>(b), lengths[h]);
  }
}

void ada_head_budgets(const RaggedScores& s, int base, double alpha, int32_t* budgets,
                      int32_t* counts) {
  KVB_CHECK(base >= 0) << "ada base budget = " << base;
  std::vector<int32_t> local;
  if (counts == nullptr) {
    local.resize(s.num_heads);
    counts = local.data();
  }
  global_topk_counts(s, s.num_heads * base, counts);
  ada_budgets_from_counts(counts, s.lengths, s.num_heads, base, alpha, budgets);
}

}  // namespace kvb::kernels::cpu
