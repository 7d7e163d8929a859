// Task registry and the default aggregation.
#include "tasks/task.h"

#include "common/error.h"
#include "tasks/tasks.h"

namespace kvb::tasks {

Scores Task::aggregate(const std::vector<Scores>& per_sample) const {
  std::map<std::string, std::pair<double, int>> acc;
  for (const Scores& s : per_sample) {
    for (const auto& [k, v] : s) {
      acc[k].first += v;
      acc[k].second += 1;
    }
  }
  Scores out;
  for (const auto& [k, sn] : acc) out[k] = sn.first / sn.second;
  return out;
}

const TaskInfo* find_task(const std::string& name) {
  for (const auto& t : task_registry()) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::unique_ptr<Task> make_task(const std::string& name, const Options& options) {
  const TaskInfo* info = find_task(name);
  if (!info) {
    std::string names;
    for (const auto& t : task_registry()) names += (names.empty() ? "" : ", ") + t.name;
    KVB_USAGE_FAIL() << "unknown task '" << name << "'; known tasks: " << names
                     << " (kvbench ls tasks describes them)";
  }
  Options opts = options;
  opts.set_kind("task option");
  std::unique_ptr<Task> task = info->make(opts);
  opts.check_all_used("task " + name, info->params);
  return task;
}

}  // namespace kvb::tasks
