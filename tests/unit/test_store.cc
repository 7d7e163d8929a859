// The results store (results/store.h): schema creation and versioning, unit registration without
// duplicates, bundle writes that are all or nothing, read-only access, crash recovery, and values
// that look like SQL stored verbatim.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/sha256.h"
#include "results/schema.h"
#include "results/sqlite_util.h"
#include "results/store.h"

namespace kvb::results {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test under the build tree.
std::string fresh_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir = fs::path(KVB_BINARY_DIR) / "test_store" / info->name();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// Runs fn, expects a kvb::Error whose message contains every one of `parts`; returns it.
std::string expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' in: " << msg;
    return msg;
  }
  ADD_FAILURE() << "expected a kvb::Error";
  return "";
}

RunInfo run_info() {
  RunInfo r;
  r.config_text = "models: [smollm2]\n";
  r.git_rev = "abc123";
  r.kvbench_version = "0.1.0";
  r.host = "node0";
  r.ranks = 2;
  r.devices_json = R"([{"rank":1,"device":"cpu"}])";
  r.model_hashes_json = R"({"smollm2":"00ff"})";
  return r;
}

UnitRow unit_row(const std::string& sample_id, const std::string& policy = "h2o",
                 const std::string& budget = "256") {
  UnitRow row;
  row.model = "smollm2";
  row.spec.model_sha256 = std::string(64, 'a');
  row.spec.task = "niah";
  row.spec.task_version = 1;
  row.spec.task_options = {{"limit", "4"}, {"seed", "0"}};
  row.spec.sample_id = sample_id;
  row.spec.policy = policy;
  row.spec.policy_options = {{"heavy_fraction", "0.5"}};
  row.spec.kv_budget_spec = budget;
  row.spec.max_new_tokens = 32;
  row.spec.seed = 7;
  row.spec.generation = {{"temperature", "0"}};
  row.sample_fields = {{"context_length", "4096"}, {"depth", "0.25"}, {"needle", "n1"}};
  if (budget.find("ratio") == std::string::npos) row.kv_budget = std::stoll(budget);
  return row;
}

std::string one_value(const Store& store, const std::string& sql,
                      const std::vector<std::string>& params = {}) {
  const QueryResult r = store.query(sql, params);
  EXPECT_EQ(r.rows.size(), 1u) << sql;
  EXPECT_EQ(r.columns.size(), 1u) << sql;
  return r.rows.empty() ? "" : r.rows[0][0].text;
}

Measurements distinct_measurements() {
  Measurements m;
  m.prompt_tokens = 4101;
  m.generated_tokens = 17;
  m.truncated_tokens = 3;
  m.prefill_ms = 812.25;
  m.ttft_ms = 830.5;
  m.decode_ms = 402.125;
  m.decode_ms_p50 = 23.0625;
  m.decode_ms_p99 = 31.75;
  m.tokens_per_s = 42.276;
  m.policy_ms = 12.5;
  m.kv_bytes_final = 1234567;
  m.kv_bytes_peak = 9876543210;
  m.kv_physical_peak = 9999999999;
  m.policy_state_bytes = 65536;
  m.occupancy_mean = 255.75;
  m.occupancy_final = 256.5;
  m.occupancy_peak = 4117;
  m.occupancy_min_final = 250;
  m.occupancy_max_final = 262;
  m.host_rss_peak = 1 << 30;
  m.device_peak_bytes = int64_t(80) << 30;
  m.prefill_shared = true;
  return m;
}

TEST(Store, SchemaSqlMatchesEmbedded) {
  const std::string path = std::string(KVB_FIXTURES_DIR) + "/../../results/schema.sql";
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << path;
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), std::string(kSchemaSql))
      << "the compiled-in schema differs from results/schema.sql: re-run cmake";
  EXPECT_NE(text.str().find("PRAGMA user_version = " + std::to_string(kSchemaVersion) + ";"),
            std::string::npos);
}

// The measurements table has exactly the fields of common/measurement_fields.h, in that order
// (plus unit_key first): the table, the store's binding and the wire cannot drift apart.
TEST(Store, MeasurementColumnsAreTheFieldTable) {
  Store store = Store::open(fresh_dir() + "/results.db", Mode::kReadWrite);
  const QueryResult cols = store.query("SELECT name FROM pragma_table_info('measurements')");
  std::vector<std::string> got;
  for (const auto& row : cols.rows) got.push_back(row[0].text);
  std::vector<std::string> want = {"unit_key"};
  for (const auto& f : measurement::kFields) want.push_back(f.name);
  EXPECT_EQ(got, want);
}

TEST(Store, CreatesVersionedWalDatabase) {
  const std::string path = fresh_dir() + "/results.db";
  {
    Store store = Store::open(path, Mode::kReadWrite);
    EXPECT_EQ(one_value(store, "PRAGMA journal_mode"), "wal");
    EXPECT_EQ(one_value(store, "PRAGMA user_version"), std::to_string(kSchemaVersion));
    EXPECT_EQ(one_value(store, "PRAGMA foreign_keys"), "1");
    EXPECT_EQ(one_value(store, "PRAGMA busy_timeout"), "10000");
    for (const char* table : {"runs", "units", "metrics", "measurements", "predictions"}) {
      EXPECT_EQ(one_value(store, "SELECT count(*) FROM sqlite_master WHERE name = ?1", {table}),
                "1")
          << table;
    }
    const int64_t run = store.begin_run(run_info());
    EXPECT_EQ(
        one_value(store, "SELECT config_sha256 FROM runs WHERE run_id = ?1", {std::to_string(run)}),
        sha256_hex(run_info().config_text));
    EXPECT_EQ(one_value(store, "SELECT status FROM runs"), "running");
    store.finish_run(run, RunStatus::kOk);
    EXPECT_EQ(one_value(store, "SELECT status || ' ' || (finished_at IS NOT NULL) FROM runs"),
              "ok 1");
  }
  // Reopening at the same version changes nothing.
  Store again = Store::open(path, Mode::kReadWrite);
  EXPECT_EQ(one_value(again, "SELECT count(*) FROM runs"), "1");
}

TEST(Store, UnitKeyHashesEveryIdentifyingField) {
  const UnitRow base = unit_row("s0");
  const std::string key = unit_key(base.spec);
  EXPECT_EQ(key.size(), 64u);
  EXPECT_EQ(key.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(unit_key_text(base.spec).find("result schema " + std::to_string(kResultSchemaVersion)),
            std::string::npos);
  std::vector<std::function<void(UnitSpec&)>> edits = {
      [](UnitSpec& u) { u.model_sha256[0] = 'b'; },
      [](UnitSpec& u) { u.task = "ruler"; },
      [](UnitSpec& u) { u.task_version = 2; },
      [](UnitSpec& u) { u.task_options["limit"] = "5"; },
      [](UnitSpec& u) { u.sample_id = "s1"; },
      [](UnitSpec& u) { u.policy = "snapkv"; },
      [](UnitSpec& u) { u.policy_options["recent"] = "8"; },
      [](UnitSpec& u) { u.kv_budget_spec = "0.1 ratio"; },
      [](UnitSpec& u) { u.question = "after_compression"; },
      [](UnitSpec& u) { u.max_new_tokens = 33; },
      [](UnitSpec& u) { u.seed = 8; },
      [](UnitSpec& u) { u.generation["temperature"] = "0.7"; },
      // A value that tries to forge the next line of the canonical text.
      [](UnitSpec& u) { u.sample_id = "s0\"\ntask=\"niah"; },
  };
  for (size_t i = 0; i < edits.size(); ++i) {
    UnitSpec changed = base.spec;
    edits[i](changed);
    EXPECT_NE(unit_key(changed), key) << "edit " << i;
  }
  // The display name and the sample's metadata are not part of the identity.
  UnitRow renamed = base;
  renamed.model = "other name";
  renamed.sample_fields["depth"] = "0.5";
  EXPECT_EQ(unit_key(renamed.spec), key);
  EXPECT_EQ(canonical_json({{"b", "1"}, {"a", "x\"y"}}), R"({"a":"x\"y","b":"1"})");
}

TEST(Store, RegisteringTwiceNeverDuplicates) {
  Store store = Store::open(fresh_dir() + "/results.db", Mode::kReadWrite);
  const int64_t run1 = store.begin_run(run_info());
  const std::vector<UnitRow> rows = {unit_row("s0"), unit_row("s1"), unit_row("s0", "snapkv")};
  const auto keys = store.register_units(run1, rows);
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_EQ(keys[0], unit_key(rows[0].spec));
  store.mark_running(run1, {keys[1]}, 1, "node1");
  store.write_bundle(
      {{keys[1], UnitStatus::kOk, "", std::nullopt, {}, std::nullopt, std::nullopt}});

  const int64_t run2 = store.begin_run(run_info());
  std::vector<UnitRow> again = rows;
  again.push_back(unit_row("s2"));
  const auto keys2 = store.register_units(run2, again);
  EXPECT_EQ(std::vector<std::string>(keys2.begin(), keys2.begin() + 3), keys);
  EXPECT_EQ(one_value(store, "SELECT count(*) FROM units"), "4");
  const auto states = store.unit_status(keys2);
  EXPECT_EQ(states.at(keys[0]).status, UnitStatus::kPending);
  EXPECT_EQ(states.at(keys[0]).run_id, run1);  // untouched by the second registration
  EXPECT_EQ(states.at(keys[1]).status, UnitStatus::kOk);
  EXPECT_EQ(states.at(keys2[3]).run_id, run2);
  EXPECT_EQ(store.unfinished_units(keys2), (std::vector<std::string>{keys[0], keys[2], keys2[3]}));
  // Typed sample columns next to the JSON.
  EXPECT_EQ(one_value(store, "SELECT context_length || ' ' || depth FROM units WHERE unit_key = ?1",
                      {keys[0]}),
            "4096 0.25");
  EXPECT_EQ(one_value(store, "SELECT sample_fields FROM units WHERE unit_key = ?1", {keys[0]}),
            R"({"context_length":"4096","depth":"0.25","needle":"n1"})");
  expect_error([&] { (void)store.unfinished_units({std::string(64, '0')}); }, {"not registered"});
}

TEST(Store, BundleRoundTripsExactValues) {
  Store store = Store::open(fresh_dir() + "/results.db", Mode::kReadWrite);
  const int64_t run = store.begin_run(run_info());
  const auto keys = store.register_units(run, {unit_row("s0", "h2o", "0.1 ratio"), unit_row("s1")});
  store.mark_running(run, keys, 3, "node3");
  EXPECT_EQ(store.unit_status({keys[0]}).at(keys[0]).attempts, 1);

  UnitResult ok;
  ok.unit_key = keys[0];
  ok.kv_budget = 410;
  ok.metrics = {{"string_match_all", 0.6666666666666666, true},
                {"nll", std::nan(""), false},
                {"rouge_l", 1e-300, true}};
  ok.measurements = distinct_measurements();
  ok.prediction = PredictionRow{"The best thing is \"dolores\"\npark 🌉",
                                {"dolores park", "quote \" back\\slash", "ünïcode"}};
  UnitResult failed;
  failed.unit_key = keys[1];
  failed.status = UnitStatus::kOom;
  failed.error = "CUDA out of memory: tried to allocate 2 GiB";
  failed.measurements = Measurements{};  // partial measurements of a failed unit are kept
  failed.measurements->device_peak_bytes.reset();
  store.write_bundle({ok, failed});

  const auto metrics = store.metrics(keys[0]);
  ASSERT_EQ(metrics.size(), 3u);
  EXPECT_EQ(metrics[0].name, "nll");
  EXPECT_TRUE(std::isnan(metrics[0].value));
  EXPECT_FALSE(metrics[0].higher_is_better);
  EXPECT_EQ(metrics[1].name, "rouge_l");
  EXPECT_EQ(metrics[1].value, 1e-300);
  EXPECT_EQ(metrics[2].value, 0.6666666666666666);  // bit-exact through REAL
  EXPECT_EQ(store.measurements(keys[0]), ok.measurements);
  EXPECT_EQ(store.prediction(keys[0]), ok.prediction);
  EXPECT_EQ(store.measurements(keys[1]), failed.measurements);
  EXPECT_FALSE(store.prediction(keys[1]).has_value());
  EXPECT_TRUE(store.metrics(keys[1]).empty());

  const auto states = store.unit_status(keys);
  EXPECT_EQ(states.at(keys[0]).status, UnitStatus::kOk);
  EXPECT_EQ(states.at(keys[0]).error, "");
  EXPECT_EQ(states.at(keys[1]).status, UnitStatus::kOom);
  EXPECT_EQ(states.at(keys[1]).error, failed.error);
  EXPECT_EQ(one_value(store,
                      "SELECT kv_budget || ' ' || rank || ' ' || host || ' ' || "
                      "(finished_at >= started_at) FROM units WHERE unit_key = ?1",
                      {keys[0]}),
            "410 3 node3 1");
  EXPECT_TRUE(store.unfinished_units(keys).empty());

  // A second write of the same unit replaces its results rather than adding to them.
  ok.metrics = {{"string_match_all", 1.0, true}};
  ok.prediction.reset();
  store.write_bundle({ok});
  EXPECT_EQ(store.metrics(keys[0]).size(), 1u);
  EXPECT_FALSE(store.prediction(keys[0]).has_value());
}

TEST(Store, FailedBundleLeavesNothing) {
  Store store = Store::open(fresh_dir() + "/results.db", Mode::kReadWrite);
  const int64_t run = store.begin_run(run_info());
  const auto keys = store.register_units(run, {unit_row("s0"), unit_row("s1")});
  store.mark_running(run, keys, 1, "node1");
  UnitResult good;
  good.unit_key = keys[0];
  good.metrics = {{"acc", 1.0, true}};
  good.measurements = distinct_measurements();
  good.prediction = PredictionRow{"yes", {"yes"}};

  auto nothing_written = [&] {
    EXPECT_EQ(store.unit_status({keys[0]}).at(keys[0]).status, UnitStatus::kRunning);
    EXPECT_TRUE(store.metrics(keys[0]).empty());
    EXPECT_FALSE(store.measurements(keys[0]).has_value());
    EXPECT_FALSE(store.prediction(keys[0]).has_value());
  };

  // An unregistered (and malformed) key in the middle of the bundle.
  UnitResult stranger = good;
  stranger.unit_key = "not-a-unit-key";
  expect_error([&] { store.write_bundle({good, stranger}); }, {"not-a-unit-key", "not registered"});
  nothing_written();

  // A constraint violation inside SQLite: the second unit names one metric twice.
  UnitResult twice;
  twice.unit_key = keys[1];
  twice.metrics = {{"acc", 1.0, true}, {"acc", 0.0, true}};
  expect_error(
      [&] {
        store.write_bundle({good, twice});
      },
      {"UNIQUE constraint failed: metrics.unit_key, metrics.name", "INSERT INTO metrics",
       store.path()});
  nothing_written();
  EXPECT_EQ(store.unit_status({keys[1]}).at(keys[1]).status, UnitStatus::kRunning);

  // A status a finished unit cannot have, and an error status without its message.
  UnitResult pending = twice;
  pending.metrics.clear();
  pending.status = UnitStatus::kPending;
  expect_error([&] { store.write_bundle({good, pending}); }, {"not pending"});
  UnitResult silent = pending;
  silent.status = UnitStatus::kError;
  expect_error([&] { store.write_bundle({good, silent}); }, {"without an error message"});
  nothing_written();

  // The store is still usable afterwards.
  store.write_bundle({good});
  EXPECT_EQ(store.metrics(keys[0]).size(), 1u);
}

TEST(Store, ReadOnlyRefusesWrites) {
  const std::string dir = fresh_dir();
  const std::string path = dir + "/results.db";
  expect_error([&] { (void)Store::open(path, Mode::kReadOnly); }, {path, "does not exist"});
  Store writer = Store::open(path, Mode::kReadWrite);
  const int64_t run = writer.begin_run(run_info());
  const auto keys = writer.register_units(run, {unit_row("s0")});

  // A reader beside the live writer (WAL), and one after the writer has gone.
  for (int pass = 0; pass < 2; ++pass) {
    Store reader = Store::open(path, Mode::kReadOnly);
    EXPECT_EQ(reader.mode(), Mode::kReadOnly);
    EXPECT_EQ(one_value(reader, "SELECT count(*) FROM units"), "1");
    EXPECT_EQ(one_value(reader, "PRAGMA query_only"), "1");
    expect_error([&] { (void)reader.begin_run(run_info()); }, {"read-only", path});
    expect_error(
        [&] {
          reader.write_bundle({{keys[0], UnitStatus::kOk, "", {}, {}, {}, {}}});
        },
        {"read-only"});
    expect_error([&] { (void)reader.query("DELETE FROM units"); }, {"DELETE FROM units", path});
    // Lifting query_only does not help: the connection itself is read-only.
    (void)reader.query("PRAGMA query_only = 0");
    expect_error([&] { (void)reader.query("DROP TABLE units"); }, {"readonly", path});
    EXPECT_EQ(one_value(reader, "SELECT count(*) FROM units"), "1");
    if (pass == 0) writer = Store::open(dir + "/other.db", Mode::kReadWrite);  // closes results.db
  }
  // An empty file is no results database.
  std::ofstream(dir + "/empty.db").close();
  expect_error([&] { (void)Store::open(dir + "/empty.db", Mode::kReadOnly); },
               {dir + "/empty.db", "is empty"});
}

TEST(Store, CrashRecoveryRequeuesThenGivesUp) {
  const std::string path = fresh_dir() + "/results.db";
  std::vector<std::string> keys;
  int64_t run1 = 0;
  {
    Store store = Store::open(path, Mode::kReadWrite);
    run1 = store.begin_run(run_info());
    keys = store.register_units(run1, {unit_row("a"), unit_row("b"), unit_row("c")});
    store.mark_running(run1, {keys[0], keys[1]}, 1, "node1");
    // run 1 dies here: no finish_run, units a and b left running.
  }
  int64_t run2 = 0;
  {
    Store store = Store::open(path, Mode::kReadWrite);
    run2 = store.begin_run(run_info());
    store.register_units(run2, {unit_row("a"), unit_row("b"), unit_row("c")});
    const Recovery rec = store.recover_after_crash(run2);
    EXPECT_EQ(rec.requeued,
              (std::vector<std::string>{std::min(keys[0], keys[1]), std::max(keys[0], keys[1])}));
    EXPECT_TRUE(rec.crashed.empty());
    EXPECT_EQ(rec.dead_runs, 1);
    EXPECT_EQ(one_value(store, "SELECT status FROM runs WHERE run_id = ?1", {std::to_string(run1)}),
              "crashed");
    auto states = store.unit_status(keys);
    EXPECT_EQ(states.at(keys[0]).status, UnitStatus::kPending);
    EXPECT_EQ(states.at(keys[0]).crash_count, 1);
    EXPECT_EQ(states.at(keys[2]).crash_count, 0);
    EXPECT_EQ(store.unfinished_units(keys), keys);
    // Units this run has in flight are not touched by its own recovery.
    store.mark_running(run2, {keys[0]}, 1, "node1");
    EXPECT_TRUE(store.recover_after_crash(run2).requeued.empty());
    EXPECT_EQ(store.unit_status({keys[0]}).at(keys[0]).attempts, 2);
    // run 2 dies with a in flight again.
  }
  Store store = Store::open(path, Mode::kReadWrite);
  const int64_t run3 = store.begin_run(run_info());
  const Recovery rec = store.recover_after_crash(run3);
  EXPECT_EQ(rec.crashed, std::vector<std::string>{keys[0]});
  EXPECT_TRUE(rec.requeued.empty());
  const auto states = store.unit_status(keys);
  EXPECT_EQ(states.at(keys[0]).status, UnitStatus::kCrashed);
  EXPECT_EQ(states.at(keys[0]).crash_count, kMaxCrashes);
  EXPECT_NE(states.at(keys[0]).error.find("in flight when 2 runs died"), std::string::npos);
  EXPECT_EQ(states.at(keys[1]).status, UnitStatus::kPending);  // one crash only
  EXPECT_EQ(store.unfinished_units(keys), (std::vector<std::string>{keys[1], keys[2]}));
  // Skipped from now on: it cannot be handed out, and the failed hand-out changed nothing.
  expect_error(
      [&] {
        store.mark_running(run3, {keys[1], keys[0]}, 1, "node1");
      },
      {keys[0], "it is crashed"});
  EXPECT_EQ(store.unit_status({keys[1]}).at(keys[1]).status, UnitStatus::kPending);
  // Unless --rerun asks for it.
  store.rerun_units({keys[0]});
  EXPECT_EQ(store.unit_status({keys[0]}).at(keys[0]).status, UnitStatus::kPending);
  EXPECT_EQ(store.unit_status({keys[0]}).at(keys[0]).crash_count, 0);
}

// A multi-rank run that records signals (end_signal 0) and died without one lost its coordinator
// alone: its units in flight go back to pending with no crash counted, up to kMaxAttempts
// hand-outs. A run that recorded a signal (a rank died) counts as before.
TEST(Store, CoordinatorDeathCountsNoCrash) {
  const std::string path = fresh_dir() + "/results.db";
  RunInfo info = run_info();  // ranks = 2
  info.records_signals = true;
  Store store = Store::open(path, Mode::kReadWrite);
  const int64_t run1 = store.begin_run(info);
  const auto keys = store.register_units(run1, {unit_row("a"), unit_row("b")});
  EXPECT_EQ(one_value(store, "SELECT end_signal FROM runs WHERE run_id = ?1",
                      {std::to_string(run1)}),
            "0");
  store.mark_running(run1, keys, 1, "node1");
  // run 1's coordinator dies (SIGKILL): nothing recorded.
  const int64_t run2 = store.begin_run(info);
  Recovery rec = store.recover_after_crash(run2);
  EXPECT_EQ(rec.released.size(), 2u);
  EXPECT_TRUE(rec.requeued.empty());
  EXPECT_EQ(store.unit_status(keys).at(keys[0]).crash_count, 0);
  EXPECT_EQ(store.unit_status(keys).at(keys[0]).status, UnitStatus::kPending);
  // run 2: a worker dies; mpirun's SIGTERM reaches the coordinator, which records it.
  store.mark_running(run2, {keys[0]}, 1, "node1");
  store.record_signal(run2, 15);
  const int64_t run3 = store.begin_run(info);
  rec = store.recover_after_crash(run3);
  EXPECT_EQ(rec.requeued, std::vector<std::string>{keys[0]});
  EXPECT_EQ(store.unit_status(keys).at(keys[0]).crash_count, 1);
  // Released again and again: after kMaxAttempts hand-outs without a result it is crashed.
  int64_t run = run3;
  for (int i = store.unit_status(keys).at(keys[1]).attempts; i < kMaxAttempts; ++i) {
    store.mark_running(run, {keys[1]}, 1, "node1");
    run = store.begin_run(info);
    rec = store.recover_after_crash(run);
  }
  EXPECT_EQ(rec.crashed, std::vector<std::string>{keys[1]});
  EXPECT_NE(store.unit_status(keys).at(keys[1]).error.find("handed out 5 times without a result"),
            std::string::npos);
  // One-process runs (records_signals false) keep end_signal NULL and count every crash.
  RunInfo one = run_info();
  one.ranks = 1;
  const int64_t single = store.begin_run(one);
  EXPECT_EQ(store.query("SELECT end_signal IS NULL FROM runs WHERE run_id = ?1",
                        {std::to_string(single)})
                .rows[0][0]
                .text,
            "1");
}

TEST(Store, RefusesNewerSchemaDraftsAndForeignFiles) {
  const std::string dir = fresh_dir();
  const std::string newer = dir + "/newer.db";
  { Store store = Store::open(newer, Mode::kReadWrite); }
  Db(newer, SQLITE_OPEN_READWRITE)
      .exec("PRAGMA user_version = " + std::to_string(kSchemaVersion + 1));
  const std::string expected = "database schema version " + std::to_string(kSchemaVersion + 1) +
                               " is newer than this kvbench (" + std::to_string(kSchemaVersion) +
                               "); upgrade kvbench";
  for (Mode mode : {Mode::kReadWrite, Mode::kReadOnly}) {
    try {
      (void)Store::open(newer, mode);
      ADD_FAILURE() << "a newer schema must be refused";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), newer + ": " + expected);
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    }
  }

  const std::string draft = dir + "/draft.db";
  Db(draft, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE)
      .exec("CREATE TABLE units (id INTEGER PRIMARY KEY, cell TEXT)");
  expect_error([&] { (void)Store::open(draft, Mode::kReadWrite); },
               {draft, "schema version 0", "`units` table", "Move it aside"});
  {
    Db check(draft, SQLITE_OPEN_READONLY);
    Statement st(check, "SELECT count(*) FROM sqlite_master WHERE name = 'runs'");
    ASSERT_TRUE(st.step());
    EXPECT_EQ(st.column_int(0), 0);  // the refused migration left no table behind
  }

  const std::string foreign = dir + "/foreign.db";
  Db(foreign, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE).exec("CREATE TABLE photos (id)");
  expect_error([&] { (void)Store::open(foreign, Mode::kReadWrite); },
               {foreign, "not a kvbench results database", "photos"});

  const std::string text = dir + "/notes.db";
  std::ofstream(text) << "these are my notes, not a database; they are long enough to have a "
                         "header that SQLite reads and rejects as not being its own format\n";
  const std::string msg = expect_error([&] { (void)Store::open(text, Mode::kReadWrite); },
                                       {text, "not a SQLite database"});
  std::ifstream in(text);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first.rfind("these are my notes", 0), 0u) << "the file must be left as it was";
}

// The migration machinery, driven with steps of the test's own.
int g_step_calls[3];
void add_extra_table(Db& db) {
  ++g_step_calls[0];
  db.exec("CREATE TABLE extra (a INTEGER)");
}
void add_extra_column(Db& db) {
  ++g_step_calls[1];
  db.exec("ALTER TABLE extra ADD COLUMN b TEXT DEFAULT 'x'");
}
void half_done_then_fail(Db& db) {
  ++g_step_calls[2];
  db.exec("CREATE TABLE half (a)");
  KVB_USAGE_FAIL() << "this step cannot migrate " << db.path();
}

TEST(Store, MigrationsRunInOrderOneTransactionEach) {
  // Steps numbered from the current version V: V -> V+1 adds a table, V+1 -> V+2 a column,
  // V+2 -> V+3 fails half-way.
  constexpr int V = kSchemaVersion;
  const std::string path = fresh_dir() + "/results.db";
  { Store store = Store::open(path, Mode::kReadWrite); }
  const std::vector<Migration> steps = {{V + 1, "add a column", &add_extra_column},
                                        {V, "add a table", &add_extra_table},
                                        {V + 2, "fails", &half_done_then_fail}};
  Db db(path, SQLITE_OPEN_READWRITE);
  expect_error([&] { upgrade_schema(db, /*read_only=*/true, steps, V + 2); },
               {"schema version " + std::to_string(V) + " is older", "read-write"});
  EXPECT_EQ(upgrade_schema(db, false, steps, V + 2), V);
  EXPECT_EQ(schema_version(db), V + 2);
  EXPECT_EQ(g_step_calls[0], 1);
  EXPECT_EQ(g_step_calls[1], 1);
  db.exec("INSERT INTO extra (a) VALUES (1)");
  {
    Statement st(db, "SELECT b FROM extra");
    ASSERT_TRUE(st.step());
    EXPECT_EQ(st.column_text(0), "x");
  }
  expect_error([&] { upgrade_schema(db, false, steps, V + 3); }, {"cannot migrate"});
  EXPECT_EQ(g_step_calls[2], 1);
  EXPECT_EQ(schema_version(db), V + 2);  // rolled back: still at the last completed version
  Statement half(db, "SELECT count(*) FROM sqlite_master WHERE name = 'half'");
  ASSERT_TRUE(half.step());
  EXPECT_EQ(half.column_int(0), 0);
  expect_error(
      [&] {
        upgrade_schema(db, false, {steps[0], steps[1]}, V + 4);
      },
      {"no migration from schema version " + std::to_string(V + 2)});
}

// A database written by schema version 1 (tests/fixtures/results/schema_v1.sql, the file as it
// was released) is refused read-only with what to do, and migrated read-write keeping its rows.
TEST(Store, MigratesVersion1Databases) {
  const std::string path = fresh_dir() + "/v1.db";
  {
    std::ifstream f(std::string(KVB_FIXTURES_DIR) + "/results/schema_v1.sql");
    ASSERT_TRUE(f.good());
    std::stringstream ddl;
    ddl << f.rdbuf();
    Db db(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    db.exec(ddl.str());
    const std::string key(64, 'a');
    db.exec("INSERT INTO runs (config_text, config_sha256, git_rev, kvbench_version, host, ranks) "
            "VALUES ('x', 'y', 'z', '0.1.0', 'h', 1)");
    db.exec("INSERT INTO units (unit_key, run_id, model, model_sha256, task, task_version, "
            "sample_id, policy, kv_budget_spec, question, max_new_tokens, seed, status) VALUES ('" +
            key + "', 1, 'm', 's', 'niah', 1, 's0', 'snapkv', '128', 'in_prompt', 8, 0, 'ok')");
    db.exec("INSERT INTO measurements VALUES ('" + key +
            "', 100, 8, 0, 12.5, 13.0, 40.0, 5.0, 6.0, 200.0, 1.5, 1000, 2000, 3000, 40, 128.0, "
            "128.0, 136, 128, 136, 4096, NULL)");
  }
  expect_error([&] { (void)Store::open(path, Mode::kReadOnly); },
               {path, "schema version 1 is older than this kvbench (" +
                          std::to_string(kSchemaVersion) + ")", "kvbench sweep --resume"});
  Store store = Store::open(path, Mode::kReadWrite);
  EXPECT_EQ(store.query("PRAGMA user_version").rows[0][0].text, std::to_string(kSchemaVersion));
  const auto m = store.measurements(std::string(64, 'a'));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->prompt_tokens, 100);
  EXPECT_DOUBLE_EQ(m->prefill_ms, 12.5);
  EXPECT_EQ(m->host_rss_peak, 4096);
  EXPECT_FALSE(m->device_peak_bytes.has_value());
  EXPECT_FALSE(m->prefill_shared);  // nothing recorded it before version 2
  EXPECT_EQ(m->decode_batch, 1.0);   // version 5: every earlier unit decoded alone
  EXPECT_EQ(m->prefill_reused, 0);   // version 7: every earlier unit prefilled its own prompt
  EXPECT_EQ(one_value(store, "SELECT count(*) FROM file_digests"), "0");  // added by 3 -> 4
  // The migrated table takes the new column like a fresh one.
  EXPECT_EQ(store.query("SELECT COUNT(*) FROM pragma_table_info('measurements') "
                        "WHERE name = 'prefill_shared' AND \"notnull\" = 1")
                .rows[0][0]
                .text,
            "1");
}

// The columns of a table as (name, type, notnull, pk) lines.
std::string table_columns(const Store& store, const std::string& table) {
  std::string out;
  for (const auto& row :
       store.query("SELECT name, type, \"notnull\", pk FROM pragma_table_info(?1)", {table}).rows) {
    for (const auto& v : row) out += v.text + " ";
    out += "\n";
  }
  return out;
}

// A version-3 database (before the model digest cache) migrates to one whose file_digests table
// is the fresh schema's, and the cache works in it; its rows stay.
TEST(Store, MigratesVersion3DatabasesToTheDigestCache) {
  const std::string dir = fresh_dir();
  const std::string fresh_path = dir + "/fresh.db", old_path = dir + "/v3.db";
  Store fresh = Store::open(fresh_path, Mode::kReadWrite);
  {
    // The version-3 layout: today's schema without the table version 4 added.
    Store s = Store::open(old_path, Mode::kReadWrite);
    (void)s.begin_run(run_info());
  }
  {
    Db db(old_path, SQLITE_OPEN_READWRITE);
    db.exec("DROP TABLE file_digests");
    // Without the column 4 -> 5 adds (rebuilt: DROP COLUMN trips over the DDL's comments).
    std::string cols;
    for (const measurement::Field& f : measurement::kFields) {
      const std::string name = f.name;
      if (name == "decode_batch" || name == "prompt_sha256" || name == "prefill_reused" ||
          name == "channel_bytes_pruned") {
        continue;
      }
      cols += (cols.empty() ? "" : ", ") + name;
    }
    db.exec("CREATE TABLE m3 AS SELECT unit_key, " + cols + " FROM measurements");
    db.exec("DROP TABLE measurements");
    db.exec("ALTER TABLE m3 RENAME TO measurements");
    db.exec("PRAGMA user_version = 3");
  }
  expect_error([&] { (void)Store::open(old_path, Mode::kReadOnly); },
               {old_path, "schema version 3 is older than this kvbench (" +
                              std::to_string(kSchemaVersion) + ")"});
  Store store = Store::open(old_path, Mode::kReadWrite);
  EXPECT_EQ(one_value(store, "PRAGMA user_version"), std::to_string(kSchemaVersion));
  EXPECT_EQ(one_value(store, "SELECT count(*) FROM runs"), "1");
  const std::string cols = table_columns(store, "file_digests");
  EXPECT_EQ(cols, table_columns(fresh, "file_digests"));
  EXPECT_NE(cols.find("inode INTEGER 1 0"), std::string::npos) << cols;
  const FileStamp stamp{"/models/m.gguf", 100, 1700000000123456789, 42};
  EXPECT_FALSE(store.cached_digest(stamp).has_value());
  store.remember_digest(stamp, std::string(64, 'b'));
  EXPECT_EQ(store.cached_digest(stamp), std::string(64, 'b'));
  // The table's CHECK refuses what is not a digest.
  expect_error([&] { store.remember_digest(stamp, "DROP TABLE units"); }, {"CHECK constraint"});
  EXPECT_EQ(store.cached_digest(stamp), std::string(64, 'b'));
}

// A version-6 database (today's measurements without prefill_reused) migrates to 7: its units
// read 0 (each prefilled its own prompt), and the column takes the fresh schema's CHECK.
TEST(Store, MigratesVersion6DatabasesToPrefillReused) {
  const std::string path = fresh_dir() + "/v6.db";
  {
    Store s = Store::open(path, Mode::kReadWrite);
    const int64_t run = s.begin_run(run_info());
    (void)run;
  }
  {
    Db db(path, SQLITE_OPEN_READWRITE);
    std::string cols;
    for (const measurement::Field& f : measurement::kFields) {
      if (std::string(f.name) == "prefill_reused" || std::string(f.name) == "channel_bytes_pruned") {
        continue;
      }
      cols += (cols.empty() ? "" : ", ") + std::string(f.name);
    }
    db.exec("CREATE TABLE m6 AS SELECT unit_key, " + cols + " FROM measurements");
    db.exec("DROP TABLE measurements");
    db.exec("ALTER TABLE m6 RENAME TO measurements");
    db.exec("PRAGMA user_version = 6");
  }
  expect_error([&] { (void)Store::open(path, Mode::kReadOnly); },
               {path, "schema version 6 is older than this kvbench (" +
                          std::to_string(kSchemaVersion) + ")"});
  Store store = Store::open(path, Mode::kReadWrite);
  EXPECT_EQ(one_value(store, "PRAGMA user_version"), std::to_string(kSchemaVersion));
  EXPECT_EQ(store
                .query("SELECT COUNT(*) FROM pragma_table_info('measurements') "
                       "WHERE name = 'prefill_reused' AND \"notnull\" = 1 AND dflt_value = '0'")
                .rows[0][0]
                .text,
            "1");
  EXPECT_NE(one_value(store, "SELECT sql FROM sqlite_master WHERE name = 'measurements'")
                .find("prefill_reused INTEGER NOT NULL DEFAULT 0 CHECK (prefill_reused >= 0)"),
            std::string::npos);
}

// A version-7 database (the schema.sql of version 1, migrated to 7: units without the content
// columns, a status CHECK without 'superseded') rebuilds `units` at 8: every row and every result
// stays, the old rows have no sample_sha256 (result schema 1: adopted or superseded by the next
// sweep), the rebuilt table takes the new CHECK, and the results' foreign keys still cascade.
TEST(Store, MigratesVersion7UnitsToContentKeys) {
  const std::string path = fresh_dir() + "/v7.db";
  const std::string key(64, 'c');
  {
    std::ifstream f(std::string(KVB_FIXTURES_DIR) + "/results/schema_v1.sql");
    ASSERT_TRUE(f.good());
    std::stringstream ddl;
    ddl << f.rdbuf();
    Db db(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    db.exec(ddl.str());
    EXPECT_EQ(upgrade_schema(db, false, migrations(), 7), 1);
    EXPECT_EQ(schema_version(db), 7);
    db.exec("INSERT INTO runs (config_text, config_sha256, git_rev, kvbench_version, host, ranks) "
            "VALUES ('x', 'y', 'z', '0.1.0', 'h', 1)");
    db.exec("INSERT INTO units (unit_key, run_id, model, model_sha256, task, task_version, "
            "task_options, sample_id, policy, kv_budget_spec, question, max_new_tokens, seed, "
            "status, sample_fields, context_length) VALUES ('" + key +
            "', 1, 'm', 's', 'niah', 1, '{\"data\":\"/x/d.jsonl\"}', 's0', 'snapkv', '128', "
            "'in_prompt', 8, 0, 'ok', '{\"context_length\":\"128\"}', 128)");
    db.exec("INSERT INTO metrics VALUES ('" + key + "', 'recall', 0.75, 1)");
    db.exec("INSERT INTO predictions VALUES ('" + key + "', 'abc', '[\"abc\"]')");
    EXPECT_THROW(db.exec("UPDATE units SET status = 'superseded'"), Error);  // 7's CHECK
  }
  Store store = Store::open(path, Mode::kReadWrite);
  EXPECT_EQ(one_value(store, "PRAGMA user_version"), std::to_string(kSchemaVersion));
  EXPECT_EQ(one_value(store, "SELECT task_options || sample_fields || context_length || status "
                             "FROM units"),
            "{\"data\":\"/x/d.jsonl\"}{\"context_length\":\"128\"}128ok");
  EXPECT_EQ(one_value(store, "SELECT count(*) FROM units WHERE sample_sha256 IS NULL AND slot_key "
                             "IS NULL"),
            "1");
  EXPECT_EQ(store.metrics(key).at(0).value, 0.75);
  EXPECT_EQ(one_value(store, "SELECT count(*) FROM pragma_index_list('units') WHERE name IN "
                             "('units_by_task_policy_budget', 'units_by_status', 'units_by_run', "
                             "'units_by_slot')"),
            "4");
  EXPECT_TRUE(store.query("PRAGMA foreign_key_check").rows.empty());
  Db db(path, SQLITE_OPEN_READWRITE);
  db.exec("PRAGMA foreign_keys = ON");
  db.exec("UPDATE units SET status = 'superseded'");
  EXPECT_THROW(db.exec("UPDATE units SET status = 'retired'"), Error);
  EXPECT_THROW(db.exec("UPDATE units SET sample_sha256 = 'DROP TABLE units'"), Error);
  db.exec("DELETE FROM units");
  EXPECT_EQ(one_value(store, "SELECT (SELECT count(*) FROM metrics) + (SELECT count(*) FROM "
                             "predictions)"),
            "0");  // cascaded
}

// The cache answers only for the exact stamp; a new stamp replaces the path's row.
TEST(Store, DigestCacheMatchesEveryStampField) {
  Store store = Store::open(fresh_dir() + "/results.db", Mode::kReadWrite);
  const FileStamp stamp{"/m.gguf", 100, 5000, 7};
  store.remember_digest(stamp, std::string(64, 'a'));
  for (FileStamp other : {FileStamp{"/n.gguf", 100, 5000, 7}, FileStamp{"/m.gguf", 101, 5000, 7},
                          FileStamp{"/m.gguf", 100, 5001, 7}, FileStamp{"/m.gguf", 100, 5000, 8}}) {
    EXPECT_FALSE(store.cached_digest(other).has_value()) << other.path << " " << other.size;
  }
  const FileStamp touched{"/m.gguf", 100, 6000, 7};
  store.remember_digest(touched, std::string(64, 'c'));
  EXPECT_FALSE(store.cached_digest(stamp).has_value());
  EXPECT_EQ(store.cached_digest(touched), std::string(64, 'c'));
  EXPECT_EQ(one_value(store, "SELECT count(*) FROM file_digests"), "1");
}

TEST(Store, SqlInValuesIsStoredVerbatim) {
  Store store = Store::open(fresh_dir() + "/results.db", Mode::kReadWrite);
  const std::string evil = "x'); DROP TABLE units;--";
  RunInfo info = run_info();
  info.config_text = evil;
  const int64_t run = store.begin_run(info);
  UnitRow row = unit_row(evil);
  row.model = "m\"; DELETE FROM runs; --";
  row.spec.task_options["note"] = evil;
  const auto keys = store.register_units(run, {row});
  store.mark_running(run, keys, 1, evil);
  UnitResult r;
  r.unit_key = keys[0];
  r.status = UnitStatus::kError;
  r.error = evil;
  r.metrics = {{evil, 1.0, true}};
  r.prediction = PredictionRow{evil, {evil}};
  store.write_bundle({r});

  EXPECT_EQ(one_value(store, "SELECT count(*) FROM sqlite_master WHERE name = 'units'"), "1");
  EXPECT_EQ(one_value(store, "SELECT sample_id FROM units"), evil);
  EXPECT_EQ(one_value(store, "SELECT model FROM units"), row.model);
  EXPECT_EQ(one_value(store, "SELECT host FROM units"), evil);
  EXPECT_EQ(one_value(store, "SELECT config_text FROM runs"), evil);
  EXPECT_EQ(one_value(store, "SELECT json_extract(task_options, '$.note') FROM units"), evil);
  EXPECT_EQ(one_value(store, "SELECT count(*) FROM units WHERE sample_id = ?1", {evil}), "1");
  EXPECT_EQ(store.unit_status(keys).at(keys[0]).error, evil);
  EXPECT_EQ(store.metrics(keys[0]).at(0).name, evil);
  EXPECT_EQ(store.prediction(keys[0]), r.prediction);
  // query() takes one statement: a second one smuggled after a ';' is refused, not run.
  expect_error([&] { (void)store.query("SELECT 1; DROP TABLE units"); }, {"one SQL statement"});
  EXPECT_EQ(one_value(store, "SELECT count(*) FROM units"), "1");
}

}  // namespace
}  // namespace kvb::results
