// Sweep integrity (issue 14), through the real binary as a user runs it, one process and under
// mpirun: a unit that throws std::bad_alloc (KVB_FAULT_BAD_ALLOC) ends `oom` while the others end
// `ok`, the sweep exits 1 (a unit failed), nothing is left `running` (units or runs), and under
// mpirun the coordinator does not hang (before, the exception ended the rank: rank 0 waited in
// recv_any forever). A shared prefill slower than unit_time_limit_s times out every unit that
// used it. --max-rss-gb ends units `oom`; a lock held by another writer loses no results; the
// model digest is cached; old axis spellings resume under the new ones. Matrix: stories260K,
// NIAH at 128 tokens, depths 0 and 100, full + h2o + snapkv at 32 (6 units in 2 bundles).
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "common/sha256.h"
#include "mpi/mpirun.h"
#include "mpi/sweep_util.h"

namespace {

const std::string kBin = std::string(KVB_BINARY_DIR) + "/kvbench";
const std::string kShared = KVB_SHARED_DIR;

std::string write_config(const std::string& name, const std::string& extra = "") {
  const std::string path = std::string(KVB_BINARY_DIR) + "/" + name + ".yaml";
  std::ofstream out(path);
  out << "models:\n"
      << "  - name: stories260K\n"
      << "    path: " << kShared << "/models/stories260K/stories260K.bin\n"
      << "    tokenizer: " << kShared << "/models/stories260K/tok512.bin\n"
      << "tasks:\n"
      << "  - name: niah\n"
      << "    options: {context_lengths: [128], depths: [0, 100], haystack: noise, chat: false}\n"
      << "policies: [full, h2o, snapkv]\n"
      << "budgets: [32]\n"
      << "seeds: [0]\n"
      << extra;
  return path;
}

std::string db_path(const std::string& name) {
  const std::string p = std::string(KVB_BINARY_DIR) + "/" + name;
  for (const char* ext : {"", "-wal", "-shm"}) std::filesystem::remove(p + ext);
  return p;
}

// Units in flight, or -1 while the database is not there yet (the sweep is still creating it:
// no file, no schema, or its creation's lock).
int running_units(const std::string& db) {
  sqlite3* h = nullptr;
  int n = -1;
  if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(h, "SELECT COUNT(*) FROM units WHERE status = 'running'", -1, &st,
                           nullptr) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW) {
      n = sqlite3_column_int(st, 0);
    }
    sqlite3_finalize(st);
  }
  sqlite3_close(h);
  return n;
}

const char* kStatus = "SELECT status, COUNT(*) FROM units GROUP BY status";
const char* kRunStatus = "SELECT status, COUNT(*) FROM runs GROUP BY status";

using kvb::testing::mpirun;

int run(const std::string& cmd, std::string* output = nullptr) {
  return kvb::testing::run_command(cmd, "sweep_integrity_cmd.log", output);
}
std::map<std::string, std::string> query(const std::string& db, const std::string& sql) {
  return kvb::testing::query_pairs(db, sql);
}

class SweepIntegrity : public ::testing::TestWithParam<int> {};

TEST_P(SweepIntegrity, BadAllocEndsTheUnitOomAndTheSweepFinishes) {
  const int np = GetParam();
  const std::string config = write_config("integrity_oom");
  const std::string db = db_path("integrity_oom_np" + std::to_string(np) + ".db");
  setenv("KVB_FAULT_BAD_ALLOC", "len128_depth0_s0/h2o/32", 1);
  std::string out;
  const std::string launch = np > 1 ? mpirun(np, 300) : "";
  const int rc = run(launch + kBin + " sweep " + config + " --db " + db, &out);
  unsetenv("KVB_FAULT_BAD_ALLOC");
  EXPECT_EQ(rc, 1) << "exit 1: a unit failed (124 would be a hang stopped by timeout)\n" << out;
  EXPECT_EQ(query(db, kStatus), (std::map<std::string, std::string>{{"ok", "5"}, {"oom", "1"}}));
  EXPECT_EQ(query(db, kRunStatus), (std::map<std::string, std::string>{{"ok", "1"}}));
  const auto oom = query(db,
                         "SELECT sample_id || '/' || policy || '/' || kv_budget, error FROM units "
                         "WHERE status = 'oom'");
  ASSERT_EQ(oom.size(), 1u);
  EXPECT_EQ(oom.begin()->first, "len128_depth0_s0/h2o/32");
  EXPECT_NE(oom.begin()->second.find("out of host memory"), std::string::npos) << oom.begin()->second;
  // The failed unit has no result rows; the bundle's other units have theirs.
  EXPECT_EQ(query(db, "SELECT 'n', COUNT(*) FROM measurements").at("n"), "5");
  // `kvbench query failures` lists it under its status.
  ASSERT_EQ(run(kBin + " query --db " + db + " failures -o csv", &out), 0) << out;
  EXPECT_NE(out.find("len128_depth0_s0,h2o,32,oom,1,0,"), std::string::npos) << out;
}

// --max-rss-gb below any worker's resident set: every unit ends `oom` naming the cap, the sweep
// finishes (exit 1, nothing left running; under mpirun no hang), and `kvbench query
// failures-by-status` counts them. Values that are not a size are usage errors.
TEST_P(SweepIntegrity, MemoryCapEndsUnitsOomAndTheSweepFinishes) {
  const int np = GetParam();
  const std::string config = write_config("integrity_rss");
  const std::string db = db_path("integrity_rss_np" + std::to_string(np) + ".db");
  std::string out;
  const std::string launch = np > 1 ? mpirun(np, 300) : "";
  const int rc = run(launch + kBin + " sweep " + config + " --db " + db + " --max-rss-gb 0.001",
                     &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_EQ(query(db, kStatus), (std::map<std::string, std::string>{{"oom", "6"}}));
  EXPECT_EQ(query(db, kRunStatus), (std::map<std::string, std::string>{{"ok", "1"}}));
  EXPECT_EQ(query(db, "SELECT 'n', SUM(instr(error, 'MiB, is above the cap of 1 MiB (--max-rss-gb') "
                      "> 0) FROM units").at("n"),
            "6");
  ASSERT_EQ(run(kBin + " query --db " + db + " failures-by-status -o csv", &out), 0) << out;
  EXPECT_NE(out.find("status,units,policies,messages,most_common_error\noom,6,full h2o snapkv,"),
            std::string::npos)
      << out;
  for (const char* bad : {"-1", "nan", "inf", "2e6"}) {
    EXPECT_EQ(run(kBin + " sweep " + config + " --db " + db + " --max-rss-gb " + bad, &out), 2)
        << bad;
    EXPECT_NE(out.find("--max-rss-gb must be a number of GiB"), std::string::npos) << out;
  }
}

// --rerun-status oom runs the oom unit again (without the fault it ends ok) and leaves the
// others alone; a status that is not a finished one is a usage error.
TEST(SweepIntegrityRerun, RerunStatusRunsOnlyThoseUnits) {
  const std::string config = write_config("integrity_rerun");
  const std::string db = db_path("integrity_rerun.db");
  setenv("KVB_FAULT_BAD_ALLOC", "len128_depth100_s0/full/0", 1);
  EXPECT_EQ(run(kBin + " sweep " + config + " --db " + db), 1);
  unsetenv("KVB_FAULT_BAD_ALLOC");
  ASSERT_EQ(query(db, kStatus), (std::map<std::string, std::string>{{"ok", "5"}, {"oom", "1"}}));
  std::string out;
  EXPECT_EQ(run(kBin + " sweep " + config + " --db " + db + " --rerun-status error,oom", &out), 0)
      << out;
  EXPECT_EQ(query(db, kStatus), (std::map<std::string, std::string>{{"ok", "6"}}));
  // Only the oom unit was handed out again.
  EXPECT_EQ(query(db, "SELECT sample_id || '/' || policy, attempts FROM units WHERE attempts > 1"),
            (std::map<std::string, std::string>{{"len128_depth100_s0/full", "2"}}));
  EXPECT_EQ(run(kBin + " sweep " + config + " --db " + db + " --rerun-status running", &out), 2);
  EXPECT_NE(out.find("'running' is not a finished unit status"), std::string::npos) << out;
  EXPECT_EQ(run(kBin + " sweep " + config + " --db " + db + " --rerun --rerun-status ok", &out), 2);
}

INSTANTIATE_TEST_SUITE_P(OneProcessAndThreeRanks, SweepIntegrity, ::testing::Values(1, 3),
                         [](const auto& info) { return "np" + std::to_string(info.param); });

TEST(SweepIntegrityTimeLimit, SlowSharedPrefillTimesOutEveryUnitThatUsedIt) {
  const std::string config = write_config("integrity_slow", "unit_time_limit_s: 0.5\n");
  const std::string db = db_path("integrity_slow.db");
  setenv("KVB_FAULT_SLOW_SHARED_PREFILL_MS", "1000", 1);
  std::string out;
  const int rc = run(kBin + " sweep " + config + " --db " + db, &out);
  unsetenv("KVB_FAULT_SLOW_SHARED_PREFILL_MS");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_EQ(query(db, kStatus), (std::map<std::string, std::string>{{"timeout", "6"}}));
  const auto why = query(db, "SELECT 'e', MIN(instr(error, 'in the prefill shared') > 0) FROM units");
  EXPECT_EQ(why.at("e"), "1");
}

// Another writer holds the database lock for 20 s, longer than the store's 10 s busy timeout,
// while a bundle runs: the coordinator keeps the finished bundle and writes it once the lock is
// free (before: the write failed, the sweep aborted and the bundle's results were lost, its units
// left `running`).
TEST(SweepIntegrityLock, AnotherWriterHoldingTheLockLosesNoResults) {
  const std::string config = write_config("integrity_lock");
  const std::string db = db_path("integrity_lock.db");
  // Each bundle takes 3 s, a window in which to take the lock.
  setenv("KVB_FAULT_SLOW_SHARED_PREFILL_MS", "3000", 1);
  int rc = -1;
  std::string out;
  std::thread sweep([&] { rc = run(kBin + " sweep " + config + " --db " + db, &out); });
  bool locked = false;
  for (int i = 0; i < 600 && !locked; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!std::filesystem::exists(db) || running_units(db) <= 0) continue;
    sqlite3* h = nullptr;
    ASSERT_EQ(sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
    sqlite3_busy_timeout(h, 30000);
    ASSERT_EQ(sqlite3_exec(h, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK)
        << sqlite3_errmsg(h);
    locked = true;
    std::this_thread::sleep_for(std::chrono::seconds(20));
    EXPECT_EQ(sqlite3_exec(h, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(h);
  }
  sweep.join();
  unsetenv("KVB_FAULT_SLOW_SHARED_PREFILL_MS");
  ASSERT_TRUE(locked) << "the sweep never had a unit in flight\n" << out;
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(query(db, kStatus), (std::map<std::string, std::string>{{"ok", "6"}}));
  EXPECT_EQ(query(db, kRunStatus), (std::map<std::string, std::string>{{"ok", "1"}}));
  EXPECT_EQ(query(db, "SELECT 'n', COUNT(*) FROM measurements").at("n"), "6");
  EXPECT_NE(out.find("is locked"), std::string::npos) << "the wait is logged\n" << out;
}

// One name per axis (issue 14 item 4): a database swept with the old spellings (budgets:, seeds:)
// resumes under the new ones (kv_budget:, seed:) with nothing to run, since the unit keys are the
// same; the sweep logs the deprecation note for the old file.
TEST(SweepIntegrityAxisNames, NewSpellingResumesADatabaseOfTheOld) {
  const std::string old_config = write_config("integrity_axes_old");
  const std::string db = db_path("integrity_axes.db");
  std::string out;
  ASSERT_EQ(run(kBin + " sweep " + old_config + " --db " + db, &out), 0) << out;
  EXPECT_NE(out.find(old_config + ":9: budgets is a deprecated spelling; write kv_budget:"),
            std::string::npos)
      << out;
  std::string text;
  {
    std::ifstream in(old_config);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"budgets:", "kv_budget:"},
                                 {"seeds:", "seed:"}}) {
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
  }
  const std::string new_config = std::string(KVB_BINARY_DIR) + "/integrity_axes_new.yaml";
  std::ofstream(new_config) << text;
  ASSERT_EQ(run(kBin + " sweep " + new_config + " --db " + db + " --resume", &out), 0) << out;
  EXPECT_NE(out.find("6 units in the matrix, 0 to run"), std::string::npos) << out;
  EXPECT_EQ(out.find("deprecated"), std::string::npos) << out;
  EXPECT_EQ(query(db, kStatus), (std::map<std::string, std::string>{{"ok", "6"}}));
  EXPECT_EQ(query(db, "SELECT 'max', MAX(attempts) FROM units").at("max"), "1");
}

// Model hashing at sweep start (issue 14 item 6): the first start reads the model file, a resume
// takes its digest from the database (logged, never timed), and the run records the digests its
// unit keys were made from (runs.model_hashes was '{}' before).
TEST(SweepIntegrityDigest, ResumeTakesTheModelDigestFromTheDatabase) {
  const std::string config = write_config("integrity_digest");
  const std::string db = db_path("integrity_digest.db");
  const std::string model = kShared + "/models/stories260K/stories260K.bin";
  std::string out;
  ASSERT_EQ(run(kBin + " sweep " + config + " --db " + db, &out), 0) << out;
  EXPECT_NE(out.find("stories260K.bin: hashing"), std::string::npos) << out;
  EXPECT_EQ(out.find("from the digest cache"), std::string::npos) << out;
  ASSERT_EQ(run(kBin + " sweep " + config + " --db " + db + " --resume", &out), 0) << out;
  EXPECT_NE(out.find("stories260K.bin: SHA-256 from the digest cache"), std::string::npos) << out;
  EXPECT_EQ(out.find("hashing"), std::string::npos) << out;
  const std::string sha = kvb::sha256_file(model);
  EXPECT_EQ(query(db, "SELECT run_id, model_hashes FROM runs"),
            (std::map<std::string, std::string>{{"1", "{\"stories260K\":\"" + sha + "\"}"},
                                                {"2", "{\"stories260K\":\"" + sha + "\"}"}}));
  EXPECT_EQ(query(db, "SELECT 'n', COUNT(DISTINCT model_sha256) || ' ' || MIN(model_sha256) "
                      "FROM units").at("n"),
            "1 " + sha);
}

}  // namespace
