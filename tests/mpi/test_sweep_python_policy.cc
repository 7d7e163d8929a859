// Policy `python` in a sweep, through the real binary as a user runs it (one process and under
// mpirun -np 3). A matrix of stories260K, NIAH at 128 tokens (depths 0 and 100: 2 samples, each
// one bundle), kv_budget 32 and seven policies: `window`, knorm.py (examples/policies, a good
// module) and five hostile modules (raises, loops forever under time_limit_s: 2, allocates
// without bound under memory_limit_gb: 0.5, imports a missing module, returns the wrong shape):
// 14 units. Every script sits beside the config and is named by a RELATIVE path, and the sweep
// is started from the folder above with a relative config path (`kvbench sweep cfg/sweep.yaml`;
// before the fix in harness/sweep_plan.cc that was a usage error, the path resolved twice to
// cfg/cfg/knorm.py).
//
// What holds: the sweep finishes in bounded time and exits 1 (units failed); the `window` and
// knorm.py units are ok with their result rows, each hostile unit has its typed row (error, or
// oom for the MemoryError; a policy's own time limit is an `error`, not a `timeout`: `timeout`
// is the unit time limit's, unit_time_limit_s) whose message names the script and the function
// (score() or loading the module); under mpirun no rank died: every unit has a finished row,
// the run is `ok`, and the statuses equal the single process's. Then the unit keys follow the
// script's content: after an edit to knorm.py only its 2 units run again; the config and its
// scripts moved to another folder (same database) run nothing.
//
// Two further hostile modules: one that breaks the contract at load (no score(), an undeclared
// option) fails only its own units; a score() that catches what the watchdog raises with
// `except Exception` is still stopped (PolicyTimeout is a BaseException, raised again every
// 100 ms).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "mpi/mpirun.h"
#include "mpi/sweep_util.h"

namespace {

namespace fs = std::filesystem;

const std::string kBin = std::string(KVB_BINARY_DIR) + "/kvbench";
const std::string kShared = KVB_SHARED_DIR;
const std::string kKnorm = std::string(KVB_EXAMPLES_DIR) + "/policies/knorm.py";

using kvb::testing::mpirun;

// A fresh scratch folder (canonical: the policy's messages name its scripts by absolute path).
std::string scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() /
                       ("kvb_sweep_python_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "cfg");
  return fs::canonical(dir).string();
}

// The hostile modules: file name -> body.
const std::map<std::string, std::string>& hostile_modules() {
  static const std::map<std::string, std::string> m = {
      {"raises.py", "def score(ctx):\n    raise ValueError('hostile module says no')\n"},
      {"forever.py", "def score(ctx):\n    while True:\n        pass\n"},
      {"greedy.py",
       "import numpy\nheld = []\ndef score(ctx):\n    while True:\n"
       "        held.append(numpy.ones(10**7))\n"},
      {"missing_import.py",
       "import kvbench_no_such_module\nimport numpy as np\ndef score(ctx):\n"
       "    return -np.linalg.norm(ctx.keys, axis=-1)\n"},
      {"shape.py", "import numpy as np\ndef score(ctx):\n    return np.zeros((1, 2), np.float32)\n"},
  };
  return m;
}

// Writes <dir>/cfg/sweep.yaml with these policies (YAML list items); returns the config's path
// relative to `dir`.
std::string write_config(const std::string& dir, const std::string& policies) {
  std::ofstream out(dir + "/cfg/sweep.yaml");
  out << "models:\n"
      << "  - name: stories260K\n"
      << "    path: " << kShared << "/models/stories260K/stories260K.bin\n"
      << "    tokenizer: " << kShared << "/models/stories260K/tok512.bin\n"
      << "tasks:\n"
      << "  - name: niah\n"
      << "    options: {context_lengths: [128], depths: [0, 100], haystack: noise, chat: false}\n"
      << "policies:\n"
      << policies << "kv_budget: [32]\n"
      << "seed: [0]\n";
  return "cfg/sweep.yaml";
}

// The matrix of the file's comment: cfg/sweep.yaml and its scripts (knorm.py copied from
// examples/policies).
std::string write_sweep(const std::string& dir) {
  fs::copy_file(kKnorm, dir + "/cfg/knorm.py");
  for (const auto& [name, body] : hostile_modules()) std::ofstream(dir + "/cfg/" + name) << body;
  return write_config(dir,
                      "  - window\n"
                      "  - {name: python, options: {file: knorm.py}}\n"
                      "  - {name: python, options: {file: raises.py}}\n"
                      "  - {name: python, options: {file: forever.py, time_limit_s: 2}}\n"
                      "  - {name: python, options: {file: greedy.py, memory_limit_gb: 0.5}}\n"
                      "  - {name: python, options: {file: missing_import.py}}\n"
                      "  - {name: python, options: {file: shape.py}}\n");
}

// sample/policy -> `column` of every unit, where policy is `window` or the script's file name.
std::map<std::string, std::string> by_unit(const std::string& db, const std::string& column) {
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : kvb::testing::query_pairs(
           db, "SELECT sample_id || '/' || coalesce(json_extract(policy_options, '$.file'), "
               "policy), coalesce(" + column + ", '') FROM units")) {
    const size_t slash = key.find('/');
    out[key.substr(0, slash) + "/" + fs::path(key.substr(slash + 1)).filename().string()] = value;
  }
  return out;
}

std::map<std::string, std::string> expected_statuses() {
  std::map<std::string, std::string> want;
  for (const char* s : {"len128_depth0_s0", "len128_depth100_s0"}) {
    const std::string p = std::string(s) + "/";
    want[p + "window"] = "ok";
    want[p + "knorm.py"] = "ok";
    want[p + "raises.py"] = "error";
    want[p + "forever.py"] = "error";  // the policy's own time limit: an error (not `timeout`)
    want[p + "greedy.py"] = "oom";     // MemoryError: ErrorKind::kOutOfMemory
    want[p + "missing_import.py"] = "error";
    want[p + "shape.py"] = "error";
  }
  return want;
}

// What each hostile unit's message must hold after "python policy <dir>/cfg/<file>: ".
std::map<std::string, std::string> expected_messages(const std::string& dir) {
  return {
      {"raises.py", "score() raised ValueError: hostile module says no (at " + dir +
                        "/cfg/raises.py:2)"},
      {"forever.py",
       "score() exceeded its time limit of 2 s and was stopped (policy option time_limit_s)"},
      {"greedy.py", "score() ran out of memory: MemoryError"},
      {"missing_import.py",
       "loading the module raised ModuleNotFoundError: No module named "
       "'kvbench_no_such_module'"},
      {"shape.py", "score() returned shape [1, 2]; it must return a numpy float32 array"},
  };
}

// One sweep from `dir` (cwd) of the relative config `config`; returns the exit status, the
// output in *out and the wall time in *seconds.
int sweep(const std::string& launch, const std::string& dir, const std::string& config,
          const std::string& log, std::string* out, double* seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = kvb::testing::run_command(
      "cd " + dir + " && " + launch + kBin + " sweep " + config + " --db run.db", log, out);
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rc;
}

// The checks every run of the matrix must pass (one process or under mpirun).
void check_rows(const std::string& dir) {
  const std::string db = dir + "/run.db";
  EXPECT_EQ(by_unit(db, "status"), expected_statuses());
  // No unit left in flight or pending: every rank came back; the run ended `ok`.
  EXPECT_EQ(kvb::testing::query_pairs(db, "SELECT 'n', COUNT(*) FROM units WHERE status IN "
                                          "('pending', 'running', 'crashed')")
                .at("n"),
            "0");
  EXPECT_EQ(kvb::testing::query_pairs(db, "SELECT status, COUNT(*) FROM runs GROUP BY status"),
            (std::map<std::string, std::string>{{"ok", "1"}}));
  // The ok units (window, knorm.py) have their result rows; the failed ones none.
  EXPECT_EQ(kvb::testing::query_pairs(db, "SELECT 'n', COUNT(*) FROM measurements").at("n"), "4");
  const auto errors = by_unit(db, "error");
  for (const auto& [key, message] : errors) {
    const std::string file = key.substr(key.find('/') + 1);
    if (file == "window" || file == "knorm.py") {
      EXPECT_EQ(message, "") << key;
      continue;
    }
    SCOPED_TRACE(key);
    const std::string head = "python policy " + dir + "/cfg/" + file + ": ";
    EXPECT_NE(message.find(head), std::string::npos) << message;
    EXPECT_NE(message.find(head + expected_messages(dir).at(file)), std::string::npos) << message;
    if (file == "greedy.py") {
      EXPECT_NE(message.find("policy option memory_limit_gb"), std::string::npos) << message;
    }
  }
}

class SweepPythonPolicy : public ::testing::TestWithParam<int> {};

// The hostile modules fail only their own units, each with its typed row, in bounded time.
TEST_P(SweepPythonPolicy, HostileModulesEndTheirUnitsTypedAndTheSweepFinishes) {
  const int np = GetParam();
  const std::string dir = scratch("hostile_np" + std::to_string(np));
  const std::string config = write_sweep(dir);
  std::string out;
  double seconds = 0;
  // A hang (a time limit not enforced, a rank stuck) ends at 240 s as exit 124.
  const std::string launch = np > 1 ? mpirun(np, 240) : "timeout -k 10 240 ";
  const int rc = sweep(launch, dir, config, "sweep_python_np" + std::to_string(np) + ".log", &out,
                       &seconds);
  EXPECT_EQ(rc, 1) << "exit 1: units failed (124: stopped by timeout; 2: a usage error)\n" << out;
  EXPECT_NE(out.find("14 units in the matrix, 14 to run in 2 bundles"), std::string::npos) << out;
  EXPECT_NE(out.find("10 of 14 units of this run did not finish ok"), std::string::npos) << out;
  // The two time-limited calls take 2 s each; the rest is well under a second per unit alone.
  EXPECT_LT(seconds, 90) << out;
  // The full traceback of a failure goes to the log.
  EXPECT_NE(out.find("ModuleNotFoundError: No module named 'kvbench_no_such_module'"),
            std::string::npos)
      << out;
  check_rows(dir);
  if (!HasFailure()) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(OneProcessAndThreeRanks, SweepPythonPolicy, ::testing::Values(1, 3),
                         [](const auto& info) { return "np" + std::to_string(info.param); });

// The script's content is in the unit key, its path is not (harness/policy_files.h): an edited
// knorm.py runs its 2 units again and nothing else (the hostile units' finished rows are kept
// as well); the config and scripts moved elsewhere with the same database run nothing. The
// first sweep names the config by its absolute path, the second by a relative one, the third
// by the moved folder's: the same keys whatever the spelling.
TEST(SweepPythonPolicyKeys, TheScriptsContentIsInTheUnitKeyItsPathIsNot) {
  const std::string dir = scratch("keys");
  const std::string config = write_sweep(dir);
  const std::string db = dir + "/run.db";
  std::string out;
  double seconds = 0;
  ASSERT_EQ(sweep("", dir, dir + "/" + config, "sweep_python_keys1.log", &out, &seconds), 1)
      << out;
  ASSERT_EQ(by_unit(db, "status"), expected_statuses());
  // Edited (a comment appended): another content, other keys.
  std::ofstream(dir + "/cfg/knorm.py", std::ios::app) << "# tuned\n";
  ASSERT_EQ(sweep("", dir, config, "sweep_python_keys2.log", &out, &seconds), 0) << out;
  EXPECT_NE(out.find("14 units in the matrix, 2 to run in 2 bundles"), std::string::npos) << out;
  // Exactly the edited script's units ran in run 2, and ended ok.
  EXPECT_EQ(kvb::testing::query_pairs(
                db, "SELECT sample_id || '/' || json_extract(policy_options, '$.file'), status "
                    "FROM units WHERE run_id = 2"),
            (std::map<std::string, std::string>{{"len128_depth0_s0/cfg/knorm.py", "ok"},
                                                {"len128_depth100_s0/cfg/knorm.py", "ok"}}));
  // 14 keys of the first content, 2 more of the second; nobody ran twice.
  EXPECT_EQ(kvb::testing::query_pairs(db, "SELECT 'n', COUNT(*) || ' ' || MAX(attempts) FROM units")
                .at("n"),
            "16 1");
  // Moved (config and scripts, not the database): nothing to run.
  fs::create_directories(dir + "/elsewhere");
  fs::rename(dir + "/cfg", dir + "/elsewhere/moved");
  ASSERT_EQ(sweep("", dir, "elsewhere/moved/sweep.yaml", "sweep_python_keys3.log", &out, &seconds),
            0)
      << out;
  EXPECT_NE(out.find("14 units in the matrix, 0 to run in 0 bundles"), std::string::npos) << out;
  EXPECT_EQ(kvb::testing::query_pairs(db, "SELECT 'n', COUNT(*) FROM units WHERE run_id = 3")
                .at("n"),
            "0");
  EXPECT_EQ(kvb::testing::query_pairs(db, "SELECT 'n', COUNT(*) FROM units").at("n"), "16");
  if (!HasFailure()) fs::remove_all(dir);
}

// ---- known bugs in kernels/policies (disabled until fixed; run with
// --gtest_also_run_disabled_tests) ---------------------------------------------------------

// A module whose load fails with a usage error (no score(), an option its OPTIONS do not
// declare) must fail only its own units. Today PythonPolicy::load keeps the error's kind,
// kUsage, and rethrows it from begin_sequence; run_bundle rethrows usage errors out of the
// bundle, and BundleRunner fails every unit of the bundle with that message, so the `window`
// units beside it end `error` ("python policy .../no_score.py defines no function score(ctx)").
TEST(SweepPythonPolicyHostile, AModuleThatFailsToLoadFailsOnlyItsOwnUnits) {
  const std::string dir = scratch("load_usage");
  std::ofstream(dir + "/cfg/no_score.py") << "def scores(ctx):\n    pass\n";
  std::ofstream(dir + "/cfg/bad_option.py")
      << "import numpy as np\nOPTIONS = {'alpha2': 1.0}\ndef score(ctx):\n"
         "    return -np.linalg.norm(ctx.keys, axis=-1)\n";
  const std::string config = write_config(dir,
                                          "  - window\n"
                                          "  - {name: python, options: {file: no_score.py}}\n"
                                          "  - {name: python, options: {file: bad_option.py, "
                                          "beta2: 3}}\n");
  std::string out;
  double seconds = 0;
  EXPECT_EQ(sweep("timeout -k 10 120 ", dir, config, "sweep_python_load_usage.log", &out,
                  &seconds),
            1)
      << out;
  const std::string db = dir + "/run.db";
  std::map<std::string, std::string> want;
  for (const char* s : {"len128_depth0_s0/", "len128_depth100_s0/"}) {
    want[std::string(s) + "window"] = "ok";
    want[std::string(s) + "no_score.py"] = "error";
    want[std::string(s) + "bad_option.py"] = "error";
  }
  EXPECT_EQ(by_unit(db, "status"), want);
  for (const auto& [key, message] : by_unit(db, "error")) {
    if (key.ends_with("/no_score.py")) {
      EXPECT_NE(message.find("defines no function score(ctx)"), std::string::npos) << message;
    } else if (key.ends_with("/bad_option.py")) {
      EXPECT_NE(message.find("unknown option 'beta2'"), std::string::npos) << message;
    } else {
      EXPECT_EQ(message, "") << key;
    }
  }
  if (!HasFailure()) fs::remove_all(dir);
}

// A score() that catches every Exception in a retry loop must still be stopped: the watchdog's
// PolicyTimeout is a BaseException, raised again every 100 ms until the call returns (a sweep
// that hung would be stopped by `timeout` at 60 s: exit 124).
TEST(SweepPythonPolicyHostile, AScoreThatCatchesExceptionIsStillStopped) {
  const std::string dir = scratch("swallow");
  std::ofstream(dir + "/cfg/swallow.py") << "def score(ctx):\n"
                                            "    while True:\n"
                                            "        try:\n"
                                            "            while True:\n"
                                            "                pass\n"
                                            "        except Exception:\n"
                                            "            continue\n";
  const std::string config =
      write_config(dir, "  - window\n  - {name: python, options: {file: swallow.py, "
                        "time_limit_s: 2}}\n");
  std::string out;
  double seconds = 0;
  EXPECT_EQ(sweep("timeout -k 5 60 ", dir, config, "sweep_python_swallow.log", &out, &seconds), 1)
      << "124: the sweep hung\n"
      << out;
  std::map<std::string, std::string> want;
  for (const char* s : {"len128_depth0_s0/", "len128_depth100_s0/"}) {
    want[std::string(s) + "window"] = "ok";
    want[std::string(s) + "swallow.py"] = "error";
  }
  EXPECT_EQ(by_unit(dir + "/run.db", "status"), want);
  if (!HasFailure()) fs::remove_all(dir);
}

}  // namespace
