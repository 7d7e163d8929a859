// Next-token selection: greedy (argmax, ties to the lower id) or seeded sampling with
// temperature, top-k and top-p. Randomness is counter-based (seed, step), so a unit's output
// is reproducible whatever ran before it.
#pragma once

#include <cstdint>
#include <span>

namespace kvb::engine {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: no top-k cut
  float top_p = 1.0f;        // 1: no nucleus cut
  uint64_t seed = 0;
};

// logits: [vocab]. step: the index of the generated token (keys the random draw).
int32_t sample_token(std::span<const float> logits, const SamplingParams& params, uint64_t step);

// A uniform double in [0, 1) from (seed, counter): splitmix64 over a mixed key.
double counter_uniform(uint64_t seed, uint64_t counter);

}  // namespace kvb::engine
