// `kvbench ls policies|tasks`: the registered names with a line of description and their options;
// for tasks also the YAML task definitions of configs/tasks and the metrics they may name.
#include <algorithm>
#include <boost/program_options.hpp>
#include <filesystem>
#include <iostream>
#include <set>

#include "common/error.h"
#include "common/log.h"
#include "harness/cli.h"
#include "harness/task_file.h"
#include "kernels/policies/policy.h"
#include "tasks/task.h"

namespace kvb::harness {

int cmd_ls(const std::vector<std::string>& all_args) {
  // -v / --verbose anywhere (the option every command takes); the rest are words.
  std::vector<std::string> args;
  for (const std::string& a : all_args) {
    if (a == "-v" || a == "--verbose") {
      set_log_level(LogLevel::kDebug);
    } else {
      args.push_back(a);
    }
  }
  const std::string usage =
      "usage: kvbench ls policies | tasks [--include-path DIR ...]\n\n"
      "Lists the registered eviction policies or tasks: name, description, and each option with\n"
      "its default (set with --policy-opt / --task-opt key=value). `tasks` also lists the task\n"
      "definitions (YAML) on the task search path: the folders of --include-path, then those of\n"
      "the environment variable KVBENCH_TASK_PATH (':'-separated), then configs/tasks under the\n"
      "working directory (the shipped ones, from a checkout's root); the options they all take,\n"
      "and the metrics a definition may name.\n";
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << usage;
    return args.empty() ? 2 : 0;
  }
  std::vector<std::string> include;
  for (size_t i = 1; i < args.size(); ++i) {
    KVB_USAGE_CHECK(args[0] == "tasks" && args[i] == "--include-path" && i + 1 < args.size())
        << "unexpected argument '" << args[i] << "'\n" << usage;
    include.push_back(args[++i]);
  }
  set_task_include_paths(include);
  KVB_USAGE_CHECK(args[0] == "policies" || args[0] == "tasks")
      << "kvbench ls: unknown list '" << args[0] << "'; available: policies, tasks";
  auto print_params = [](const std::vector<ParamDoc>& params, const char* flag) {
    for (const auto& d : params) {
      std::cout << "    " << flag << " " << d.name << "=" << d.default_value << "  " << d.description;
      if (!d.choices.empty()) {
        std::cout << " [";
        for (size_t i = 0; i < d.choices.size(); ++i) std::cout << (i ? "|" : "") << d.choices[i];
        std::cout << "]";
      }
      std::cout << "\n";
    }
  };
  if (args[0] == "tasks") {
    for (const auto& t : tasks::task_registry()) {
      std::cout << t.name << "\n    " << t.description << "\n";
      print_params(t.params, "--task-opt");
    }
    // The definitions on the task search path (--include-path, KVBENCH_TASK_PATH, the working
    // directory's configs/tasks), each folder's own; a name found earlier shadows later ones.
    std::vector<std::string> files;
    std::set<std::string> names;
    for (const std::string& dir : task_search_path()) {
      for (const std::string& f : list_task_files(dir)) {
        if (names.insert(std::filesystem::path(f).stem().string()).second) files.push_back(f);
      }
    }
    std::cout << "\n# Task definitions on the search path (" << task_search_path_text()
              << "; YAML; TASKS.md)\n";
    if (files.empty()) {
      std::cout << "(none: run from a kvbench checkout's root, or add folders with --include-path "
                   "DIR or KVBENCH_TASK_PATH)\n";
    }
    for (const std::string& f : files) {
      try {
        const tasks::DataTaskDef d = load_task_file(f);
        std::cout << d.name << "\n    "
                  << (d.description.empty() ? "(no description)" : d.description) << " [metric "
                  << d.metric << (d.group.empty() ? "" : ", group " + d.group) << "; " << f
                  << "]\n";
      } catch (const Error& e) {
        std::cout << f << "\n    INVALID: " << e.what() << "\n";
        if (!e.origin().empty()) {
          KVB_LOG_DEBUG << f << ": raised at " << e.origin();
        }
      }
    }
    std::cout << "\nEvery task definition takes:\n";
    print_params(tasks::data_task_params(), "--task-opt");
    std::cout << "\nMetrics a definition may name (metric:):\n";
    for (const auto& m : tasks::metric_table()) {
      std::cout << "    " << m.name << "  " << m.description << "\n";
    }
    return 0;
  }
  for (const auto& p : policies::policy_registry()) {
    std::cout << p.name << "\n    " << p.description << "\n";
    std::vector<policies::ParamDoc> all = p.params;
    for (const policies::ParamDoc& d : policies::common_params()) {
      // full and think refuse think: (full is the reference; think has its own ratio).
      if (!p.budgeted && (d.name == "think" || d.name == "think_window")) continue;
      // subgen and kvzip refuse think, positions: rerotate and then (PolicyInfo::composes);
      // full and think refuse then (they keep every token).
      const bool composition =
          d.name == "then" || d.name == "first_compression_ratio" || d.name == "then.<option>";
      if (!p.composes &&
          (d.name == "think" || d.name == "think_window" || d.name == "positions" || composition)) {
        continue;
      }
      if (!p.budgeted && composition) continue;
      // A policy's own option of that name documents it (streaming_llm's positions).
      if (std::any_of(p.params.begin(), p.params.end(),
                      [&](const policies::ParamDoc& o) { return o.name == d.name; })) {
        continue;
      }
      all.push_back(d);
    }
    print_params(all, "--policy-opt");
  }
  return 0;
}

}  // namespace kvb::harness
