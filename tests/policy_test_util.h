// What the policies' unit tests build their cases with: a policy's config from a name, a budget,
// a shape and options, and the positions a cache head holds.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kv_cache.h"
#include "kernels/policies/policy.h"

namespace kvb::policies::testing_policy {

inline PolicyConfig config(const std::string& name, int budget, ModelShape shape,
                           std::map<std::string, std::string> opts = {}) {
  PolicyConfig c;
  c.name = name;
  c.kv_budget = budget;
  c.shape = shape;
  c.options = PolicyOptions(std::move(opts));
  return c;
}

// The positions head `head` of `layer` holds, in slot order.
inline std::vector<int32_t> positions(const kernels::KvCache& cache, int layer, int head) {
  const int32_t* p = cache.layer(layer).position(head);
  return std::vector<int32_t>(p, p + cache.length(layer, head));
}

}  // namespace kvb::policies::testing_policy
