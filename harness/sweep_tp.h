// Diagnostics of tensor-parallel sweeps (harness/README.md "Tensor-parallel workers"): keep-set
// dumps for comparing runs, and the per-unit communication line the group leader logs.
#pragma once

#include <string>

#include "kernels/kv_cache.h"
#include "kernels/policies/policy.h"
#include "workers/runner.h"

namespace kvb::harness {

// KVB_DUMP_KEEPSETS=DIR: writes a unit's final cache positions to DIR/<unit key>.tp<rank>, one
// line per (layer, global KV head): "layer head: pos pos ...". Each rank of a tensor-parallel
// group writes its own heads; the union of a unit's files is its keep-set on any layout.
void dump_keep_set(const std::string& dir, const std::string& unit_key, int tp_rank,
                   const kernels::KvCache& cache, const policies::Policy& policy);

// "tp unit KEY: ..." — this rank's collectives during the prompt and per decode step (calls,
// payload and wire bytes, all-reduce time and its share of the step).
std::string tp_traffic_line(const std::string& unit_key, const workers::UnitMeasurements& m);

}  // namespace kvb::harness
