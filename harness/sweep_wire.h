// What travels between the coordinator and the workers (MPI messages, or a function call in a
// single process): a bundle of units sharing one sample, and its results, as JSON text.
#pragma once

#include <string>
#include <vector>

#include "results/store.h"
#include "tasks/task.h"
#include "workers/runner.h"

namespace kvb::harness {

struct WireUnit {
  std::string key;
  std::string policy;
  std::map<std::string, std::string> policy_options;
  int kv_budget = 0;  // resolved tokens (0 for full)
  std::string question = "in_prompt";
  uint64_t seed = 0;
  double budget_fraction = 0;  // PolicyConfig::budget_fraction (0: a token count)
};

struct WireBundle {
  int model = 0;  // index into the config's models
  int task = 0;   // index into the config's tasks
  tasks::Sample sample;
  std::vector<WireUnit> units;
};

std::string to_json(const WireBundle& b);
WireBundle bundle_from_json(const std::string& text);
// Results; measurements travel as an object keyed by field name (common/measurement_fields.h).
std::string to_json(const std::vector<results::UnitResult>& r);
std::vector<results::UnitResult> results_from_json(const std::string& text);

// The worker's measurements as the store holds them (one line per field, generated).
results::Measurements to_store(const workers::UnitMeasurements& m);

}  // namespace kvb::harness
