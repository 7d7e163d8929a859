// Tensor-parallel worker groups (issue "Multi-GPU workers"), through the real binary under
// mpirun, on configs/ci_tp.yaml (stories260K and a random-weight model with 8 KV heads):
//   mpirun -np 4 kvbench sweep configs/ci_tp.yaml --gpus-per-worker 2 --device cpu
// (one group of 2 plus an idle leftover rank) and -np 5 --gpus-per-worker 4 give the same
// results as one rank per worker (mpirun -np 2): every unit ok; the same predictions, the same
// task metrics (bit for bit, except the perplexity task's log-likelihood sums, which are
// continuous in the logits and may move in the last bits with the all-reduce's summation order:
// those within 1e-6 relative; f32 epsilon is 1.2e-7), the same KV measurements, and the same
// keep-set of every (layer, global KV head) of every unit (KVB_DUMP_KEEPSETS). Policies: full,
// snapkv, ada_snapkv, h2o. Bad degrees, a missing group, --device cuda with groups (and without
// a CUDA build or a GPU) are refused with errors.
// The config is the committed one with the random model written into the build folder.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#ifdef KVB_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif
#include "mpi/mpirun.h"
#include "mpi/sweep_util.h"
#include "tp_test_model.h"

namespace {

namespace fs = std::filesystem;
const std::string kBin = std::string(KVB_BINARY_DIR) + "/kvbench";
const std::string kCommitted = std::string(KVB_FIXTURES_DIR) + "/../../configs/ci_tp.yaml";
// The committed config with its random model in the build folder (it expects it at
// models/random-llama-8kv.gguf; a test writes only into the build folder) and absolute paths.
const std::string kConfig = std::string(KVB_BINARY_DIR) + "/ci_tp.yaml";
const std::string kModel = std::string(KVB_BINARY_DIR) + "/random-llama-8kv.gguf";

std::string replace_all(std::string s, const std::string& from, const std::string& to, int* n) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
    ++*n;
  }
  return s;
}

// Writes the model and the config variant; false if the committed config changed shape.
bool write_model_and_config() {
  if (!kvb::testing::write_random_llama_gguf(kModel)) return false;
  std::ifstream in(kCommitted);
  std::stringstream ss;
  ss << in.rdbuf();
  int models = 0, shared = 0;
  std::string text = replace_all(ss.str(), "../models/random-llama-8kv.gguf", kModel, &models);
  text = replace_all(text, "../../shared/", std::string(KVB_SHARED_DIR) + "/", &shared);
  std::ofstream out(kConfig);
  out << text;
  return models == 1 && shared >= 3 && out.good();
}

using kvb::testing::mpirun;

int run(const std::string& cmd, std::string* output = nullptr) {
  return kvb::testing::run_command(cmd, "sweep_tp_cmd.log", output);
}

// Rows of (key, a, b) from a query.
std::map<std::string, std::pair<std::string, std::string>> query(const std::string& db,
                                                                 const std::string& sql) {
  sqlite3* h = nullptr;
  EXPECT_EQ(sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK) << db;
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(h, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sqlite3_errmsg(h);
  std::map<std::string, std::pair<std::string, std::string>> out;
  auto text = [&](int i) {
    const auto* t = sqlite3_column_text(st, i);
    return t ? std::string(reinterpret_cast<const char*>(t)) : std::string();
  };
  while (sqlite3_step(st) == SQLITE_ROW)
    out[text(0)] = {text(1), sqlite3_column_count(st) > 2 ? text(2) : ""};
  sqlite3_finalize(st);
  sqlite3_close(h);
  return out;
}

const char* kMetrics =
    "SELECT m.unit_key || '/' || m.name, u.task, printf('%.17g', m.value) FROM metrics m "
    "JOIN units u ON u.unit_key = m.unit_key";
const char* kPredictions = "SELECT unit_key, prediction FROM predictions";
const char* kMeasurements =
    "SELECT unit_key, printf('%d %d %d %d %d %d %.17g %.17g %d %d %d', prompt_tokens, "
    "generated_tokens, kv_bytes_final, kv_bytes_peak, kv_physical_peak, policy_state_bytes, "
    "occupancy_mean, occupancy_final, occupancy_peak, occupancy_min_final, occupancy_max_final) "
    "FROM measurements";
const char* kStatus = "SELECT status, COUNT(*) FROM units GROUP BY status";

// unit key -> its keep-set lines ("layer head: positions") from every rank's dump, sorted.
std::map<std::string, std::vector<std::string>> keep_sets(const std::string& dir) {
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    const std::string key = name.substr(0, name.rfind(".tp"));
    std::ifstream in(e.path());
    for (std::string line; std::getline(in, line);) out[key].push_back(line);
  }
  for (auto& [k, v] : out) std::sort(v.begin(), v.end());
  return out;
}

struct Sweep {
  std::string db, dumps, log;
  int rc = -1;
};

// One sweep of ci_tp.yaml into a fresh database, with keep-set dumps.
Sweep sweep(const std::string& name, const std::string& launcher, const std::string& flags) {
  Sweep s;
  s.db = std::string(KVB_BINARY_DIR) + "/" + name + ".db";
  for (const char* ext : {"", "-wal", "-shm"}) fs::remove(s.db + ext);
  s.dumps = std::string(KVB_BINARY_DIR) + "/" + name + "_keep";
  fs::remove_all(s.dumps);
  fs::create_directories(s.dumps);
  s.rc = run("KVB_DUMP_KEEPSETS=" + s.dumps + " " + launcher + kBin + " sweep " + kConfig +
                 " --db " + s.db + " --threads 1 " + flags,
             &s.log);
  return s;
}

class SweepTp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(write_model_and_config()) << "configs/ci_tp.yaml no longer names "
                                             "../models/random-llama-8kv.gguf and ../../shared/";
    reference_ = new Sweep(sweep("sweep_tp_ref", mpirun(2), ""));  // one rank per worker
  }
  static void TearDownTestSuite() { delete reference_; }

  // Everything a tensor-parallel sweep must share with the reference.
  static void expect_same_as_reference(const Sweep& s) {
    const Sweep& ref = *reference_;
    ASSERT_EQ(ref.rc, 0) << ref.log;
    ASSERT_EQ(s.rc, 0) << s.log;
    EXPECT_EQ(query(s.db, kStatus), (decltype(query(s.db, kStatus)){{"ok", {"40", ""}}}));
    EXPECT_EQ(query(s.db, kPredictions), query(ref.db, kPredictions));
    EXPECT_EQ(query(s.db, kMeasurements), query(ref.db, kMeasurements));
    const auto a = query(ref.db, kMetrics), b = query(s.db, kMetrics);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_GT(a.size(), 60u);
    int near = 0;
    for (const auto& [key, v] : a) {
      ASSERT_TRUE(b.count(key)) << key;
      const std::string& metric = key.substr(key.find('/') + 1);
      const bool continuous = v.first == "perplexity" && metric.rfind("tokens", 0) != 0;
      if (!continuous) {
        EXPECT_EQ(b.at(key).second, v.second) << key;
        continue;
      }
      const double x = std::stod(v.second), y = std::stod(b.at(key).second);
      EXPECT_NEAR(y, x, 1e-6 * std::fabs(x)) << key;
      near += b.at(key).second != v.second;
    }
    std::cerr << "perplexity sums that differ in the last bits: " << near << "\n";
    const auto ka = keep_sets(ref.dumps), kb = keep_sets(s.dumps);
    EXPECT_EQ(ka.size(), 40u);
    EXPECT_EQ(ka, kb);
  }

  static Sweep* reference_;
};
Sweep* SweepTp::reference_ = nullptr;

TEST_F(SweepTp, TwoGpusPerWorkerEqualOneRankPerWorker) {
  const Sweep s = sweep("sweep_tp2", mpirun(4), "--gpus-per-worker 2 --device cpu");
  expect_same_as_reference(s);
  // The fourth rank fits no group: it says so, names -np values that fit, and the run ends.
  EXPECT_NE(s.log.find("size -np as 1 + a multiple of 2 (here -np 5 or -np 3)"), std::string::npos)
      << s.log;
  EXPECT_NE(s.log.find("worker group 0 rank 1/2"), std::string::npos) << s.log;
  // Keep-set files come from both ranks of the group.
  EXPECT_TRUE(fs::exists(s.dumps + "/" + keep_sets(s.dumps).begin()->first + ".tp1"));
  // The rank-order reduction is deterministic: a second run gives the same bits everywhere.
  const Sweep again = sweep("sweep_tp2_again", mpirun(3), "--gpus-per-worker 2 --device cpu");
  ASSERT_EQ(again.rc, 0) << again.log;
  EXPECT_EQ(query(again.db, kMetrics), query(s.db, kMetrics));
  EXPECT_EQ(keep_sets(again.dumps), keep_sets(s.dumps));
}

TEST_F(SweepTp, FourGpusPerWorkerEqualOneRankPerWorker) {
  expect_same_as_reference(sweep("sweep_tp4", mpirun(5), "--gpus-per-worker 4 --device cpu"));
}

// A runtime error on one rank of a group (as an out-of-memory on one GPU would be) must stop the
// job, not leave the other rank waiting in a collective forever; --resume then finishes it.
TEST_F(SweepTp, OneRanksErrorStopsTheJobAndResumeFinishesIt) {
  const std::string db = std::string(KVB_BINARY_DIR) + "/sweep_tp_fault.db";
  for (const char* ext : {"", "-wal", "-shm"}) fs::remove(db + ext);
  const std::string cmd = kBin + " sweep " + kConfig + " --db " + db +
                          " --threads 1 --gpus-per-worker 2 --device cpu";
  std::string out;
  setenv("KVB_FAULT_THROW_SAMPLE", "len192_depth0_s0@1", 1);
  const int rc = run(mpirun(3, 120) + cmd, &out);
  unsetenv("KVB_FAULT_THROW_SAMPLE");
  EXPECT_NE(rc, kvb::testing::kTimedOut) << "the group hung instead of stopping:\n" << out;
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("worker group rank 1/2, sample len192_depth0_s0: fault injection"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("rerun with --resume"), std::string::npos) << out;
  EXPECT_TRUE(query(db, kStatus).count("running")) << "the bundle's units stay in flight";
  ASSERT_EQ(run(mpirun(3) + cmd + " --resume", &out), 0) << out;
  EXPECT_EQ(query(db, kStatus), (decltype(query(db, kStatus)){{"ok", {"40", ""}}}));
}

// The unit time limit inside a tensor-parallel group (issue 31): the ranks agree at every check,
// also between the layers of the shared prefill, so a limit that the shared prefill alone runs
// past stops it on every rank at the same layer; each unit ends `timeout` saying where, no rank
// dies or waits, and the sweep finishes (exit 1: units failed).
TEST_F(SweepTp, TimeLimitDuringTheSharedPrefillStopsEveryRankTogether) {
  const std::string config = std::string(KVB_BINARY_DIR) + "/ci_tp_time_limit.yaml";
  {
    std::ifstream in(kConfig);
    std::ofstream out(config);
    out << in.rdbuf() << "unit_time_limit_s: 0.000001\n";
  }
  const std::string db = std::string(KVB_BINARY_DIR) + "/sweep_tp_time_limit.db";
  for (const char* ext : {"", "-wal", "-shm"}) fs::remove(db + ext);
  std::string out;
  const int rc = run(mpirun(3, 120) + kBin + " sweep " + config + " --db " + db +
                         " --threads 1 --gpus-per-worker 2 --device cpu",
                     &out);
  EXPECT_NE(rc, kvb::testing::kTimedOut) << "the group hung:\n" << out;
  EXPECT_EQ(rc, 1) << out;
  EXPECT_EQ(query(db, kStatus), (decltype(query(db, kStatus)){{"timeout", {"40", ""}}}));
  // The NIAH units (the shared prefill's) say that it stopped between layers.
  const auto stopped = query(db,
                             "SELECT task, COUNT(*) FROM units WHERE instr(error, 'stopped in the "
                             "prefill shared with the sample''s other policies before layer ') > 0 "
                             "GROUP BY task");
  EXPECT_EQ(stopped, (decltype(stopped){{"niah", {"32", ""}}})) << out;
}

TEST_F(SweepTp, BadLayoutsAreRefused) {
  std::string out;
  // 3 divides neither model's KV heads: the error names the model, its numbers, what fits.
  EXPECT_EQ(run(kBin + " validate " + kConfig + " --gpus-per-worker 3", &out), 2);
  EXPECT_NE(out.find("model stories260K cannot be split over 3 GPUs per worker: its 4 KV heads "
                     "do not divide by 3"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("valid --gpus-per-worker values for it: 1, 2, 4"), std::string::npos) << out;
  EXPECT_NE(run(mpirun(4, 90) + kBin + " sweep " + kConfig + " --db " + KVB_BINARY_DIR +
                    "/sweep_tp_bad.db --gpus-per-worker 3",
                &out),
            0);
  EXPECT_NE(out.find("cannot be split over 3 GPUs"), std::string::npos) << out;
  EXPECT_EQ(run(kBin + " sweep " + kConfig + " --db x.db --gpus-per-worker 2", &out), 2);
  EXPECT_NE(out.find("needs mpirun with at least 3 ranks"), std::string::npos) << out;
  // --device cuda: tensor-parallel groups stay on CPU ranks; one GPU per worker needs a CUDA
  // build ("this build has no CUDA", a usage error) and a visible GPU ("no GPU visible").
  EXPECT_EQ(run(kBin + " sweep " + kConfig + " --db x.db --device cuda --gpus-per-worker 2", &out),
            2);
  EXPECT_NE(out.find("tensor-parallel groups run on the CPU engine only"), std::string::npos)
      << out;
#ifdef KVB_WITH_CUDA
  if (!kvb::kernels::cuda::has_device()) {
    EXPECT_EQ(run(kBin + " sweep " + kConfig + " --db x.db --device cuda", &out), 1);
    EXPECT_NE(out.find("--device cuda: no GPU visible"), std::string::npos) << out;
  }
#else
  EXPECT_EQ(run(kBin + " sweep " + kConfig + " --db x.db --device cuda", &out), 2);
  EXPECT_NE(out.find("--device cuda: this build has no CUDA"), std::string::npos) << out;
#endif
  // validate prints the layout and the memory per GPU.
  EXPECT_EQ(run(kBin + " validate " + kConfig + " --gpus-per-worker 4 --ranks 8", &out), 0);
  EXPECT_NE(out.find("- groups: 2 of 4 GPU(s) each (8 worker ranks; mpirun -np 9)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("weights MiB per GPU (f32)"), std::string::npos) << out;
}

}  // namespace
