// Fault injection for the sweep's tests (README "Fault injection"): the KVB_FAULT_* environment
// variables, read once per process into a struct (FaultInjection::from_env) rather than looked up
// in the run path. All are off unless set; none is meant for production runs.
#pragma once

#include <string>

namespace kvb::harness {

struct FaultInjection {
  // KVB_FAULT_CRASH_SAMPLE=<sample id>: the worker dies with SIGKILL when it starts a bundle of
  // that sample.
  std::string crash_sample;
  // KVB_FAULT_THROW_SAMPLE=<sample id>[@<group rank>]: that sample's bundle throws a runtime
  // error on that tensor-parallel rank (every rank without @), as an out-of-memory on one GPU
  // would.
  std::string throw_sample;
  int throw_rank = -1;  // -1: every rank
  // KVB_FAULT_BAD_ALLOC=<sample id>/<policy>/<kv_budget tokens; 0 for full>: that unit throws
  // std::bad_alloc after its prefill (it must end `oom`, its bundle's other units `ok`).
  std::string bad_alloc_sample, bad_alloc_policy;
  int bad_alloc_budget = 0;
  // KVB_FAULT_SLOW_SHARED_PREFILL_MS=<ms>: every shared prefill takes this much longer (a slow
  // prompt, for the unit time limit).
  double shared_prefill_sleep_ms = 0;

  // KVB_FAULT_KILL_COORDINATOR=<n>: rank 0 of an MPI sweep kills itself with SIGKILL right after
  // handing out its n-th bundle (its workers healthy, their units in flight).
  int kill_coordinator_after = 0;

  // Throws a usage error naming the variable when one is malformed.
  static FaultInjection from_env();

  // Raises SIGKILL when `sample_id` is crash_sample.
  void crash_if(const std::string& sample_id) const;
  // Raises SIGKILL when `handed_out` is kill_coordinator_after.
  void kill_coordinator_if(int handed_out) const;
  // Throws kvb::Error when `sample_id` is throw_sample and `rank` matches.
  void throw_if(const std::string& sample_id, int rank) const;
  bool bad_alloc_in(const std::string& sample_id, const std::string& policy, int kv_budget) const {
    return !bad_alloc_sample.empty() && sample_id == bad_alloc_sample &&
           policy == bad_alloc_policy && kv_budget == bad_alloc_budget;
  }
};

}  // namespace kvb::harness
