// Task definitions in YAML (harness/task_file.h): a strict schema walk over the YAML tree of
// harness/yaml_tree.h, so that every error names the definition file, the line and the key.
#include "harness/task_file.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "common/error.h"
#include "common/sha256.h"
#include "harness/yaml_tree.h"
#include "workers/tokenizer/jinja_text_template.h"

#ifndef KVB_TASKS_DIR
#define KVB_TASKS_DIR "configs/tasks"
#endif

namespace kvb::harness {
namespace {
namespace fs = std::filesystem;
using namespace yamlcfg;  // NOLINT: the YAML tree and its checks (harness/yaml_tree.h)

const std::vector<std::string> kKeys = {
    "task",     "description",   "version", "include",   "group",  "data",       "context",
    "question", "answer_prefix", "chat",    "reference", "metric", "scale",      "max_new_tokens",
    "stop",     "first_line",    "id",      "classes",   "fields", "max_line_mb",
    "filter_list"};

bool valid_name(const std::string& s) {
  return !s.empty() && s.size() <= 128 && s[0] != '_' &&
         std::all_of(s.begin(), s.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
         });
}

bool to_bool(const Node& n, const std::string& key) {
  const std::string v = scalar(n, key);
  if (v == "true" || v == "yes") return true;
  if (v == "false" || v == "no") return false;
  fail(n, key, "'" + v + "' is not true or false");
}

std::string field_name(const Node& n, const std::string& key) {
  const std::string v = scalar(n, key);
  if (v.empty() || v.size() > 128) fail(n, key, "expected a field name of the data's items");
  return v;
}

tasks::PromptTemplate template_of(const Node& n, const std::string& key) {
  try {
    return tasks::parse_prompt_template(scalar(n, key));
  } catch (const Error& e) {
    fail(n, key, e.what());
  }
}

// lm-eval's filter_list: one entry {name, filter: [steps]} (kvbench scores one pipeline).
std::vector<tasks::FilterStep> filters_of(const Node& n) {
  const auto entries = items_of(n, "filter_list");
  if (entries.size() != 1) {
    fail(n, "filter_list",
         "give one entry {name, filter: [...]}: kvbench scores each unit through one filter "
         "pipeline (lm-eval's several entries score several)");
  }
  const Node& entry = *entries[0].first;
  const std::string ekey = entries[0].second;
  expect_map(entry, ekey, {"name", "filter"});
  const Entry* f = entry.find("filter");
  if (!f) fail(entry, ekey + ".filter", "required: the list of steps");
  std::vector<tasks::FilterStep> steps;
  for (const auto& [step, key] : items_of(f->value, ekey + ".filter")) {
    expect_map(*step, key, {"function", "regex_pattern", "group_select", "fallback"});
    const Entry* fn = step->find("function");
    if (!fn) fail(*step, key + ".function", "required: regex, take_first, lowercase, uppercase, strip or remove_whitespace");
    const std::string name = scalar(fn->value, key + ".function");
    tasks::FilterStep st;
    using K = tasks::FilterStep::Kind;
    if (name == "regex") st.kind = K::kRegex;
    else if (name == "take_first") st.kind = K::kTakeFirst;
    else if (name == "lowercase") st.kind = K::kLowercase;
    else if (name == "uppercase") st.kind = K::kUppercase;
    else if (name == "strip") st.kind = K::kStrip;
    else if (name == "remove_whitespace") st.kind = K::kRemoveWhitespace;
    else
      fail(fn->value, key + ".function",
           "'" + name + "' is not a filter kvbench applies; known: regex, take_first, lowercase, "
           "uppercase, strip, remove_whitespace");
    const Entry* pat = step->find("regex_pattern");
    if (st.kind == K::kRegex) {
      if (!pat) fail(*step, key + ".regex_pattern", "required by function: regex");
      st.pattern = scalar(pat->value, key + ".regex_pattern");
      try {
        tasks::check_filter_pattern(st.pattern);
      } catch (const Error& e) {
        fail(pat->value, key + ".regex_pattern", e.what());
      }
      if (const Entry* g = step->find("group_select"))
        st.group_select = static_cast<int>(to_int(g->value, key + ".group_select", -1000, 1000));
      if (const Entry* fb = step->find("fallback")) st.fallback = scalar(fb->value, key + ".fallback");
    } else {
      for (const char* k : {"regex_pattern", "group_select", "fallback"}) {
        if (const Entry* x = step->find(k))
          fail(x->value, key + "." + k, std::string("only function: regex takes ") + k);
      }
    }
    steps.push_back(st);
  }
  return steps;
}

bool is_yaml(const fs::path& p) { return p.extension() == ".yaml" || p.extension() == ".yml"; }

}  // namespace

// A field named `model` would stand beside, or in place of, the unit's own model wherever results
// are shown by field. tests/unit/test_task_files.cc checks the list against the schema.
const std::vector<std::string>& reserved_field_names() {
  static const std::vector<std::string> names = {
      "unit_key",       "run_id",        "model",       "model_sha256",   "task",
      "task_version",   "task_options",  "sample_id",   "policy",         "policy_options",
      "kv_budget_spec", "kv_budget",     "question",    "max_new_tokens", "seed",
      "generation",     "sample_fields", "status",      "attempts",       "crash_count",
      "error",          "started_at",    "finished_at", "rank",           "host",
      "sample",         "prediction",    "task_group",  "sample_sha256",  "slot_key"};
  return names;
}

tasks::DataTaskDef load_task_file(const std::string& path) {
  const std::string stem = fs::path(path).stem().string();
  if (!stem.empty() && stem[0] == '_') {
    KVB_USAGE_FAIL() << path << ": files named _* are fragments for include:, not tasks";
  }
  LoadState state;
  const Node root = load_tree(path, state, nullptr, "");
  expect_map(root, "", kKeys);
  tasks::DataTaskDef d;
  d.file = path;
  d.sha256 = sha256_hex(state.text);
  d.base_dir = fs::path(path).parent_path().string();
  if (d.base_dir.empty()) d.base_dir = ".";
  auto get = [&](const char* key) -> const Node* {
    const Entry* e = root.find(key);
    return e ? &e->value : nullptr;
  };
  d.name = stem;
  if (const Node* n = get("task")) d.name = scalar(*n, "task");
  if (!valid_name(d.name)) {
    fail(get("task") ? *get("task") : root, "task",
         "'" + d.name + "' is not a task name (letters, digits, _ - and ., not starting with _)");
  }
  if (tasks::find_task(d.name)) {
    fail(get("task") ? *get("task") : root, "task",
         "'" + d.name + "' is a built-in task; give the definition another name");
  }
  if (const Node* n = get("description")) d.description = scalar(*n, "description");
  if (const Node* n = get("version"))
    d.version = static_cast<int>(to_int(*n, "version", 0, INT_MAX));
  if (const Node* n = get("group")) {
    d.group = scalar(*n, "group");
    if (!valid_name(d.group)) fail(*n, "group", "'" + d.group + "' is not a group name");
  }
  if (const Node* n = get("data")) d.data = scalar(*n, "data");
  for (const char* key : {"context", "question", "answer_prefix"}) {
    const Node* n = get(key);
    if (!n) continue;
    tasks::PromptTemplate t = template_of(*n, key);
    if (std::string(key) == "context") d.context = std::move(t);
    if (std::string(key) == "question") d.question = std::move(t);
    if (std::string(key) == "answer_prefix") d.answer_prefix = std::move(t);
  }
  if (d.context.empty() && d.question.empty()) {
    fail(root, "context", "a definition needs a prompt: context: and/or question: templates");
  }
  if (const Node* n = get("chat")) d.chat = to_bool(*n, "chat");
  const Node* ref = get("reference");
  if (!ref) fail(root, "reference", "required: the item field with the gold answer(s)");
  d.reference = field_name(*ref, "reference");
  const Node* metric = get("metric");
  if (!metric) fail(root, "metric", "required: one of the metrics `kvbench ls tasks` lists");
  d.metric = scalar(*metric, "metric");
  const tasks::MetricEntry* m = tasks::find_metric(d.metric);
  if (!m) {
    std::vector<std::string> names;
    for (const auto& e : tasks::metric_table()) names.push_back(e.name);
    fail(*metric, "metric", "unknown metric '" + d.metric + "'; known metrics: " + join(names));
  }
  if (const Node* n = get("classes")) d.classes_field = field_name(*n, "classes");
  if (m->needs_classes && d.classes_field.empty())
    fail(*metric, "metric", d.metric + " needs classes: (the item field with the label set)");
  if (!m->needs_classes && !d.classes_field.empty())
    fail(*get("classes"), "classes", "only metric classification takes a label set");
  if (const Node* n = get("scale")) {
    d.scale = to_double(*n, "scale");
    if (!(d.scale > 0 && d.scale <= 1000)) fail(*n, "scale", "must be in (0, 1000] (100: percent)");
  }
  if (const Node* n = get("max_new_tokens"))
    d.max_new_tokens = static_cast<int>(to_int(*n, "max_new_tokens", 1, 1 << 20));
  if (const Node* n = get("stop")) {
    for (const auto& [item, key] : items_of(*n, "stop")) {
      d.stop_strings.push_back(scalar(*item, key));
      if (d.stop_strings.back().empty()) fail(*item, key, "an empty stop string");
    }
  }
  if (const Node* n = get("first_line")) d.first_line = to_bool(*n, "first_line");
  if (const Node* n = get("filter_list")) d.filters = filters_of(*n);
  if (const Node* n = get("id")) d.id_field = field_name(*n, "id");
  if (const Node* n = get("fields")) {
    // A list of item fields kept under their own names, or a mapping result field: item field.
    std::set<std::string> seen;
    auto add = [&](const Node& at, const std::string& key, const std::string& out,
                   const std::string& in) {
      if (!valid_name(out)) fail(at, key, "'" + out + "' is not a field name");
      if (out == "task_group") fail(at, key, "task_group is set by group:");
      const auto& reserved = reserved_field_names();
      if (std::find(reserved.begin(), reserved.end(), out) != reserved.end()) {
        fail(at, key,
             "'" + out + "' is a column of every result (the unit's own " + out +
                 "); keep the item field under another name: fields: {item_" + out + ": " + in +
                 "}");
      }
      if (!seen.insert(out).second) fail(at, key, "'" + out + "' is kept twice");
      d.fields.push_back({out, in});
    };
    if (n->kind == Node::Kind::kMap) {
      for (const Entry& e : n->map)
        add(e.value, "fields." + e.key, e.key, field_name(e.value, "fields." + e.key));
    } else {
      for (const auto& [item, key] : items_of(*n, "fields")) {
        const std::string f = field_name(*item, key);
        add(*item, key, f, f);
      }
    }
  }
  if (const Node* n = get("max_line_mb"))
    d.max_line_bytes = static_cast<size_t>(to_int(*n, "max_line_mb", 1, 1024)) << 20;
  return d;
}

namespace {
std::vector<std::string>& include_paths() {
  static std::vector<std::string> dirs;
  return dirs;
}
}  // namespace

void set_task_include_paths(const std::vector<std::string>& dirs) {
  include_paths().clear();
  for (const std::string& d : dirs) {
    KVB_USAGE_CHECK(!d.empty()) << "--include-path: an empty folder name";
    std::error_code ec;
    include_paths().push_back(fs::absolute(d, ec).lexically_normal().string());
  }
}

void add_task_include_paths(const std::vector<std::string>& dirs) {
  for (const std::string& d : dirs) {
    std::error_code ec;
    const std::string abs = fs::absolute(d, ec).lexically_normal().string();
    auto& v = include_paths();
    if (std::find(v.begin(), v.end(), abs) == v.end()) v.push_back(abs);
  }
}

std::vector<std::string> task_search_path() {
  std::vector<std::string> dirs = include_paths();
  if (const char* env = std::getenv("KVBENCH_TASK_PATH")) {
    std::string list = env;
    size_t start = 0;
    while (start <= list.size()) {
      const size_t end = std::min(list.find(':', start), list.size());
      if (end > start) {
        std::error_code ec;
        dirs.push_back(fs::absolute(list.substr(start, end - start), ec).lexically_normal().string());
      }
      start = end + 1;
    }
  }
  std::error_code ec;
  dirs.push_back((fs::current_path(ec) / "configs" / "tasks").string());
  return dirs;
}

std::string task_search_path_text() { return join(task_search_path()); }

std::string find_task_file(const std::string& name, const std::vector<std::string>& dirs) {
  if (!valid_name(name)) return "";
  for (const std::string& dir : dirs) {
    std::error_code ec;
    if (dir.empty() || !fs::is_directory(dir, ec)) continue;
    std::vector<std::string> found;
    fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
    size_t seen = 0;
    for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (++seen > 100000) break;  // a task folder is small; do not walk a whole disk
      if (it.depth() >= 4) it.disable_recursion_pending();
      if (is_yaml(it->path()) && it->path().stem() == name && it->is_regular_file(ec)) {
        found.push_back(it->path().string());
      }
    }
    std::sort(found.begin(), found.end());
    KVB_USAGE_CHECK(found.size() <= 1) << "task '" << name << "' is defined twice under " << dir
                                       << ": " << join(found) << "; rename one";
    if (!found.empty()) return found[0];
  }
  return "";
}

std::vector<std::string> list_task_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it.depth() >= 4) it.disable_recursion_pending();
    const fs::path& p = it->path();
    if (is_yaml(p) && p.filename().string()[0] != '_' && it->is_regular_file(ec))
      out.push_back(p.string());
  }
  std::sort(out.begin(), out.end(), [](const std::string& a, const std::string& b) {
    return fs::path(a).stem() < fs::path(b).stem();
  });
  return out;
}

std::vector<std::string> render_task_jinja(const std::string& text, const std::string& origin,
                                           const std::vector<std::string>& items_json) {
  return tokenizer::render_jinja_items(text, origin, items_json);
}

std::unique_ptr<tasks::Task> make_any_task(const std::string& name, const Options& options) {
  if (tasks::find_task(name)) return tasks::make_task(name, options);
  std::string file;
  if (options.has("task_file")) {
    file = options.values().at("task_file");
  } else {
    file = find_task_file(name, task_search_path());
  }
  if (file.empty()) {
    try {
      tasks::make_task(name, options);
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + ", or a task definition " + name +
                      ".yaml under a folder of the task search path (" + task_search_path_text() +
                      "; a sweep's config also looks in its own tasks/ folder). Add a folder with "
                      "--include-path DIR, include_path: in a sweep's YAML, or KVBENCH_TASK_PATH",
                  e.kind());
    }
  }
  const tasks::DataTaskDef def = load_task_file(file);
  KVB_USAGE_CHECK(def.name == name)
      << file << ": defines task '" << def.name << "', not '" << name << "'";
  return tasks::make_data_task(def, options);
}

}  // namespace kvb::harness
