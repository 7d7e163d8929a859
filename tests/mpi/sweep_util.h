// Helpers shared by the sweep tests of tests/mpi/: running a command line and reading a results
// database with raw SQLite (independent of kvbench's own Store).
#pragma once

#include <sqlite3.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace kvb::testing {

// Runs a shell command with stdout and stderr into KVB_BINARY_DIR/<log_name> (or nowhere when
// log_name is empty); *output gets what it printed. Returns its exit status (128 + signal when
// a signal ended it).
inline int run_command(const std::string& cmd, const std::string& log_name,
                       std::string* output = nullptr) {
  const std::string log =
      log_name.empty() ? "/dev/null" : std::string(KVB_BINARY_DIR) + "/" + log_name;
  const int rc = std::system((cmd + " > " + log + " 2>&1").c_str());
  if (output && !log_name.empty()) {
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    *output = ss.str();
  }
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

// First column -> second column of a query's rows, read-only. The reader waits for the lock as
// kvbench's own readers do (a sweep may be creating or writing the database).
inline std::map<std::string, std::string> query_pairs(const std::string& db,
                                                      const std::string& sql) {
  sqlite3* h = nullptr;
  EXPECT_EQ(sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK) << db;
  sqlite3_busy_timeout(h, 10000);
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(h, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sqlite3_errmsg(h);
  std::map<std::string, std::string> out;
  while (sqlite3_step(st) == SQLITE_ROW) {
    const auto* k = sqlite3_column_text(st, 0);
    const auto* v = sqlite3_column_text(st, 1);
    out[k ? reinterpret_cast<const char*>(k) : ""] = v ? reinterpret_cast<const char*>(v) : "";
  }
  sqlite3_finalize(st);
  sqlite3_close(h);
  return out;
}

}  // namespace kvb::testing
