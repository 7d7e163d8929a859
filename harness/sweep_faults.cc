// KVB_FAULT_* parsing and the hooks that act on them (harness/sweep_faults.h).
#include "harness/sweep_faults.h"

#include <csignal>
#include <cstdlib>
#include <stdexcept>

#include "common/error.h"
#include "common/log.h"

namespace kvb::harness {

namespace {
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int parse_int(const char* var, const std::string& text) {
  try {
    size_t end = 0;
    const int v = std::stoi(text, &end);
    if (end == text.size()) return v;
  } catch (const std::exception&) {
  }
  KVB_USAGE_FAIL() << var << ": '" << text << "' is not an integer";
}
}  // namespace

FaultInjection FaultInjection::from_env() {
  FaultInjection f;
  f.crash_sample = env("KVB_FAULT_CRASH_SAMPLE");
  const std::string t = env("KVB_FAULT_THROW_SAMPLE");
  const size_t at = t.find('@');
  f.throw_sample = t.substr(0, at);
  if (at != std::string::npos) f.throw_rank = parse_int("KVB_FAULT_THROW_SAMPLE", t.substr(at + 1));
  const std::string b = env("KVB_FAULT_BAD_ALLOC");
  if (!b.empty()) {
    const size_t p1 = b.find('/'), p2 = b.rfind('/');
    KVB_USAGE_CHECK(p1 != std::string::npos && p2 != p1)
        << "KVB_FAULT_BAD_ALLOC='" << b
        << "': expected <sample id>/<policy>/<kv_budget tokens, 0 for full>, e.g. "
           "len128_depth0_s0/h2o/32";
    f.bad_alloc_sample = b.substr(0, p1);
    f.bad_alloc_policy = b.substr(p1 + 1, p2 - p1 - 1);
    f.bad_alloc_budget = parse_int("KVB_FAULT_BAD_ALLOC", b.substr(p2 + 1));
  }
  const std::string slow = env("KVB_FAULT_SLOW_SHARED_PREFILL_MS");
  if (!slow.empty()) f.shared_prefill_sleep_ms = parse_int("KVB_FAULT_SLOW_SHARED_PREFILL_MS", slow);
  const std::string kill = env("KVB_FAULT_KILL_COORDINATOR");
  if (!kill.empty()) f.kill_coordinator_after = parse_int("KVB_FAULT_KILL_COORDINATOR", kill);
  return f;
}

void FaultInjection::kill_coordinator_if(int handed_out) const {
  if (kill_coordinator_after > 0 && handed_out == kill_coordinator_after) {
    KVB_LOG_WARN << "fault injection: killing the coordinator after bundle " << handed_out;
    std::raise(SIGKILL);
  }
}

void FaultInjection::crash_if(const std::string& sample_id) const {
  if (!crash_sample.empty() && sample_id == crash_sample) {
    KVB_LOG_WARN << "fault injection: killing this rank on sample " << sample_id;
    std::raise(SIGKILL);
  }
}

void FaultInjection::throw_if(const std::string& sample_id, int rank) const {
  if (throw_sample.empty() || sample_id != throw_sample) return;
  if (throw_rank >= 0 && rank != throw_rank) return;
  throw Error("fault injection: runtime error on sample " + sample_id);
}

}  // namespace kvb::harness
