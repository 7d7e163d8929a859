// The named query `failures-by-status` (results/queries/failures-by-status.sql, `kvbench query
// failures-by-status`): the failed units of a hand-built database grouped by status, with the
// count, the policies, the number of distinct messages and the most common message (ties: the
// first in byte order); units ok, pending and running are not failures.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "results/named_queries.h"
#include "results/store.h"

namespace kvb::results {
namespace {

namespace fs = std::filesystem;

std::string query_sql(const std::string& name) {
  for (const NamedQuery& q : named_queries()) {
    if (q.name == name) return q.sql;
  }
  ADD_FAILURE() << "no named query " << name;
  return "SELECT 1";
}

TEST(FailureQuery, GroupsFailedUnitsByStatus) {
  const fs::path dir = fs::path(KVB_BINARY_DIR) / "test_failure_query";
  fs::remove_all(dir);
  fs::create_directories(dir);
  Store store = Store::open((dir / "r.db").string(), Mode::kReadWrite);
  RunInfo info;
  info.config_text = "x";
  info.git_rev = "r";
  info.kvbench_version = "0";
  info.host = "h";
  const int64_t run = store.begin_run(info);
  // (sample, policy, status, error): 3 oom (two messages, one twice), 2 error (a tie), 1 timeout,
  // 1 ok, and 2 never finished (pending, running).
  struct U {
    const char *sample, *policy;
    UnitStatus status;
    const char* error;
  };
  const std::vector<U> units = {
      {"s0", "h2o", UnitStatus::kOom, "out of host memory"},
      {"s1", "h2o", UnitStatus::kOom, "out of host memory"},
      {"s2", "snapkv", UnitStatus::kOom, "above --max-rss-gb"},
      {"s0", "window", UnitStatus::kError, "zeta: bad sample"},
      {"s1", "full", UnitStatus::kError, "alpha: bad sample"},
      {"s2", "full", UnitStatus::kTimeout, "unit time limit"},
      {"s3", "full", UnitStatus::kOk, ""},
      {"s4", "full", UnitStatus::kRunning, ""},
      {"s5", "full", UnitStatus::kPending, ""},
  };
  std::vector<UnitRow> rows;
  for (const U& u : units) {
    UnitRow row;
    row.model = "m";
    row.spec.model_sha256 = std::string(64, 'a');
    row.spec.task = "niah";
    row.spec.sample_id = u.sample;
    row.spec.policy = u.policy;
    rows.push_back(row);
  }
  const std::vector<std::string> keys = store.register_units(run, rows);
  std::vector<std::string> handed(keys.begin(), keys.end() - 1);  // all but the pending one
  store.mark_running(run, handed, 1, "h");
  std::vector<UnitResult> results;
  for (size_t i = 0; i < units.size(); ++i) {
    if (units[i].status == UnitStatus::kRunning || units[i].status == UnitStatus::kPending) continue;
    UnitResult r;
    r.unit_key = keys[i];
    r.status = units[i].status;
    r.error = units[i].error;
    results.push_back(r);
  }
  store.write_bundle(results);

  const QueryResult q = store.query(query_sql("failures-by-status"));
  EXPECT_EQ(q.columns, (std::vector<std::string>{"status", "units", "policies", "messages",
                                                 "most_common_error"}));
  std::vector<std::string> got;
  for (const auto& row : q.rows) {
    std::string line;
    for (const auto& v : row) line += (line.empty() ? "" : "|") + v.text;
    got.push_back(line);
  }
  EXPECT_EQ(got, (std::vector<std::string>{
                     "oom|3|h2o snapkv|2|out of host memory",
                     "error|2|full window|2|alpha: bad sample",
                     "timeout|1|full|1|unit time limit",
                 }));
}

}  // namespace
}  // namespace kvb::results
