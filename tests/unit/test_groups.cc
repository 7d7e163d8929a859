// Task-group scores (results/groups.h; issue 17 item 4) on a database written here by hand: the
// group mean is the mean of the task means (not of the samples), the interval is the
// stratified percentile bootstrap of that mean (each task resampled on its own; issue 34 replaced a
// Welch-Satterthwaite t interval that could leave the metric's range), data folders and budgets split rows,
// units without a group, failed units and other groups stay out, and `--filter` applies.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cmath>
#include <filesystem>

#include "results/groups.h"
#include "results/sqlite_util.h"
#include "results/stats.h"

namespace kvb::results {
namespace {
namespace fs = std::filesystem;

struct Unit {
  std::string task, data_dir, policy, budget, group, metric, status;
  double value;
};

std::string make_db(const std::vector<Unit>& units) {
  const std::string path = KVB_BINARY_DIR "/test_groups/results.db";
  fs::remove_all(fs::path(path).parent_path());
  fs::create_directories(fs::path(path).parent_path());
  { Store::open(path, Mode::kReadWrite); }  // the schema
  Db db(path, SQLITE_OPEN_READWRITE);
  auto exec = [&](const std::string& sql) {
    KVB_SQLITE_CHECK(db, sqlite3_exec(db.get(), sql.c_str(), nullptr, nullptr, nullptr), sql);
  };
  exec(
      "INSERT INTO runs (config_text, config_sha256, git_rev, kvbench_version, host, ranks) "
      "VALUES ('', '', 'r', 'v', 'h', 1)");
  for (size_t i = 0; i < units.size(); ++i) {
    const Unit& u = units[i];
    char key[65];
    std::snprintf(key, sizeof key, "%064zx", i + 1);
    const std::string opts = u.data_dir.empty() ? "{}" : "{\"data_dir\":\"" + u.data_dir + "\"}";
    const std::string fields = u.group.empty() ? "{}" : "{\"task_group\":\"" + u.group + "\"}";
    exec(
        "INSERT INTO units (unit_key, run_id, model, model_sha256, task, task_version, "
        "task_options, sample_id, policy, kv_budget_spec, question, max_new_tokens, seed, "
        "sample_fields, status) VALUES ('" +
        std::string(key) + "', 1, 'm', 'x', '" + u.task + "', 1, '" + opts + "', '" +
        std::to_string(i) + "', '" + u.policy + "', '" + u.budget + "', 'in_prompt', 8, 0, '" +
        fields + "', '" + u.status + "')");
    exec("INSERT INTO metrics (unit_key, name, value, higher_is_better) VALUES ('" +
         std::string(key) + "', '" + u.metric + "', " + std::to_string(u.value) + ", 1)");
  }
  return path;
}

TEST(Groups, MeanOfTaskMeansWithStratifiedBootstrapInterval) {
  const std::string d4 = "/data/RULER/4096", d8 = "/data/RULER/8192";
  std::vector<Unit> units;
  for (double v : {100, 50, 0, 50}) units.push_back({"a", d4, "full", "", "ruler", "sma", "ok", v});
  for (double v : {100, 100, 0}) units.push_back({"b", d4, "full", "", "ruler", "smp", "ok", v});
  units.push_back({"b", d4, "full", "", "ruler", "smp", "error", 0});  // not ok: left out
  units.push_back({"c", d4, "full", "", "", "sma", "ok", 0});          // no group
  units.push_back({"a", d8, "full", "", "ruler", "sma", "ok", 25});    // another folder
  units.push_back({"a", d8, "full", "", "ruler", "sma", "ok", 75});
  units.push_back({"a", d4, "h2o", "64", "ruler", "sma", "ok", 10});  // a budget, n = 1
  units.push_back({"a", d4, "full", "", "other", "sma", "ok", 40});   // another group
  const Store store = Store::open(make_db(units), Mode::kReadOnly);
  const std::vector<GroupRow> rows = group_rows(store, {});
  ASSERT_EQ(rows.size(), 4u);
  // Sorted: group other, then ruler 4096 full, ruler 4096 h2o, ruler 8192.
  EXPECT_EQ(rows[0].group, "other");
  const GroupRow& g = rows[1];
  EXPECT_EQ(g.group, "ruler");
  EXPECT_EQ(g.data_dir, d4);
  EXPECT_EQ(g.policy, "full");
  EXPECT_EQ(g.budget, "-");
  EXPECT_EQ(g.tasks, 2);
  EXPECT_EQ(g.n, 7);
  EXPECT_EQ(g.metrics, "sma, smp");
  // (mean a + mean b) / 2 = (50 + 200/3) / 2, not the sample mean 400/7.
  EXPECT_NEAR(g.mean, 175.0 / 3, 1e-12);
  // The interval resamples each task on its own: the stratified bootstrap of the two tasks.
  const MeanCI c = mean_of_means_ci({{100, 50, 0, 50}, {100, 100, 0}});
  EXPECT_DOUBLE_EQ(g.lo, c.lo);
  EXPECT_DOUBLE_EQ(g.hi, c.hi);
  EXPECT_LT(g.lo, g.mean);
  EXPECT_GT(g.hi, g.mean);
  // Inside the scores' range, where the Welch t interval of the same task means (task a: s^2 =
  // 5000/3, n = 4; task b: s^2 = 10000/3, n = 3; dof about 3.46) leaves it above.
  EXPECT_GE(g.lo, 0);
  EXPECT_LE(g.hi, 100);
  const double se2a = 5000.0 / 3 / 4, se2b = 10000.0 / 3 / 3;
  const double dof = (se2a + se2b) * (se2a + se2b) / (se2a * se2a / 3 + se2b * se2b / 2);
  const double half = student_t_quantile(0.975, dof) * std::sqrt(se2a + se2b) / 2;
  EXPECT_GT(175.0 / 3 + half, 100);
  EXPECT_LT(175.0 / 3 - half, 1);  // and all but reaches 0 below
  // A narrower interval than that t interval, and wide still: two small tasks.
  EXPECT_LT(g.hi - g.lo, 2 * half);
  EXPECT_GT(g.hi - g.lo, 30);
  // One task with one unit: a mean, no interval.
  EXPECT_EQ(rows[2].policy, "h2o");
  EXPECT_EQ(rows[2].budget, "64");
  EXPECT_DOUBLE_EQ(rows[2].mean, 10);
  EXPECT_TRUE(std::isnan(rows[2].lo));
  EXPECT_EQ(rows[3].data_dir, d8);
  EXPECT_DOUBLE_EQ(rows[3].mean, 50);
  EXPECT_EQ(rows[3].tasks, 1);
  // --filter task=b keeps only task b.
  Filter f;
  f.allow["task"] = {"b"};
  const std::vector<GroupRow> only_b = group_rows(store, f);
  ASSERT_EQ(only_b.size(), 1u);
  EXPECT_NEAR(only_b[0].mean, 200.0 / 3, 1e-12);
  const Table t = groups_table(rows);
  EXPECT_EQ(t.size(), 4u);
}

}  // namespace
}  // namespace kvb::results
