// The per-unit prompt hash (measurements.prompt_sha256, schema version 6): the hash itself
// against digests computed by Python's hashlib over struct.pack('<Ni', ...), the store's round
// trip and CHECK, and the 5 -> 6 migration (old units get NULL).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "common/error.h"
#include "common/measurement_fields.h"
#include "results/schema.h"
#include "results/sqlite_util.h"
#include "results/store.h"
#include "workers/model_session.h"

namespace kvb {
namespace {

TEST(PromptSha256, TokenIdsAsInt32LittleEndian) {
  const std::vector<int32_t> none, ids = {1, 2, -1, 151643}, a = {1, 2}, b = {-1, 151643};
  // hashlib.sha256(b'').hexdigest()
  EXPECT_EQ(workers::token_ids_sha256({&none}),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // hashlib.sha256(struct.pack('<4i', 1, 2, -1, 151643)).hexdigest()
  const std::string want = "45e4234c22bc39d78b7eeb7dfb98c7fb0d0900b9823477f60d560edcd8f9e8bf";
  EXPECT_EQ(workers::token_ids_sha256({&ids}), want);
  // Parts are one sequence: where the prompt is split does not matter, the order does.
  EXPECT_EQ(workers::token_ids_sha256({&a, &none, &b}), want);
  EXPECT_NE(workers::token_ids_sha256({&b, &a}), want);
}

std::string fresh_dir() {
  const std::string d = std::string(KVB_BINARY_DIR) + "/test_prompt_sha256/" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
                        std::to_string(getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

std::string one_value(const results::Store& s, const std::string& sql) {
  return s.query(sql).rows.at(0).at(0).text;
}

// A store with one finished unit whose measurements carry `hash`.
void write_unit(results::Store& s, const std::string& hash) {
  results::RunInfo info;
  info.config_text = "x";
  info.git_rev = "r";
  info.kvbench_version = "0";
  info.host = "h";
  info.ranks = 1;
  const int64_t run = s.begin_run(info);
  results::UnitRow row;
  row.model = "m";
  row.spec.model_sha256 = std::string(64, 'c');
  row.spec.task = "niah";
  row.spec.task_version = 1;
  row.spec.sample_id = "s0";
  row.spec.policy = "full";
  const std::string key = s.register_units(run, {row}).at(0);
  results::UnitResult r;
  r.unit_key = key;
  r.status = results::UnitStatus::kOk;
  r.measurements = results::Measurements{};
  r.measurements->decode_batch = 1;
  r.measurements->prompt_sha256 = hash;
  s.write_bundle({r});
}

TEST(PromptSha256, StoreRoundTripAndCheck) {
  const std::string dir = fresh_dir();
  results::Store s = results::Store::open(dir + "/a.db", results::Mode::kReadWrite);
  const std::string h = "45e4234c22bc39d78b7eeb7dfb98c7fb0d0900b9823477f60d560edcd8f9e8bf";
  write_unit(s, h);
  EXPECT_EQ(one_value(s, "SELECT prompt_sha256 FROM measurements"), h);
  EXPECT_EQ(s.measurements(one_value(s, "SELECT unit_key FROM measurements"))->prompt_sha256, h);
  // The column's CHECK refuses what is not a lowercase hex digest.
  results::Db db(dir + "/a.db", SQLITE_OPEN_READWRITE);
  EXPECT_THROW(db.exec("UPDATE measurements SET prompt_sha256 = 'DROP TABLE units'"), Error);
  EXPECT_THROW(db.exec("UPDATE measurements SET prompt_sha256 = upper(prompt_sha256)"), Error);
  // "" on the worker means unknown: NULL, read back as "".
  results::Store t = results::Store::open(dir + "/b.db", results::Mode::kReadWrite);
  write_unit(t, "");
  EXPECT_EQ(one_value(t, "SELECT prompt_sha256 IS NULL FROM measurements"), "1");
}

TEST(PromptSha256, MigratesVersion5Databases) {
  const std::string dir = fresh_dir();
  const std::string path = dir + "/v5.db";
  const std::string h = std::string(63, '0') + "1";
  {
    results::Store s = results::Store::open(path, results::Mode::kReadWrite);
    write_unit(s, h);
  }
  {
    // The version-5 layout: today's measurements without the columns 5 -> 6 and later add
    // (rebuilt, as test_store does for version 3).
    results::Db db(path, SQLITE_OPEN_READWRITE);
    std::string cols;
    for (const measurement::Field& f : measurement::kFields) {
      if (std::string(f.name) == "prompt_sha256" || std::string(f.name) == "prefill_reused" ||
          std::string(f.name) == "channel_bytes_pruned") {
        continue;
      }
      cols += std::string(cols.empty() ? "" : ", ") + f.name;
    }
    db.exec("CREATE TABLE m5 AS SELECT unit_key, " + cols + " FROM measurements");
    db.exec("DROP TABLE measurements");
    db.exec("ALTER TABLE m5 RENAME TO measurements");
    db.exec("PRAGMA user_version = 5");
  }
  EXPECT_THROW((void)results::Store::open(path, results::Mode::kReadOnly), Error);
  results::Store s = results::Store::open(path, results::Mode::kReadWrite);
  EXPECT_EQ(one_value(s, "PRAGMA user_version"), std::to_string(results::kSchemaVersion));
  // 5 -> 6 -> 7 (prefill_reused) -> 8 (content keys) -> 9 (channel_bytes_pruned)
  EXPECT_EQ(results::kSchemaVersion, 9);
  EXPECT_EQ(one_value(s, "SELECT COUNT(*) FROM measurements WHERE prompt_sha256 IS NULL"), "1");
  // The migrated column has the fresh schema's CHECK.
  results::Db db(path, SQLITE_OPEN_READWRITE);
  EXPECT_THROW(db.exec("UPDATE measurements SET prompt_sha256 = 'xyz'"), Error);
  db.exec("UPDATE measurements SET prompt_sha256 = '" + h + "'");
  EXPECT_EQ(one_value(s, "SELECT prompt_sha256 FROM measurements"), h);
}

}  // namespace
}  // namespace kvb
