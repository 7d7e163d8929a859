// The sweep across MPI ranks (issue "Sweeps"): mpirun -np 3 gives the same metric values as a
// single process; a worker killed with SIGKILL mid-sweep loses nothing after --resume; a unit
// that crashes its worker twice ends `crashed` while the rest finish. Uses configs/ci_smoke.yaml
// (stories260K). Runs the real binary through the shell, as a user would.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cstdlib>
#include <filesystem>
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <vector>
#include <string>

#include "mpi/mpirun.h"
#include "mpi/sweep_util.h"

namespace {

const std::string kBin = std::string(KVB_BINARY_DIR) + "/kvbench";
const std::string kConfig = std::string(KVB_FIXTURES_DIR) + "/../../configs/ci_smoke.yaml";

std::string db_path(const std::string& name) {
  const std::string p = std::string(KVB_BINARY_DIR) + "/" + name;
  for (const char* ext : {"", "-wal", "-shm"}) std::filesystem::remove(p + ext);
  return p;
}

using kvb::testing::mpirun;

int run(const std::string& cmd) { return kvb::testing::run_command(cmd, ""); }
// key -> value for every (unit, metric), or status counts.
std::map<std::string, std::string> query(const std::string& db, const std::string& sql) {
  return kvb::testing::query_pairs(db, sql);
}

// Runs whose worker kills itself: the ranks are gone within seconds; only mpirun's own shutdown
// can hang (mpirun.h), and a short limit keeps that cheap.
constexpr int kCrashRunSeconds = 90;

// Every row of every table, one string per row ("table|col=value|..."), sorted; columns named in
// `skip` (by "table.column") left out. Values are printed with 17 significant digits, so a
// difference in the last bit of a double shows.
std::vector<std::string> dump_all_tables(const std::string& db, const std::set<std::string>& skip) {
  sqlite3* h = nullptr;
  EXPECT_EQ(sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK) << db;
  std::vector<std::string> tables;
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(h,
                     "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE "
                     "'sqlite%' ORDER BY name",
                     -1, &st, nullptr);
  while (sqlite3_step(st) == SQLITE_ROW) {
    tables.push_back(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)));
  }
  sqlite3_finalize(st);
  std::vector<std::string> rows;
  for (const std::string& t : tables) {
    EXPECT_EQ(sqlite3_prepare_v2(h, ("SELECT * FROM " + t).c_str(), -1, &st, nullptr), SQLITE_OK);
    while (sqlite3_step(st) == SQLITE_ROW) {
      std::string row = t;
      for (int c = 0; c < sqlite3_column_count(st); ++c) {
        const std::string col = sqlite3_column_name(st, c);
        if (skip.count(t + "." + col)) continue;
        row += "|" + col + "=";
        switch (sqlite3_column_type(st, c)) {
          case SQLITE_NULL:
            row += "NULL";
            break;
          case SQLITE_FLOAT: {
            char buf[64];
            std::snprintf(buf, sizeof(buf), "%.17g", sqlite3_column_double(st, c));
            row += buf;
            break;
          }
          default:
            row += reinterpret_cast<const char*>(sqlite3_column_text(st, c));
        }
      }
      rows.push_back(row);
    }
    sqlite3_finalize(st);
  }
  sqlite3_close(h);
  std::sort(rows.begin(), rows.end());
  return rows;
}

// What legitimately differs between a one-process and a 3-rank run of the same matrix: wall-clock
// times and timestamps, the host and rank names, the rank count and per-rank layout, and the
// worker's resident set (a property of the process, not of the unit). Everything else (unit
// fields, status, attempts, metrics, predictions, token counts, KV bytes, occupancy, whether the
// prefill was shared) must be equal.
const std::set<std::string> kRunDependent = {
    "runs.started_at", "runs.finished_at", "runs.host", "runs.ranks", "runs.devices",
    "runs.end_signal",  // recorded by multi-rank coordinators only (0), NULL in one process
    "units.started_at", "units.finished_at", "units.rank", "units.host",
    "file_digests.hashed_at",  // when the model was hashed (schema v4's digest cache)
    "measurements.prefill_ms", "measurements.ttft_ms", "measurements.decode_ms",
    "measurements.decode_ms_p50", "measurements.decode_ms_p99", "measurements.tokens_per_s",
    "measurements.policy_ms", "measurements.host_rss_peak",
    // Prefix reuse depends on which bundles a worker ran before (one process: all of them).
    "measurements.prefill_reused"};

const char* kMetrics =
    "SELECT unit_key || '/' || name, printf('%.17g', value) FROM metrics ORDER BY 1";
const char* kStatus = "SELECT status, COUNT(*) FROM units GROUP BY status";

TEST(SweepMpi, ThreeRanksEqualSingleProcess) {
  const std::string one = db_path("sweep_single.db"), three = db_path("sweep_mpi3.db");
  ASSERT_EQ(run(kBin + " sweep " + kConfig + " --db " + one), 0);
  ASSERT_EQ(run(mpirun(3) + kBin + " sweep " + kConfig + " --db " + three), 0);
  const auto a = query(one, kMetrics), b = query(three, kMetrics);
  EXPECT_GT(a.size(), 50u);
  EXPECT_EQ(a, b);
  EXPECT_EQ(query(three, kStatus), (std::map<std::string, std::string>{{"ok", "49"}}));
  // Every table, row for row (issue 14: the wire dropped prefill_shared, so MPI rows had 0).
  const std::vector<std::string> rows_one = dump_all_tables(one, kRunDependent);
  const std::vector<std::string> rows_three = dump_all_tables(three, kRunDependent);
  EXPECT_GT(rows_one.size(), 49u * 3);  // units, measurements, predictions, metrics, runs
  ASSERT_EQ(rows_one.size(), rows_three.size());
  for (size_t i = 0; i < rows_one.size(); ++i) {
    EXPECT_EQ(rows_one[i], rows_three[i]) << "row " << i << " differs";
  }
  // Both runs shared the prompt's prefill in every NIAH bundle (6 samples x 7 units; the
  // perplexity sample streams, nothing to share): the comparison covers a column that is not all
  // zero.
  for (const std::string& db : {one, three}) {
    EXPECT_EQ(query(db, "SELECT 'n', SUM(prefill_shared) FROM measurements").at("n"), "42") << db;
    // ttft_ms is "prefill + choosing the first token": never below prefill_ms, also when the
    // prefill was shared (it left the shared pass out).
    EXPECT_EQ(query(db, "SELECT 'n', COUNT(*) FROM measurements WHERE ttft_ms < prefill_ms").at("n"),
              "0")
        << db;
  }
}

TEST(SweepMpi, KilledWorkerLosesNothingAfterResume) {
  const std::string db = db_path("sweep_kill.db");
  // The worker that starts this sample's bundle dies with SIGKILL, taking the job down.
  setenv("KVB_FAULT_CRASH_SAMPLE", "len128_depth100_s0", 1);
  EXPECT_NE(run(mpirun(3, kCrashRunSeconds) + kBin + " sweep " + kConfig + " --db " + db), 0);
  unsetenv("KVB_FAULT_CRASH_SAMPLE");
  const auto mid = query(db, kStatus);
  EXPECT_TRUE(mid.count("running")) << "the crash should leave units in flight";
  // Without --resume the sweep refuses to start over units in flight.
  EXPECT_EQ(run(kBin + " sweep " + kConfig + " --db " + db), 2);
  ASSERT_EQ(run(mpirun(3) + kBin + " sweep " + kConfig + " --db " + db + " --resume"), 0);
  EXPECT_EQ(query(db, kStatus), (std::map<std::string, std::string>{{"ok", "49"}}));
  // Exactly one metrics row set per unit: 49 units, none duplicated (unit keys are unique).
  const auto units = query(db, "SELECT 'n', COUNT(DISTINCT unit_key) FROM units");
  EXPECT_EQ(units.at("n"), "49");
}

TEST(SweepMpi, UnitThatCrashesTwiceEndsCrashed) {
  const std::string db = db_path("sweep_crash2.db");
  setenv("KVB_FAULT_CRASH_SAMPLE", "len128_depth100_s0", 1);
  EXPECT_NE(run(mpirun(3, kCrashRunSeconds) + kBin + " sweep " + kConfig + " --db " + db), 0);
  EXPECT_NE(
      run(mpirun(3, kCrashRunSeconds) + kBin + " sweep " + kConfig + " --db " + db + " --resume"),
      0);
  // Third run: the bundle's units were in flight during two crashes -> crashed, skipped.
  EXPECT_EQ(run(mpirun(3) + kBin + " sweep " + kConfig + " --db " + db + " --resume"), 0);
  unsetenv("KVB_FAULT_CRASH_SAMPLE");
  const auto st = query(db, kStatus);
  // That sample's bundle: full + 3 policies x 2 budgets = 7 units.
  EXPECT_EQ(st.count("crashed") ? st.at("crashed") : "0", "7");
  EXPECT_EQ(st.count("ok") ? st.at("ok") : "0", "42");
  EXPECT_FALSE(st.count("running"));
  EXPECT_FALSE(st.count("pending"));
}

// The coordinator (rank 0) killed twice with SIGKILL while its healthy workers had units in
// flight (KVB_FAULT_KILL_COORDINATOR: right after handing out the 2nd bundle): those units are
// bystanders, so no crash is counted against them and the third run finishes every unit ok.
// Before, the units in flight during both kills ended `crashed` (the same bundles are handed out
// first in every run).
TEST(SweepMpi, CoordinatorKilledTwiceCrashesNoUnit) {
  const std::string db = db_path("sweep_coord_kill.db");
  setenv("KVB_FAULT_KILL_COORDINATOR", "2", 1);
  EXPECT_NE(run(mpirun(3, kCrashRunSeconds) + kBin + " sweep " + kConfig + " --db " + db), 0);
  EXPECT_TRUE(query(db, kStatus).count("running")) << "the kill should leave units in flight";
  EXPECT_NE(
      run(mpirun(3, kCrashRunSeconds) + kBin + " sweep " + kConfig + " --db " + db + " --resume"),
      0);
  unsetenv("KVB_FAULT_KILL_COORDINATOR");
  ASSERT_EQ(run(mpirun(3) + kBin + " sweep " + kConfig + " --db " + db + " --resume"), 0);
  EXPECT_EQ(query(db, kStatus), (std::map<std::string, std::string>{{"ok", "49"}}));
  EXPECT_EQ(query(db, "SELECT 'n', SUM(crash_count) FROM units").at("n"), "0");
  // Each bundle handed out in a killed run was handed out again: attempts > 1 somewhere.
  EXPECT_NE(query(db, "SELECT 'n', MAX(attempts) FROM units").at("n"), "1");
  // The two killed runs recorded no signal (end_signal 0), the last one finished.
  EXPECT_EQ(query(db, "SELECT status || '/' || end_signal, COUNT(*) FROM runs GROUP BY 1"),
            (std::map<std::string, std::string>{{"crashed/0", "2"}, {"ok/0", "1"}}));
}

}  // namespace
