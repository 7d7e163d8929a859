// The unit keys of configs/quickstart.yaml (the README's main job) are pinned, as computed before
// the matrix had one expansion (commit f6fea9d): a database that quickstart filled must resume
// with "0 to run" after any change to the expansion or the key. Since result schema 2 (content
// keys) these are the units' legacy keys, under which such a database is adopted (test_unit_keys
// LegacyDatabaseResumesUnderContentKeys). Needs SmolLM2 under models/
// (scripts/fetch_models.sh); its weights are hashed, not loaded.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "harness/sweep_config.h"
#include "harness/sweep_plan.h"
#include "results/store.h"

namespace kvb::harness {
namespace {
namespace fs = std::filesystem;

const std::string kConfig = std::string(KVB_FIXTURES_DIR) + "/../../configs/quickstart.yaml";
const std::string kModel = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

TEST(UnitKeysQuickstart, PinnedKeys) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "no " << kModel << " (scripts/fetch_models.sh)";
  const std::string dir =
      std::string(KVB_BINARY_DIR) + "/test_unit_keys_quickstart_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const SweepConfig cfg = load_sweep_config(kConfig);
  results::Store store = results::Store::open(dir + "/keys.db", results::Mode::kReadWrite);
  std::map<std::string, std::string> model_hashes;
  const Plan plan = expand(cfg, store, store.begin_run(results::RunInfo{}), &model_hashes);
  // 15 samples (3 lengths x 5 depths) x 11 cells (full, and 5 policies x 2 budgets).
  ASSERT_EQ(plan.all_keys.size(), 165u);
  EXPECT_EQ(std::set<std::string>(plan.all_keys.begin(), plan.all_keys.end()).size(), 165u);
  EXPECT_EQ(plan.bundles.size(), 15u);
  struct Pinned {
    size_t index;
    const char* key;
    const char* policy;
    const char* budget;
  };
  for (const Pinned& p : std::vector<Pinned>{
      {0, "c28c3762ff609bb7a2f9ca0d7eb1051a038f5ebc5f960b9dcfb7f3c494a60c02", "full", "-"},
      {1, "4ca38384be526bd83c9d88eb789cb9c3a0a2c4be13827378d97a6781cd0d3bf6", "window", "128"},
      {11, "6404cf2d97c55f845cd58300db8da087c0571b009b8c7a3b53706b7b538040ca", "full", "-"},
      {82, "a49a250d52b25605f196962f7a6efea372803763f02947bc01aca20e534cb9e4", "h2o", "128"},
      {163, "3d7fa502fb28e61a172481323563991798374abae8cb4537d37bb64673835f4a", "ada_snapkv", "128"},
      {164, "25ab0e5110fff24536668b3ead85a9bd6171ecf6a050eb821b4bcef52b3dddfc", "ada_snapkv", "256"},
       }) {
    const std::string& key = plan.all_keys[p.index];
    EXPECT_EQ(plan.legacy_keys.at(p.index), p.key) << "unit " << p.index;
    EXPECT_EQ(plan.key_policy.at(key), p.policy) << "unit " << p.index;
    EXPECT_EQ(plan.key_budget.at(key), p.budget) << "unit " << p.index;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvb::harness
