// Task-group scores (results/groups.h).
#include "results/groups.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "results/stats.h"

namespace kvb::results {

std::vector<GroupRow> group_rows(const Store& store, const Filter& filter) {
  std::vector<std::string> params;
  const std::string where = filter.sql(&params, true);
  const QueryResult r = store.query(
      "SELECT u.model, json_extract(u.sample_fields, '$.task_group'), "
      "COALESCE(json_extract(u.task_options, '$.data_dir'), ''), u.task, u.task_options, m.name, "
      "m.higher_is_better, u.policy, u.kv_budget_spec, m.value "
      "FROM units u JOIN metrics m ON m.unit_key = u.unit_key "
      "WHERE u.status = 'ok' AND m.value IS NOT NULL AND "
      "json_extract(u.sample_fields, '$.task_group') IS NOT NULL" +
          where,
      params);
  // (model, group, data_dir, policy, budget) -> (task, options, metric) -> values
  using RowKey = std::tuple<std::string, std::string, std::string, std::string, std::string>;
  using TaskKey = std::tuple<std::string, std::string, std::string>;
  std::map<RowKey, std::map<TaskKey, std::vector<double>>> values;
  std::map<RowKey, bool> hib;
  for (const auto& row : r.rows) {
    const RowKey key{row[0].text, row[1].text, row[2].text, row[7].text, budget_label(row[8].text)};
    values[key][{row[3].text, row[4].text, row[5].text}].push_back(
        std::strtod(row[9].text.c_str(), nullptr));
    auto [it, fresh] = hib.emplace(key, row[6].text == "1");
    it->second = it->second && row[6].text == "1";
  }
  std::vector<GroupRow> out;
  for (const auto& [key, by_task] : values) {
    GroupRow g;
    std::tie(g.model, g.group, g.data_dir, g.policy, g.budget) = key;
    g.higher_is_better = hib[key];
    std::set<std::string> metric_names;
    double sum_means = 0;
    bool interval = true;  // a task of one unit shows no spread: no interval
    std::vector<std::vector<double>> per_task;
    for (const auto& [task, x] : by_task) {
      metric_names.insert(std::get<2>(task));
      double sum = 0;
      for (double v : x) sum += v;
      sum_means += sum / static_cast<double>(x.size());
      g.n += static_cast<int>(x.size());
      interval = interval && x.size() >= 2;
      per_task.push_back(x);
    }
    g.tasks = static_cast<int>(by_task.size());
    g.mean = sum_means / g.tasks;
    if (interval) {
      const MeanCI c = mean_of_means_ci(per_task);
      g.lo = c.lo;
      g.hi = c.hi;
    }
    for (const std::string& m : metric_names) g.metrics += (g.metrics.empty() ? "" : ", ") + m;
    out.push_back(std::move(g));
  }
  std::sort(out.begin(), out.end(), [](const GroupRow& a, const GroupRow& b) {
    if (a.model != b.model) return a.model < b.model;
    if (a.group != b.group) return a.group < b.group;
    if (a.data_dir != b.data_dir) return a.data_dir < b.data_dir;
    if (a.policy != b.policy) return policy_before(a.policy, b.policy);
    return budget_order(a.budget) < budget_order(b.budget);
  });
  return out;
}

Table groups_table(const std::vector<GroupRow>& rows) {
  Table t({"model", "group", "data_dir", "policy", "kv_budget", "metrics", "tasks", "n", "mean",
           "ci95 lo", "ci95 hi"});
  for (const auto& g : rows) {
    t.add({g.model, g.group, g.data_dir.empty() ? "-" : g.data_dir, g.policy, g.budget,
           g.metrics + (g.higher_is_better ? " ↑" : " ↓"), std::to_string(g.tasks),
           std::to_string(g.n), fixed(g.mean), fixed(g.lo), fixed(g.hi)});
  }
  return t;
}

}  // namespace kvb::results
