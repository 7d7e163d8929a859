// Task definitions in YAML (TASKS.md "Tasks defined in YAML"; configs/tasks/README.md): reading a
// definition into tasks::DataTaskDef with "<file>:<line>: <key>: <what>" errors, finding a
// definition by task name, and building any task, built in or defined in a file.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tasks/data_task.h"

namespace kvb::harness {

// Reads and checks a definition (includes merged: `include:` names files relative to the
// including one; cycles, more than 32 levels and unknown keys are usage errors). The task's name
// is `task:` or else the file name without .yaml; files whose name starts with '_' are fragments
// for `include:` and are refused here.
tasks::DataTaskDef load_task_file(const std::string& path);
// The names `fields:` refuses for a kept field: the columns of the results' units table
// (results/schema.sql) except context_length and depth, which fields fill on purpose, and the
// columns `kvbench eval` prints beside the fields (sample, prediction), and task_group (group:).
const std::vector<std::string>& reserved_field_names();

// Where task definitions are found by name (issue 34 F5), in order: the folders given with
// --include-path (or a sweep's `include_path:`, set_task_include_paths), then the folders of the
// environment variable KVBENCH_TASK_PATH (':'-separated), then configs/tasks under the working
// directory (the shipped definitions, from a checkout's root). Never a path compiled into the
// binary. Folders that do not exist are kept (the error lists what was searched).
std::vector<std::string> task_search_path();
// The folders of --include-path / include_path: for this process, searched first; relative ones
// are made absolute against the working directory now.
void set_task_include_paths(const std::vector<std::string>& dirs);
// Appends folders (a sweep's include_path:, resolved against its config's folder) after those.
void add_task_include_paths(const std::vector<std::string>& dirs);
// "a, b, c": the search path for messages.
std::string task_search_path_text();
// The definition file of task `name`: <name>.yaml (or .yml) anywhere under the first of `dirs`
// that has one (subfolders included, at most 4 deep); "" if none. Two files of that name under
// one folder are a usage error.
std::string find_task_file(const std::string& name, const std::vector<std::string>& dirs);
// The task definitions under `dir` (sorted by name; fragments '_*' left out).
std::vector<std::string> list_task_files(const std::string& dir);

// TaskContext::render_jinja as every command sets it: workers/tokenizer's sandboxed minja
// renderer (jinja_text_template.h) under its default limits.
std::vector<std::string> render_task_jinja(const std::string& text, const std::string& origin,
                                           const std::vector<std::string>& items_json);

// A registered task by name, or a definition: the file in option task_file, else the file
// find_task_file(name, task_search_path()) finds. Unknown names are usage errors listing both and
// the folders searched.
std::unique_ptr<tasks::Task> make_any_task(const std::string& name, const Options& options);

}  // namespace kvb::harness
