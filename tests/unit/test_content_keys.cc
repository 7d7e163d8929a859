// A unit's identity is its content (issue 34, DESIGN.md "Work unit and its key"): the user's
// scenarios with a task of their own (a YAML definition and a jsonl file beside a sweep config),
// expanded as `kvbench sweep` expands them. Editing one item runs exactly that item's units again
// and supersedes the old ones; undoing the edit brings them back; a copied folder runs nothing; a
// database keyed by file paths (result schema 1) is adopted, or superseded where its data changed.
// Model: stories260K from KVB_SHARED_DIR (its header and tokenizer; no weights are loaded).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "harness/sweep_config.h"
#include "harness/sweep_plan.h"
#include "results/sqlite_util.h"
#include "results/store.h"
#include "tasks/task.h"

namespace kvb::harness {
namespace {
namespace fs = std::filesystem;

const std::string kModel = KVB_SHARED_DIR "/models/stories260K/stories260K.bin";
const std::string kTokenizer = KVB_SHARED_DIR "/models/stories260K/tok512.bin";

std::string scratch() {
  const std::string d = std::string(KVB_BINARY_DIR) + "/test_content_keys_" +
                        std::to_string(::getpid()) + "_" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Four items; item `edited` (0-3, or -1) has another answer.
void write_data(const std::string& path, int edited = -1) {
  std::ofstream f(path);
  for (int i = 0; i < 4; ++i) {
    f << "{\"id\": \"q" << i << "\", \"question\": \"What is " << i << " plus one?\", \"answer\": \""
      << (i == edited ? "eleven" : std::to_string(i + 1)) << "\"}\n";
  }
}

// A project folder as a user writes it: sweep.yaml, tasks/myqa.yaml, data/myqa.jsonl.
void write_project(const std::string& dir) {
  fs::create_directories(dir + "/tasks");
  fs::create_directories(dir + "/data");
  std::ofstream(dir + "/tasks/myqa.yaml") << "task: myqa\ndata: ../data/myqa.jsonl\n"
                                             "question: \"Q: {question}\\nA:\"\nchat: false\n"
                                             "reference: answer\nmetric: qa_f1\nmax_new_tokens: 4\nid: id\n";
  write_data(dir + "/data/myqa.jsonl");
  std::ofstream(dir + "/sweep.yaml") << "models:\n  - {name: stories, path: " << kModel
                                     << ", tokenizer: " << kTokenizer << "}\n"
                                     << "tasks: [myqa]\npolicies: [full, window]\nkv_budget: [16]\n";
}

// The matrix of `config` registered in the database at `db` (a new run each time).
Plan plan_of(const std::string& config, const std::string& db) {
  const SweepConfig cfg = load_sweep_config(config);
  results::Store store = results::Store::open(db, results::Mode::kReadWrite);
  std::map<std::string, std::string> model_hashes;
  return expand(cfg, store, store.begin_run(results::RunInfo{}), &model_hashes);
}

int to_run(const Plan& p) {
  int n = 0;
  for (const WireBundle& b : p.bundles) n += static_cast<int>(b.units.size());
  return n;
}

// The units of `p` still to run, as (sample_id, policy).
std::set<std::pair<std::string, std::string>> running(const Plan& p) {
  std::set<std::pair<std::string, std::string>> out;
  for (const WireBundle& b : p.bundles) {
    for (const WireUnit& u : b.units) out.insert({b.sample.id, u.policy});
  }
  return out;
}

// Every pending unit finishes ok with one metric and its measurements, as a worker's would.
void finish_all(const std::string& db) {
  results::Store store = results::Store::open(db, results::Mode::kReadWrite);
  std::vector<std::string> keys;
  for (const auto& row : store.query("SELECT unit_key FROM units WHERE status = 'pending'").rows) {
    keys.push_back(row[0].text);
  }
  if (keys.empty()) return;
  const int64_t run = store.begin_run(results::RunInfo{});
  store.mark_running(run, keys, 0, "host");
  std::vector<results::UnitResult> rs;
  for (const std::string& k : keys) {
    results::UnitResult r;
    r.unit_key = k;
    r.metrics = {{"qa_f1", 0.5, true}};
    r.measurements = results::Measurements{};
    r.prediction = results::PredictionRow{"two", {"2"}};
    rs.push_back(r);
  }
  store.write_bundle(rs);
}

std::string value(const std::string& db, const std::string& sql) {
  results::Store store = results::Store::open(db, results::Mode::kReadOnly);
  const results::QueryResult r = store.query(sql);
  return r.rows.empty() ? "" : r.rows[0][0].text;
}

TEST(ContentKeys, SampleDigestCoversEveryMember) {
  tasks::Sample s;
  s.id = "q0";
  s.context = "ctx";
  s.question = "q";
  s.references = {"a"};
  s.fields = {{"depth", "50"}};
  const std::string base = tasks::sample_sha256(s);
  EXPECT_EQ(base.size(), 64u);
  EXPECT_EQ(tasks::sample_sha256(s), base);  // deterministic
  const std::vector<void (*)(tasks::Sample&)> edits = {
      [](tasks::Sample& x) { x.id = "q1"; },
      [](tasks::Sample& x) { x.kind = tasks::SampleKind::kChoice; },
      [](tasks::Sample& x) { x.context += " "; },
      [](tasks::Sample& x) { x.question = "Q"; },
      [](tasks::Sample& x) { x.chat = false; },
      [](tasks::Sample& x) { x.answer_prefix = "A:"; },
      [](tasks::Sample& x) { x.max_new_tokens = 33; },
      [](tasks::Sample& x) { x.max_prompt_tokens = 100; },
      [](tasks::Sample& x) { x.stop_strings = {"\n"}; },
      [](tasks::Sample& x) { x.references = {"b"}; },
      [](tasks::Sample& x) { x.references = {"a", ""}; },
      [](tasks::Sample& x) { x.choices = {" A"}; },
      [](tasks::Sample& x) { x.gold = 0; },
      [](tasks::Sample& x) { x.text = "t"; },
      [](tasks::Sample& x) { x.max_tokens = 5; },
      [](tasks::Sample& x) { x.fields["depth"] = "51"; },
      [](tasks::Sample& x) { x.fields["x"] = ""; },
      // Moving text between members is another sample, not the same bytes run together.
      [](tasks::Sample& x) { x.context = "ct"; x.question = "xq"; },
  };
  std::set<std::string> seen = {base};
  for (size_t i = 0; i < edits.size(); ++i) {
    tasks::Sample t = s;
    edits[i](t);
    EXPECT_TRUE(seen.insert(tasks::sample_sha256(t)).second) << "edit " << i;
  }
}

// Edit one item: exactly its two units (full, window) run again; the old ones are superseded,
// kept and not counted. Undo the edit: they are current again and nothing runs.
TEST(ContentKeys, EditingOneItemRerunsExactlyItsUnits) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  const std::string dir = scratch();
  write_project(dir);
  const std::string db = dir + "/results.db";
  const Plan first = plan_of(dir + "/sweep.yaml", db);
  EXPECT_EQ(first.all_keys.size(), 8u);
  EXPECT_EQ(to_run(first), 8);
  finish_all(db);
  EXPECT_EQ(to_run(plan_of(dir + "/sweep.yaml", db)), 0);

  write_data(dir + "/data/myqa.jsonl", 2);
  const Plan edited = plan_of(dir + "/sweep.yaml", db);
  const std::set<std::pair<std::string, std::string>> want = {{"q2", "full"}, {"q2", "window"}};
  EXPECT_EQ(running(edited), want);
  EXPECT_EQ(edited.registered.superseded, 2);
  EXPECT_EQ(value(db, "SELECT group_concat(sample_id || ':' || policy) FROM (SELECT * FROM units "
                      "WHERE status = 'superseded' ORDER BY policy)"),
            "q2:full,q2:window");
  // The other samples' keys did not change.
  size_t same = 0;
  for (size_t i = 0; i < 8; ++i) same += first.all_keys[i] == edited.all_keys[i];
  EXPECT_EQ(same, 6u);
  finish_all(db);
  // Counted: 8 ok units, one per (sample, policy); the superseded rows keep their results.
  EXPECT_EQ(value(db, "SELECT count(*) FROM units WHERE status = 'ok'"), "8");
  EXPECT_EQ(value(db, "SELECT count(*) FROM units u JOIN metrics m USING (unit_key)"), "10");

  write_data(dir + "/data/myqa.jsonl");  // undone
  const Plan undone = plan_of(dir + "/sweep.yaml", db);
  EXPECT_EQ(to_run(undone), 0);
  EXPECT_EQ(undone.all_keys, first.all_keys);
  EXPECT_EQ(undone.registered.restored, 2);
  EXPECT_EQ(undone.registered.superseded, 2);
  EXPECT_EQ(value(db, "SELECT count(*) FROM units WHERE status = 'ok'"), "8");
  fs::remove_all(dir);
}

// The folder copied elsewhere (the config, its tasks/ and data/), with the same database: every
// key is the same, so nothing runs; the units table keeps the paths the units ran with.
TEST(ContentKeys, ACopiedFolderRunsNothing) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  const std::string dir = scratch();
  write_project(dir + "/a");
  const std::string db = dir + "/results.db";
  const Plan a = plan_of(dir + "/a/sweep.yaml", db);
  finish_all(db);
  fs::copy(dir + "/a", dir + "/b", fs::copy_options::recursive);
  const Plan b = plan_of(dir + "/b/sweep.yaml", db);
  EXPECT_EQ(b.all_keys, a.all_keys);
  EXPECT_EQ(to_run(b), 0);
  EXPECT_EQ(b.registered.superseded, 0);
  EXPECT_EQ(value(db, "SELECT count(*) FROM units"), "8");
  // The shown options name the files; the key does not.
  EXPECT_NE(value(db, "SELECT task_options FROM units LIMIT 1").find(dir + "/a/tasks/myqa.yaml"),
            std::string::npos);
  // Edited in the copy: its units run again there and supersede the original's.
  write_data(dir + "/b/data/myqa.jsonl", 0);
  const Plan edited = plan_of(dir + "/b/sweep.yaml", db);
  const std::set<std::pair<std::string, std::string>> want = {{"q0", "full"}, {"q0", "window"}};
  EXPECT_EQ(running(edited), want);
  EXPECT_EQ(edited.registered.superseded, 2);
  fs::remove_all(dir);
}

// Two data files of one task definition in one matrix are two sets of units that never
// supersede each other, whichever the sweep names.
TEST(ContentKeys, TwoDataFilesOfOneTaskKeepTheirOwnUnits) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  const std::string dir = scratch();
  write_project(dir);
  write_data(dir + "/data/hard.jsonl", 1);
  std::ofstream(dir + "/both.yaml") << "models:\n  - {name: stories, path: " << kModel
                                    << ", tokenizer: " << kTokenizer << "}\n"
                                    << "tasks:\n  - {name: myqa, options: {data: data/myqa.jsonl}}\n"
                                       "  - {name: myqa, options: {data: data/hard.jsonl}}\n"
                                       "policies: [full]\n";
  std::ofstream(dir + "/hard.yaml") << "models:\n  - {name: stories, path: " << kModel
                                    << ", tokenizer: " << kTokenizer << "}\n"
                                    << "tasks:\n  - {name: myqa, options: {data: data/hard.jsonl}}\n"
                                       "policies: [full]\n";
  const std::string db = dir + "/results.db";
  const Plan both = plan_of(dir + "/both.yaml", db);
  EXPECT_EQ(both.all_keys.size(), 8u);
  // Items 0, 2 and 3 are the same in both files: one unit each, which both entries share.
  EXPECT_EQ(std::set<std::string>(both.all_keys.begin(), both.all_keys.end()).size(), 5u);
  EXPECT_EQ(both.registered.superseded, 0);
  finish_all(db);
  const Plan hard = plan_of(dir + "/hard.yaml", db);
  EXPECT_EQ(to_run(hard), 0);
  EXPECT_EQ(hard.registered.superseded, 0);
  EXPECT_EQ(value(db, "SELECT count(*) FROM units WHERE status = 'ok'"), "5");
  fs::remove_all(dir);
}

// A database written before content keys (result schema 1: keys of the file paths, no
// sample_sha256) resumes: its rows whose sample fields and references equal the data now are
// adopted under content keys with their results; a row whose answer changed since is superseded
// and its unit runs.
TEST(ContentKeys, LegacyDatabaseResumesUnderContentKeys) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  const std::string dir = scratch();
  write_project(dir);
  const std::string db = dir + "/results.db";
  const Plan plan = plan_of(dir + "/sweep.yaml", db);
  finish_all(db);
  {
    // As result schema 1 wrote it: each row under its legacy key, no content columns; and the
    // stored references: item 1's answer as it was then ("9", the file now says "2").
    results::Db raw(db, SQLITE_OPEN_READWRITE);
    raw.exec("PRAGMA foreign_keys = OFF");
    for (size_t i = 0; i < plan.all_keys.size(); ++i) {
      for (const char* table : {"units", "metrics", "measurements", "predictions"}) {
        raw.exec(std::string("UPDATE ") + table + " SET unit_key = '" + plan.legacy_keys[i] +
                 "' WHERE unit_key = '" + plan.all_keys[i] + "'");
      }
    }
    raw.exec("UPDATE units SET sample_sha256 = NULL, slot_key = NULL");
    for (size_t i = 0; i < plan.all_keys.size(); ++i) {
      const std::string& id = plan.bundles[i / 2].sample.id;  // q0 .. q3, two units each
      const std::string answer = id == "q1" ? "9" : std::to_string(std::stoi(id.substr(1)) + 1);
      raw.exec("UPDATE predictions SET references_json = '[\"" + answer + "\"]' WHERE unit_key = '" +
               plan.legacy_keys[i] + "'");
    }
  }
  const Plan resumed = plan_of(dir + "/sweep.yaml", db);
  EXPECT_EQ(resumed.all_keys, plan.all_keys);
  EXPECT_EQ(resumed.registered.adopted, 6);
  EXPECT_EQ(resumed.registered.stale, 2);
  const std::set<std::pair<std::string, std::string>> want = {{"q1", "full"}, {"q1", "window"}};
  EXPECT_EQ(running(resumed), want);
  // Adopted rows keep their results under the new keys; nothing is left under a legacy key.
  EXPECT_EQ(value(db, "SELECT count(*) FROM units WHERE status = 'ok' AND sample_sha256 IS NOT "
                      "NULL"),
            "6");
  EXPECT_EQ(value(db, "SELECT count(*) FROM metrics m JOIN units u USING (unit_key) WHERE "
                      "u.status = 'ok'"),
            "6");
  EXPECT_EQ(value(db, "SELECT count(*) FROM units WHERE status = 'superseded' AND sample_sha256 "
                      "IS NULL"),
            "2");
  {
    results::Store store = results::Store::open(db, results::Mode::kReadOnly);
    EXPECT_TRUE(store.query("PRAGMA foreign_key_check").rows.empty());
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvb::harness
