// Unit keys (DESIGN.md "Work unit and its key"): the keys of a config's units are pinned, as the
// code before the matrix had one expansion computed them (harness/sweep_plan.cc expand over
// harness/sweep_cells.cc expand_config_cells), so that a database keeps resuming with "0 to run"
// after any change to the expansion. Model: stories260K from KVB_SHARED_DIR (its header and
// tokenizer; no weights are loaded); configs and databases live in a per-process folder.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/sha256.h"
#include "harness/policy_files.h"
#include "harness/sweep_config.h"
#include "harness/sweep_plan.h"
#include "results/store.h"

namespace kvb::harness {
namespace {
namespace fs = std::filesystem;

const std::string kModel = KVB_SHARED_DIR "/models/stories260K/stories260K.bin";
const std::string kTokenizer = KVB_SHARED_DIR "/models/stories260K/tok512.bin";

std::string scratch() {
  const std::string d = std::string(KVB_BINARY_DIR) + "/test_unit_keys_" +
                        std::to_string(::getpid()) + "_" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The plan of the config at `path`, expanded into a fresh database in `dir`.
Plan plan_of(const std::string& path, const std::string& dir) {
  const SweepConfig cfg = load_sweep_config(path);
  results::Store store = results::Store::open(dir + "/keys.db", results::Mode::kReadWrite);
  const int64_t run_id = store.begin_run(results::RunInfo{});
  std::map<std::string, std::string> model_hashes;
  return expand(cfg, store, run_id, &model_hashes);
}

struct PinnedUnit {
  const char* key;
  const char* policy;
  const char* budget;  // Plan::key_budget: the spec, "-" for full
};

// Every axis of the matrix, a ratio budget and three exclusion rules (one on `full`, which has no
// budget, one on a budget, one on a question placement): 2 samples x 16 cells.
TEST(UnitKeys, PinnedKeysOfAMatrixWithExclusions) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  const std::string dir = scratch();
  const std::string config = dir + "/pinned.yaml";
  std::ofstream(config) << "models:\n  - {name: stories, path: " << kModel
                        << ", tokenizer: " << kTokenizer << "}\n"
                        << "tasks:\n"
                           "  - name: niah\n"
                           "    options: {context_lengths: [128], depths: [0, 100], haystack: "
                           "noise, chat: false}\n"
                           "policies: [full, window, h2o]\n"
                           "kv_budget: [16, 32, {ratio: 0.5}]\n"
                           "question: [in_prompt, after_compression]\n"
                           "seed: [0, 7]\n"
                           "exclude:\n"
                           "  - {policy: h2o, kv_budget: 32}\n"
                           "  - {policy: full, seed: 7}\n"
                           "  - {policy: window, question: after_compression}\n";
  // Computed by the expansion before it was one (commit f6fea9d).
  const std::vector<PinnedUnit> pinned = {
      {"d4bb5bb0090ceef6ba0c89e8fc61619357fa3627e9baa2bc69b37af9984822c5", "full", "-"},
      {"bb7eeefb3d598a78ba4595ab9d906dcf764703707e375ba3077fd302157a68a6", "full", "-"},
      {"23d34e60e1bb7bb5f301a8ca783661749451b1dc0e99b3300d3e826a9ec49532", "window", "16"},
      {"55f2e70fc6d1b173ce270ae89021d327ddc5851da4179dd3d430a7949ba69c79", "window", "16"},
      {"490d412d1b24bfee48099876e09543d0ce6d8029d6380e0159b63f32f0b3e6b8", "window", "32"},
      {"55d490c87d881837067158e014a1e6088ff5816925563722885b67e3b0d3ec1c", "window", "32"},
      {"e983a2ffb6aa33c2486fed77a7263538b8164a4f5c6016da14b4ab68465b3cdc", "window", "0.5 ratio"},
      {"615ce3f96f51a0b46a00b5f90e20a39ee5668b503d5e3e4300470e20de6cf29d", "window", "0.5 ratio"},
      {"fc7efa72c957f093ec502f2e29fa64ada9b425859917c9a5e68c7f6c2cbcb40d", "h2o", "16"},
      {"b8d3e84efb30298a7dec7951bb4c41468be68575eace52eb6f61b90e77583441", "h2o", "16"},
      {"b4be748140d91159ddc32d2c4efb832fe50bb3b034ce1c5f18c3b3b0db563561", "h2o", "16"},
      {"057fbd05254b73d89cfc7a0afa8a4f4d10cbbc3806f84a67aa2ad72576c8f700", "h2o", "16"},
      {"789bc1bac3c545b7e617d44cb7849350cff31c9da82fbd222f3ed3545f955ced", "h2o", "0.5 ratio"},
      {"e81b79aed88cae3839ef4fbc6a6b5d8599a942c61b22e2eeb07675005a6e4e67", "h2o", "0.5 ratio"},
      {"8680cdd57c9a20c5f9838089a7703a9f6293c7db5fc598b2e608083fbc1614fa", "h2o", "0.5 ratio"},
      {"18f95c0dc12b3d76b3b2e50bce4839172f9c6f52df1a0c09f851c1cc1a45c446", "h2o", "0.5 ratio"},
      {"9a8627941d891858a422d4a6716bdd16af36049438e86f718b0c6f0c5371092c", "full", "-"},
      {"f6624660d2615c602cc16a5e59114325cc983a8723cc471748b576a55e3f43ff", "full", "-"},
      {"c12989756a869728cb4c2b4defadf8fd90e6652334e4a648dce40def37eab1a5", "window", "16"},
      {"7ec08306ed966277b75d896dbb2b7932540fa0e967cc4b46e8c6cfeb6d03e629", "window", "16"},
      {"2cb1fa5d18636cdc57093810a9b8289154c01c8bab872a41b920677891cee92b", "window", "32"},
      {"54d9efee9e66fadae7f5a6e24058d1e2d6c001eeb723ee2be80ba320a47a8de2", "window", "32"},
      {"65bada607c5759d1ae047180f65bf09e4c35dec0cd01f0db166401e115fa3108", "window", "0.5 ratio"},
      {"357b1094de6ef0410b3dac1be185478ed4717d89d0d53ef4b55af6b75e4c9c68", "window", "0.5 ratio"},
      {"46075ae7261cfc36693e36db061ca69bea841ecb6f09dd2f02e907dd8b913cfd", "h2o", "16"},
      {"f3f2ad68174bbb57ac355d5029f16dcae660d8e2068e838c7c33ae781117b1e2", "h2o", "16"},
      {"3d3489f7efafe249bd92ca43faa300c828aa864558dfab60d096c2588656155b", "h2o", "16"},
      {"76f20e4cdf8de1f856198c82a1a35c43d556d72112eca0b333a6e9436174725f", "h2o", "16"},
      {"2dce267244700b265a4e7a136fd241e3a6c7a9be5aed3f992beea1e8a9bb70a5", "h2o", "0.5 ratio"},
      {"e14fda5963465b42405887372e228a3c423d5d4f121823c8496a23e3afb7c5f2", "h2o", "0.5 ratio"},
      {"47d5de01592c79688a170d3e3f8bc4be600e3d7e313cb39556e7d09d2eca3ff7", "h2o", "0.5 ratio"},
      {"acc8cc28b24fdf5b42e2aabc3af34e98f8d6339be4ef82567aaa7ce7b15bcb39", "h2o", "0.5 ratio"},
  };
  // Result schema 2 keys units by content: these are now the units' legacy keys, which a
  // database of result schema 1 holds and register_units adopts (LegacyDatabaseResumes...).
  const Plan plan = plan_of(config, dir);
  ASSERT_EQ(plan.all_keys.size(), pinned.size());
  ASSERT_EQ(plan.legacy_keys.size(), pinned.size());
  for (size_t i = 0; i < pinned.size(); ++i) {
    const std::string& key = plan.all_keys[i];
    EXPECT_EQ(plan.legacy_keys[i], pinned[i].key) << "unit " << i;
    EXPECT_EQ(plan.key_policy.at(key), pinned[i].policy) << "unit " << i;
    EXPECT_EQ(plan.key_budget.at(key), pinned[i].budget) << "unit " << i;
  }
  // Two bundles (one per sample), every unit in its sample's bundle, in matrix order.
  ASSERT_EQ(plan.bundles.size(), 2u);
  size_t next = 0;
  for (const WireBundle& b : plan.bundles) {
    ASSERT_EQ(b.units.size(), pinned.size() / 2);
    for (const WireUnit& u : b.units) EXPECT_EQ(u.key, plan.all_keys[next++]);
  }
  // `kvbench validate`'s count is the same expansion: cells x samples.
  EXPECT_EQ(expand_config_cells(load_sweep_config(config)).size() * 2, pinned.size());
  fs::remove_all(dir);
}

// A Python policy's script enters the key by content (harness/policy_files.h): the same script
// at two paths gives one key, an edited script another; each file is read once per stamp; the
// units table keeps showing the path. (The key function directly; through a sweep:
// tests/mpi/test_sweep_python_policy.cc.)
TEST(UnitKeys, PythonPolicyScriptEntersTheKeyByContentNotPath) {
  const std::string dir = scratch();
  const std::string script = "def score(stats):\n    return stats.col_sums\n";
  const std::string a = dir + "/a.py";
  fs::create_directories(dir + "/moved");
  const std::string b = dir + "/moved/b.py";
  std::ofstream(a) << script;
  std::ofstream(b) << script;
  FileDigests digests;
  results::UnitSpec spec;
  spec.model_sha256 = std::string(64, '0');
  spec.task = "niah";
  spec.sample_id = "len128_depth0_s0";
  spec.policy = kPythonPolicy;
  spec.kv_budget_spec = "64";
  auto key_of = [&](const std::string& file, const std::string& base_dir) {
    results::UnitSpec s = spec;
    s.policy_options =
        keyed_policy_options(kPythonPolicy, {{"file", file}, {"window", "8"}}, base_dir, digests);
    return results::unit_key(s);
  };
  const std::map<std::string, std::string> keyed =
      keyed_policy_options(kPythonPolicy, {{"file", a}, {"window", "8"}}, "", digests);
  EXPECT_EQ(keyed.at("file"), "sha256:" + sha256_hex(script));
  EXPECT_EQ(keyed.at("window"), "8");
  const std::string key_a = key_of(a, "");
  EXPECT_EQ(key_of(b, ""), key_a);        // moved or copied: the same unit
  EXPECT_EQ(key_of("a.py", dir), key_a);  // relative to the config's folder
  EXPECT_EQ(digests.files_read(), 2);     // a once (unchanged since), b once
  // Edited: another unit. The new stamp (size and modification time) makes it read again.
  std::ofstream(a) << script << "# tuned\n";
  fs::last_write_time(a, fs::last_write_time(a) + std::chrono::seconds(2));
  EXPECT_NE(key_of(a, ""), key_a);
  EXPECT_EQ(digests.files_read(), 3);
  // Other policies' options, paths or not, are hashed as given.
  const std::map<std::string, std::string> other = {{"file", dir + "/absent.py"}};
  EXPECT_EQ(keyed_policy_options("h2o", other, "", digests), other);
  try {
    keyed_policy_options(kPythonPolicy, other, "", digests);
    ADD_FAILURE() << "a missing script was hashed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("policy python option file '" + dir +
                                         "/absent.py' does not exist"),
              std::string::npos)
        << e.what();
  }
  // The units table shows the path; the key is the content's.
  results::Store store = results::Store::open(dir + "/keys.db", results::Mode::kReadWrite);
  results::UnitRow row;
  row.spec = spec;
  row.spec.policy_options = keyed_policy_options(kPythonPolicy, {{"file", b}}, "", digests);
  row.shown_policy_options = std::map<std::string, std::string>{{"file", b}};
  row.model = "m";
  const std::vector<std::string> keys = store.register_units(store.begin_run({}), {row});
  EXPECT_EQ(keys.at(0), results::unit_key(row.spec));
  const results::QueryResult shown = store.query("SELECT policy_options FROM units");
  ASSERT_EQ(shown.rows.size(), 1u);
  EXPECT_EQ(shown.rows[0][0].text, "{\"file\":\"" + b + "\"}");
  fs::remove_all(dir);
}

// duo_attention's pattern folder enters the key by its two files' content (harness/policy_files.h):
// the folder copied elsewhere (or named relative to the config) gives one key; an edited score
// another, and so does an edited config.json.
TEST(UnitKeys, DuoAttentionPatternsEnterTheKeyByContentNotPath) {
  const std::string dir = scratch();
  for (const char* sub : {"/a", "/b"}) {
    fs::create_directories(dir + sub);
    std::ofstream(dir + sub + "/full_attention_heads.tsv") << "0.5\t0.25\n";
    std::ofstream(dir + sub + "/config.json") << R"({"sink_size": 4, "recent_size": 8})";
  }
  FileDigests digests;
  auto keyed = [&](const std::string& folder, const std::string& base_dir) {
    return keyed_policy_options(
        kDuoPolicy, {{"patterns", folder}, {"head_compression_ratio", "0.5"}}, base_dir, digests);
  };
  const std::map<std::string, std::string> a = keyed(dir + "/a", "");
  EXPECT_EQ(a.at("patterns"), "sha256:" + sha256_hex("0.5\t0.25\n") + "," +
                                  sha256_hex(R"({"sink_size": 4, "recent_size": 8})"));
  EXPECT_EQ(a.at("head_compression_ratio"), "0.5");
  EXPECT_EQ(keyed(dir + "/b", ""), a);
  EXPECT_EQ(keyed("a", dir), a);
  std::ofstream(dir + "/b/full_attention_heads.tsv") << "0.5\t0.75\n";
  fs::last_write_time(
      dir + "/b/full_attention_heads.tsv",
      fs::last_write_time(dir + "/b/full_attention_heads.tsv") + std::chrono::seconds(2));
  EXPECT_NE(keyed(dir + "/b", ""), a);
  std::ofstream(dir + "/a/config.json") << R"({"sink_size": 4, "recent_size": 16})";
  fs::last_write_time(dir + "/a/config.json",
                      fs::last_write_time(dir + "/a/config.json") + std::chrono::seconds(2));
  EXPECT_NE(keyed(dir + "/a", ""), a);
  EXPECT_THROW(keyed(dir + "/absent", ""), Error);
  fs::remove_all(dir);
}

// A relative script path in a config named by a relative path (`kvbench sweep cfg/sweep.yaml`)
// resolves once, against the config's folder: the keys equal those of the same config named by
// its absolute path. (Before, expand joined the config's folder to the already resolved path:
// cfg/cfg/a.py, a usage error.)
TEST(UnitKeys, PythonPolicyScriptOfAConfigNamedByARelativePath) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  const std::string dir = fs::canonical(scratch()).string();
  for (const char* sub : {"/cfg", "/abs", "/rel"}) fs::create_directories(dir + sub);
  std::ofstream(dir + "/cfg/a.py") << "import numpy as np\ndef score(ctx):\n"
                                      "    return -np.linalg.norm(ctx.keys, axis=-1)\n";
  std::ofstream(dir + "/cfg/sweep.yaml")
      << "models:\n  - name: stories260K\n    path: " << kModel << "\n    tokenizer: " << kTokenizer
      << "\n"
      << "tasks:\n  - name: niah\n    options: {context_lengths: [128], depths: [0], haystack: "
         "noise, chat: false}\n"
      << "policies:\n  - {name: python, options: {file: a.py}}\nkv_budget: [32]\n";
  const std::vector<std::string> absolute = plan_of(dir + "/cfg/sweep.yaml", dir + "/abs").all_keys;
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  std::vector<std::string> relative;
  try {
    relative = plan_of("cfg/sweep.yaml", dir + "/rel").all_keys;
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
  }
  fs::current_path(cwd);
  ASSERT_EQ(absolute.size(), 1u);
  EXPECT_EQ(relative, absolute);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvb::harness
