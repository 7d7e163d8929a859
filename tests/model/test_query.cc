// `kvbench query`: named queries over the ci_smoke sweep's database (md output pinned), ad-hoc
// SQL with bound parameters, and the errors: writes refused (read-only), SQL errors, unknown
// names, a missing database.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <sstream>

#include "harness/cli.h"

namespace kvb {
namespace {

const std::string kConfig = std::string(KVB_FIXTURES_DIR) + "/../../configs/ci_smoke.yaml";

// Runs kvbench with captured stdout; returns the exit code.
int kvbench(std::vector<std::string> args, std::string* out) {
  args.insert(args.begin(), "kvbench");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  std::ostringstream buf;
  std::streambuf* old = std::cout.rdbuf(buf.rdbuf());
  const int rc = harness::run_cli(static_cast<int>(argv.size()), argv.data());
  std::cout.rdbuf(old);
  if (out) *out = buf.str();
  return rc;
}

class Query : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    db_ = std::string(KVB_BINARY_DIR) + "/query_test.db";
    for (const char* ext : {"", "-wal", "-shm"}) std::filesystem::remove(db_ + ext);
    ASSERT_EQ(kvbench({"sweep", kConfig, "--db", db_}, nullptr), 0);
  }
  static std::string db_;
};
std::string Query::db_;

TEST_F(Query, SummaryMarkdownIsPinned) {
  std::string out;
  ASSERT_EQ(kvbench({"query", "--db", db_, "summary"}, &out), 0);
  std::istringstream lines(out);
  std::string header, rule, first;
  std::getline(lines, header);
  std::getline(lines, rule);
  std::getline(lines, first);
  EXPECT_EQ(header,
            "| task       | policy | kv_budget | metric           |     mean | ± ci95 |   n |  ok "
            "| error | failed | unfinished |");
  EXPECT_EQ(rule,
            "| ---------- | ------ | --------- | ---------------- | -------: | -----: | --: | --: "
            "| ----: | -----: | ---------: |");
  // niah: 6 samples per (policy, budget); every unit ok.
  EXPECT_EQ(first,
            "| niah       | full   | -         | recall ↑         |   0.0714 | 0.0626 |   6 |   6 "
            "|     0 |      0 |          0 |");
  // 7 (policy, budget) cells x (1 niah metric + 9 perplexity metrics).
  int rows = 0;
  for (std::string l; std::getline(lines, l);) rows += !l.empty();
  EXPECT_EQ(rows + 1, 7 * 10);
}

TEST_F(Query, OtherNamedQueries) {
  std::string out;
  ASSERT_EQ(kvbench({"query", "--db", db_, "failures"}, &out), 0);
  EXPECT_EQ(out,
            "| task | sample_id | policy | kv_budget | status | attempts | crash_count | error |\n"
            "| ---- | --------- | ------ | --------- | ------ | -------- | ----------- | ----- |\n");
  ASSERT_EQ(kvbench({"query", "--db", db_, "niah-grid", "-o", "csv"}, &out), 0);
  EXPECT_EQ(out.substr(0, out.find('\n')), "policy,kv_budget,context_length,depth,n,recall");
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1 + 7 * 6);  // 7 cells x 2 lengths x 3 depths
  for (const char* q : {"memory", "latency"}) {
    ASSERT_EQ(kvbench({"query", "--db", db_, q, "-o", "jsonl"}, &out), 0) << q;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 7 * 3) << q;  // niah 2 lengths + ppl
  }
  ASSERT_EQ(kvbench({"query", "--list"}, &out), 0);
  for (const char* q : {"summary", "memory", "latency", "failures", "niah-grid"}) {
    EXPECT_NE(out.find(std::string("| ") + q), std::string::npos) << q;
  }
}

TEST_F(Query, VsFullPairsSamplesWithFull) {
  std::string out;
  ASSERT_EQ(kvbench({"query", "--db", db_, "vs-full", "-o", "csv"}, &out), 0);
  std::istringstream lines(out);
  std::string header;
  std::getline(lines, header);
  EXPECT_EQ(header, "task,policy,kv_budget,metric,n,mean,full mean,diff,diff ci95 lo,diff ci95 hi,p");
  int rows = 0;
  for (std::string l; std::getline(lines, l);) {
    ++rows;
    // niah pairs 6 samples; perplexity 1 (its p is 1 and the CI collapses: n = 1).
    if (l.rfind("niah,", 0) == 0) EXPECT_NE(l.find(",recall ↑,6,"), std::string::npos) << l;
    if (l.rfind("perplexity,", 0) == 0) EXPECT_NE(l.find(",1.0000"), std::string::npos) << l;
  }
  EXPECT_EQ(rows, 6 * 10);  // 6 non-full (policy, budget) cells x 10 metrics
}

TEST_F(Query, AdHocSqlIsReadOnlyWithBoundParameters) {
  std::string out;
  ASSERT_EQ(kvbench({"query", "--db", db_, "SELECT policy, COUNT(*) AS n FROM units WHERE policy = ?1 "
                                          "GROUP BY policy", "--param", "h2o", "-o", "csv"},
                    &out),
            0);
  EXPECT_EQ(out, "policy,n\nh2o,14\n");
  EXPECT_EQ(kvbench({"query", "--db", db_, "DELETE FROM units"}, nullptr), 2);
  EXPECT_EQ(kvbench({"query", "--db", db_, "SELECT * FROM no_such_table"}, nullptr), 2);
  EXPECT_EQ(kvbench({"query", "--db", db_, "no-such-query"}, nullptr), 2);
  EXPECT_EQ(kvbench({"query", "--db", std::string(KVB_BINARY_DIR) + "/missing.db", "summary"},
                    nullptr),
            2);
  ASSERT_EQ(kvbench({"query", "--db", db_, "SELECT COUNT(*) AS n FROM units"}, &out), 0);
  EXPECT_NE(out.find("49"), std::string::npos);
}

}  // namespace
}  // namespace kvb
