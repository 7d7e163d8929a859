// Task registry and the default aggregation.
#include "tasks/task.h"

#include "common/error.h"
#include "common/sha256.h"
#include "tasks/tasks.h"

namespace kvb::tasks {

std::string sample_sha256(const Sample& s) {
  Sha256 h;
  auto put = [&](std::string_view name, std::string_view value) {
    const std::string head = std::string(name) + " " + std::to_string(value.size()) + ":";
    h.update(head);
    h.update(value);
    h.update("\n");
  };
  auto put_list = [&](std::string_view name, const std::vector<std::string>& values) {
    put(name, std::to_string(values.size()));
    for (const std::string& v : values) put(name, v);
  };
  h.update("kvbench sample 1\n");
  put("id", s.id);
  put("kind", std::to_string(static_cast<int>(s.kind)));
  put("context", s.context);
  put("question", s.question);
  put("chat", s.chat ? "1" : "0");
  put("answer_prefix", s.answer_prefix);
  put("max_new_tokens", std::to_string(s.max_new_tokens));
  put("max_prompt_tokens", std::to_string(s.max_prompt_tokens));
  put_list("stop_strings", s.stop_strings);
  put_list("references", s.references);
  put_list("choices", s.choices);
  put("gold", std::to_string(s.gold));
  put("text", s.text);
  put("max_tokens", std::to_string(s.max_tokens));
  put("fields", std::to_string(s.fields.size()));
  for (const auto& [k, v] : s.fields) {
    put("field", k);
    put("value", v);
  }
  return h.hex_digest();
}

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
