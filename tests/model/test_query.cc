// `kvbench query`: named queries over the ci_smoke sweep's database (md output pinned), ad-hoc
// SQL with bound parameters, and the errors: writes refused (read-only), SQL errors, unknown
// names, a missing database.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <fstream>
#include <sstream>

#include "results/sqlite_util.h"
#include "run_kvbench.h"

namespace kvb {
namespace {

const std::string kConfig = std::string(KVB_FIXTURES_DIR) + "/../../configs/ci_smoke.yaml";

using kvb::testing::kvbench;

class Query : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One database per test process (ctest runs each test as its own process, two at a time).
    db_ = std::string(KVB_BINARY_DIR) + "/query_test_" + std::to_string(::getpid()) + ".db";
    for (const char* ext : {"", "-wal", "-shm"}) std::filesystem::remove(db_ + ext);
    ASSERT_EQ(kvbench({"sweep", kConfig, "--db", db_}, nullptr), 0);
  }
  static void TearDownTestSuite() {
    for (const char* ext : {"", "-wal", "-shm"}) std::filesystem::remove(db_ + ext);
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
  // Issue 34: one interval convention everywhere (results/stats.h score_ci), as bounds: the
  // Student-t half-width this table showed (0.0821, from scipy) put the interval below 0.
  EXPECT_EQ(header,
            "| model       | task       | policy | kv_budget | metric           |     mean |  ci95 lo "
            "|  ci95 hi |   n |  ok | error | failed | unfinished |");
  EXPECT_EQ(rule,
            "| ----------- | ---------- | ------ | --------- | ---------------- | -------: | -------: "
            "| -------: | --: | --: | ----: | -----: | ---------: |");
  // niah: 6 samples per (policy, budget); every unit ok. Recall 1/7 on three samples and 0 on
  // three: not 0/1 scores, so the percentile bootstrap, whose resampled mean is k/42 with
  // k ~ Binomial(6, 1/2): its 2.5% and 97.5% points are 1/42 and 5/42 (P(k = 0) = 1/64).
  EXPECT_EQ(first,
            "| stories260K | niah       | full   | -         | recall ↑         |   0.0714 |   0.0238 "
            "|   0.1190 |   6 |   6 |     0 |      0 |          0 |");
  // 7 (policy, budget) cells x (1 niah metric + 9 perplexity metrics).
  int rows = 0;
  for (std::string l; std::getline(lines, l);) rows += !l.empty();
  EXPECT_EQ(rows + 1, 7 * 10);
}

// The first lines of a query's md output.
std::string head(const std::string& out, int lines) {
  size_t pos = 0;
  for (int i = 0; i < lines && pos != std::string::npos; ++i) pos = out.find('\n', pos + 1);
  return out.substr(0, pos == std::string::npos ? out.size() : pos + 1);
}

TEST_F(Query, OtherNamedQueries) {
  std::string out;
  ASSERT_EQ(kvbench({"query", "--db", db_, "failures"}, &out), 0);
  EXPECT_EQ(out,
            "| model | task | sample_id | policy | kv_budget | status | attempts | crash_count | error |\n"
            "| ----- | ---- | --------- | ------ | --------- | ------ | -------- | ----------- | ----- |\n");
  ASSERT_EQ(kvbench({"query", "--db", db_, "niah-grid"}, &out), 0);
  // ci_smoke's NIAH: 2 lengths x depths 0, 50, 100; full finds 1 of 7 needle digits at 128.
  EXPECT_EQ(head(out, 3),
            "| model       | policy | kv_budget | context_length | depth |   n | recall |\n"
            "| ----------- | ------ | --------- | -------------: | ----: | --: | -----: |\n"
            "| stories260K | full   | -         |            128 |     0 |   1 | 0.1429 |\n");
  // Issue 34: the methods x tasks table, as LaTeX for a paper; full's niah recall (3 x 1/7, 3 x
  // 0) with the bootstrap's 1/42 and 5/42; perplexity's token counts are not task columns.
  ASSERT_EQ(kvbench({"query", "--db", db_, "paper", "-o", "latex"}, &out), 0);
  EXPECT_EQ(head(out, 5),
            "\\begin{tabular}{llll}\n\\toprule\npolicy & kv\\_budget & niah & average \\\\\n"
            "\\midrule\nfull & - & 0.071 (0.024, 0.119) & 0.071 (0.024, 0.119) \\\\\n");
  ASSERT_EQ(kvbench({"query", "--db", db_, "niah-grid", "-o", "csv"}, &out), 0);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1 + 7 * 6);  // 7 cells x 2 lengths x 3 depths
  ASSERT_EQ(kvbench({"query", "--db", db_, "memory"}, &out), 0);
  // full at 128 context: 128 prompt + 32 generated - 1 (the last token is never appended) = 159
  // slots x 5 layers x 4 KV heads x (K + V: 2 x 8 x 4 bytes + a 4-byte position) = 216,240 B.
  EXPECT_EQ(head(out, 3),
            "| model       | task       | policy | kv_budget | context_length |   n | KV MiB final "
            "| KV MiB peak | physical MiB peak | policy state KiB | occupancy mean | occupancy peak |\n"
            "| ----------- | ---------- | ------ | --------- | -------------- | --: | -----------: "
            "| ----------: | ----------------: | ---------------: | -------------: | -------------: |\n"
            "| stories260K | niah       | full   | -         | 128            |   3 |        0.206 "
            "|       0.206 |             0.208 |              0.0 |          143.0 |            159 |\n");
  ASSERT_EQ(kvbench({"query", "--db", db_, "latency"}, &out), 0);
  // Times vary run to run (and so do the widths of their columns): the columns, their
  // alignment and the first row's keys are pinned, with runs of blanks and dashes squeezed.
  auto squeeze = [](std::string t) {
    std::string o;
    for (char c : t) {
      if ((c == ' ' || c == '-') && !o.empty() && o.back() == c) continue;
      o += c;
    }
    return o;
  };
  EXPECT_EQ(squeeze(head(out, 2)),
            "| model | task | policy | kv_budget | context_length | decode batch | n | prefill ms "
            "| decode ms/tok p50 | decode ms/tok p99 | tok/s | policy ms | prefill shared "
            "| prefix reused |\n"
            "| - | - | - | - | - | -: | -: | -: | -: | -: | -: | -: | -: | -: |\n");
  // decode batch 1: the fixture's sweep decodes one unit at a time (the default).
  EXPECT_EQ(squeeze(head(out, 3).substr(head(out, 2).size())).substr(0, 48),
            "| stories260K | niah | full | - | 128 | 1 | 3 | ");
  for (const char* q : {"memory", "latency"}) {
    ASSERT_EQ(kvbench({"query", "--db", db_, q, "-o", "jsonl"}, &out), 0) << q;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 7 * 3) << q;  // niah 2 lengths + ppl
  }
  ASSERT_EQ(kvbench({"query", "--list"}, &out), 0);
  for (const char* q : {"summary", "memory", "latency", "failures", "niah-grid", "vs-full"}) {
    EXPECT_NE(out.find(std::string("| ") + q), std::string::npos) << q;
  }
}

TEST_F(Query, VsFullPairsSamplesWithFull) {
  std::string out;
  ASSERT_EQ(kvbench({"query", "--db", db_, "vs-full"}, &out), 0);
  // h2o at 32 loses one needle digit on one of the 6 samples: diff -1/42; the bootstrap interval
  // reaches 0 (5 of 6 pairs are ties), so there is no evidence of a difference.
  EXPECT_EQ(head(out, 3),
            "| model       | task       | policy | kv_budget | metric           |   n |     mean "
            "| full mean |    diff | diff ci95 lo | diff ci95 hi |      p | verdict     |\n"
            "| ----------- | ---------- | ------ | --------: | ---------------- | --: | -------: "
            "| --------: | ------: | -----------: | -----------: | -----: | ----------- |\n"
            "| stories260K | niah       | h2o    |        32 | recall ↑         |   6 |   0.0476 "
            "|    0.0714 | -0.0238 |      -0.0714 |       0.0000 | 0.6650 | no evidence |\n");
  ASSERT_EQ(kvbench({"query", "--db", db_, "vs-full", "-o", "csv"}, &out), 0);
  std::istringstream lines(out);
  std::string header;
  std::getline(lines, header);
  EXPECT_EQ(header,
            "model,task,policy,kv_budget,metric,n,mean,full mean,diff,diff ci95 lo,diff ci95 hi,p,"
            "verdict");
  int rows = 0;
  for (std::string l; std::getline(lines, l);) {
    ++rows;
    // niah pairs 6 samples; perplexity 1 (its p is 1 and the CI collapses: n = 1).
    if (l.rfind("stories260K,niah,", 0) == 0) {
      EXPECT_NE(l.find(",recall ↑,6,"), std::string::npos) << l;
    }
    if (l.rfind("stories260K,perplexity,", 0) == 0) {
      EXPECT_NE(l.find(",1.0000"), std::string::npos) << l;
    }
  }
  EXPECT_EQ(rows, 6 * 10);  // 6 non-full (policy, budget) cells x 10 metrics
}

// Issue 34: a comparison to `full` in a database without one says why, and how to get one,
// instead of printing an empty table.
TEST_F(Query, VsFullWithoutFullSaysWhy) {
  const std::string db = std::string(KVB_BINARY_DIR) + "/query_nofull_" + std::to_string(::getpid()) +
                         ".db";
  std::filesystem::remove(db);
  std::filesystem::copy_file(db_, db);
  ASSERT_EQ(kvbench({"query", "--db", db, "--migrate"}, nullptr), 0);
  {
    results::Db raw(db, SQLITE_OPEN_READWRITE);
    raw.exec("PRAGMA foreign_keys = ON");
    raw.exec("DELETE FROM units WHERE policy = 'full'");
  }
  std::string out, err;
  EXPECT_EQ(kvbench({"query", "--db", db, "vs-full"}, &out, &err), 0);
  EXPECT_NE(err.find("no comparison to full: the database has no `full` unit that finished ok"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("Add policy `full`"), std::string::npos) << err;
  // With full there: no such line.
  err.clear();
  EXPECT_EQ(kvbench({"query", "--db", db_, "vs-full"}, &out, &err), 0);
  EXPECT_EQ(err.find("no comparison"), std::string::npos) << err;
  std::filesystem::remove(db);
}

TEST_F(Query, AdHocSqlIsReadOnlyWithBoundParameters) {
  std::string out;
  ASSERT_EQ(kvbench({"query", "--db", db_, "SELECT policy, COUNT(*) AS n FROM units WHERE policy = ?1 "
                                          "GROUP BY policy", "--param", "h2o", "-o", "csv"},
                    &out),
            0);
  EXPECT_EQ(out, "policy,n\nh2o,14\n");
  std::string err;
  EXPECT_EQ(kvbench({"query", "--db", db_, "DELETE FROM units"}, nullptr, &err), 2);
  EXPECT_NE(err.find("readonly"), std::string::npos) << err;
  EXPECT_EQ(kvbench({"query", "--db", db_, "SELECT * FROM no_such_table"}, nullptr, &err), 2);
  // The message names the statement's problem as SQLite words it, and the database.
  EXPECT_NE(err.find("SQL failed on " + db_ + ": "), std::string::npos) << err;
  EXPECT_NE(err.find("no such table: no_such_table"), std::string::npos) << err;
  // Issue 34: and the statement, with no internal C++ (the call, the source file).
  EXPECT_NE(err.find("statement: SELECT * FROM no_such_table"), std::string::npos) << err;
  EXPECT_EQ(err.find("sqlite3_prepare"), std::string::npos) << err;
  EXPECT_EQ(err.find(".cc:"), std::string::npos) << err;
  EXPECT_EQ(kvbench({"query", "--db", db_, "no-such-query"}, nullptr), 2);
  EXPECT_EQ(kvbench({"query", "--db", std::string(KVB_BINARY_DIR) + "/missing.db", "summary"},
                    nullptr),
            2);
  ASSERT_EQ(kvbench({"query", "--db", db_, "SELECT COUNT(*) AS n FROM units"}, &out), 0);
  EXPECT_NE(out.find("49"), std::string::npos);
}

// Issue 14: no statement of a read-only query creates a file (VACUUM INTO used to leave an empty
// one at its target, ATTACH could create one).
TEST_F(Query, NoStatementCreatesAFile) {
  const std::string target = std::string(KVB_BINARY_DIR) + "/query_vacuum_into.db";
  std::filesystem::remove(target);
  std::string err;
  EXPECT_EQ(kvbench({"query", "--db", db_, "VACUUM INTO '" + target + "'"}, nullptr, &err), 2);
  EXPECT_NE(err.find("authorization denied"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(target));
  EXPECT_EQ(kvbench({"query", "--db", db_, "ATTACH '" + target + "' AS x"}, nullptr, &err), 2);
  EXPECT_NE(err.find("not authorized"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(target));
}

// A recursive CTE without an end ran forever; --timeout-s (default 60) stops it with a message.
TEST_F(Query, RunawayQueryStopsAtTheTimeLimit) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string err;
  EXPECT_EQ(kvbench({"query", "--db", db_, "--timeout-s", "0.5",
                     "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) "
                     "SELECT COUNT(*) FROM r"},
                    nullptr, &err),
            2);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10);
  EXPECT_NE(err.find("SQL on " + db_ + " was stopped after --timeout-s 0.5 s"), std::string::npos)
      << err;
  std::string out;
  EXPECT_EQ(kvbench({"query", "--db", db_, "--timeout-s", "0.5", "-o", "csv",
                     "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 1000) "
                     "SELECT COUNT(*) AS n FROM r"},
                    &out),
            0);
  EXPECT_EQ(out, "n\n1000\n");
  EXPECT_EQ(kvbench({"query", "--db", db_, "--timeout-s", "-1", "summary"}, nullptr, &err), 2);
  EXPECT_NE(err.find("--timeout-s must be >= 0"), std::string::npos) << err;
}

// `kvbench ARGS` as a user who cannot write `dir`: as root (root ignores permissions) a child
// becomes `nobody` and runs the binary; otherwise `dir` is made read-only meanwhile.
int run_without_write_access(const std::string& dir, const std::vector<std::string>& args,
                             std::string* out) {
  if (::geteuid() != 0) {
    ::chmod(dir.c_str(), 0555);
    const int rc = kvbench(args, out, out);
    ::chmod(dir.c_str(), 0755);
    return rc;
  }
  const std::string bin = std::string(KVB_BINARY_DIR) + "/kvbench";
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(125);
    std::vector<std::string> argv_s = {bin};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    ::_exit(126);
  }
  ::close(fds[1]);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) out->append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A WAL database (as every sweep writes) in a folder its reader cannot write could not be read
// at all (SQLite wants to create the -shm file there): it now opens as immutable, as long as no
// -wal file holds commits the main file lacks.
TEST_F(Query, ReadsAWalDatabaseInAFolderItCannotWrite) {
  if (::geteuid() == 0 && !std::filesystem::exists(std::string(KVB_BINARY_DIR) + "/kvbench"))
    GTEST_SKIP() << "needs the kvbench binary to run it as another user";
  const std::string dir = "/tmp/kvb_query_ro_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ::chmod(dir.c_str(), 0755);
  const std::string db = dir + "/sweep.db";
  std::filesystem::copy_file(db_, db);  // the sweep's writer has closed: no -wal holds commits
  ::chmod(db.c_str(), 0644);
  std::string out;
  EXPECT_EQ(run_without_write_access(dir, {"query", "--db", db, "-o", "csv",
                                           "SELECT COUNT(*) AS n FROM units"},
                                     &out),
            0)
      << out;
  EXPECT_NE(out.find("n\n49\n"), std::string::npos) << out;
  const std::string report = dir + "_report";
  std::filesystem::remove_all(report);
  std::filesystem::create_directories(report);
  ::chmod(report.c_str(), 0777);
  out.clear();
  EXPECT_EQ(run_without_write_access(dir, {"report", "--db", db, "--out", report}, &out), 0) << out;
  EXPECT_TRUE(std::filesystem::exists(report + "/index.html"));
  // A -wal file the reader cannot merge (no -shm can be made): refused, not silently stale.
  { std::ofstream(dir + "/sweep.db-wal") << "x"; }
  out.clear();
  EXPECT_EQ(run_without_write_access(dir, {"query", "--db", db, "summary"}, &out), 2) << out;
  EXPECT_NE(out.find(db + " cannot be read: it is in WAL mode with a " + db + "-wal file"),
            std::string::npos)
      << out;
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(report);
}

}  // namespace
}  // namespace kvb
