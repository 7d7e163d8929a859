// Sampler: greedy tie rule, top-k/top-p support, seeded reproducibility and rough frequencies.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "workers/engine/sampler.h"

namespace kvb::engine {
namespace {

TEST(Sampler, GreedyTiesGoToLowerId) {
  std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(sample_token(l, {}, 0), 1);
}

TEST(Sampler, TopKOneIsGreedy) {
  std::vector<float> l = {0.1f, 0.2f, 5.0f, 0.3f};
  SamplingParams p{1.0f, 1, 1.0f, 7};
  for (int s = 0; s < 20; ++s) EXPECT_EQ(sample_token(l, p, s), 2);
}

TEST(Sampler, SeededAndFrequenciesFollowSoftmax) {
  // logits (0, ln 3): probabilities 1/4, 3/4.
  std::vector<float> l = {0.0f, std::log(3.0f)};
  SamplingParams p{1.0f, 0, 1.0f, 42};
  int ones = 0;
  const int n = 20000;
  for (int s = 0; s < n; ++s) ones += sample_token(l, p, s) == 1;
  EXPECT_NEAR(double(ones) / n, 0.75, 0.02);
  // Same seed and step -> same draw; another seed differs somewhere.
  SamplingParams q = p;
  q.seed = 43;
  int diff = 0;
  for (int s = 0; s < 100; ++s) {
    EXPECT_EQ(sample_token(l, p, s), sample_token(l, p, s));
    diff += sample_token(l, p, s) != sample_token(l, q, s);
  }
  EXPECT_GT(diff, 0);
}

TEST(Sampler, TopPCutsTheTail) {
  // probs ~ (0.7, 0.2, 0.1): top_p 0.6 keeps only the first.
  std::vector<float> l = {std::log(0.7f), std::log(0.2f), std::log(0.1f)};
  SamplingParams p{1.0f, 0, 0.6f, 1};
  for (int s = 0; s < 50; ++s) EXPECT_EQ(sample_token(l, p, s), 0);
}

}  // namespace
}  // namespace kvb::engine
