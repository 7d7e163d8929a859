// Task groups (issue 17 item 4; TASKS.md "Tasks defined in YAML"): a task definition's `group:`
// is stored per sample as the field task_group. A group's score is the unweighted mean over its
// tasks of each task's mean score, as RULER's summary averages its 13 tasks; each (task, task
// options, metric) with a score counts as one task. Its 95% interval is the stratified
// percentile bootstrap of that mean (mean_of_means_ci: each task's scores resampled on their own,
// 10,000 resamples, seed 0), the convention of the paper table's average (issue 34: one
// convention, inside the metric's range; a Welch t interval left it). Rows are per model, group, data folder (task option data_dir: RULER keeps one context
// length per folder), policy and budget.
#pragma once

#include <string>
#include <vector>

#include "common/table.h"
#include "results/analysis.h"

namespace kvb::results {

struct GroupRow {
  std::string model, group, data_dir, policy, budget;  // budget: budget_label
  std::string metrics;                                 // the tasks' metric names, joined
  bool higher_is_better = true;
  int tasks = 0, n = 0;  // tasks with a score; ok units with a value over them
  double mean = kNaN;
  double lo = kNaN, hi = kNaN;  // 95% interval; NaN when a task has n < 2
};
std::vector<GroupRow> group_rows(const Store& store, const Filter& filter);
Table groups_table(const std::vector<GroupRow>& rows);

}  // namespace kvb::results
