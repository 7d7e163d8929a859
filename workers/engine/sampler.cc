// Greedy and seeded top-k/top-p sampling.
#include "workers/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/error.h"

namespace kvb::engine {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

double counter_uniform(uint64_t seed, uint64_t counter) {
  const uint64_t r = splitmix64(splitmix64(seed) ^ (counter * 0xD1B54A32D192ED03ull));
  return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);
}

int32_t sample_token(std::span<const float> logits, const SamplingParams& p, uint64_t step) {
  KVB_CHECK(!logits.empty()) << "sample_token: empty logits";
  if (p.temperature <= 0.0f) {
    // std::max_element returns the first maximum: ties go to the lower id (as torch.argmax).
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  const int V = static_cast<int>(logits.size());
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  int keep = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), by_logit);
  ids.resize(keep);
  const double max_logit = logits[ids[0]];
  std::vector<double> probs(keep);
  double sum = 0;
  for (int i = 0; i < keep; ++i) {
    probs[i] = std::exp((logits[ids[i]] - max_logit) / p.temperature);
    sum += probs[i];
  }
  if (p.top_p < 1.0f) {
    double cum = 0;
    int cut = keep;
    for (int i = 0; i < keep; ++i) {
      cum += probs[i] / sum;
      if (cum >= p.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    sum = std::accumulate(probs.begin(), probs.begin() + keep, 0.0);
  }
  const double u = counter_uniform(p.seed, step) * sum;
  double cum = 0;
  for (int i = 0; i < keep; ++i) {
    cum += probs[i];
    if (u < cum) return ids[i];
  }
  return ids[keep - 1];
}

}  // namespace kvb::engine
