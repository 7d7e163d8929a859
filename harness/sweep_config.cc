// Sweep config loading (configs/README.md): YAML -> a tree that remembers each node's file and
// line (includes merge trees of several files), then a strict schema walk that resolves paths,
// expands lists and ranges, and validates every name and option through the task and policy
// registries. Every error is a usage error "<file>:<line>: <key path>: <what>".
#include "harness/sweep_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <set>
#include <sstream>

#include "common/error.h"
#include "harness/findings_config.h"
#include "harness/policy_files.h"
#include "harness/task_file.h"
#include "harness/yaml_tree.h"
#include "kernels/policies/policy.h"
#include "tasks/task.h"
#include "workers/engine/model.h"

namespace kvb::harness {
namespace {
namespace fs = std::filesystem;

using namespace yamlcfg;  // NOLINT: the config tree and its checks (harness/yaml_tree.h)

// Which option of `options` (a YAML mapping) a registry error message is about, if any: the
// registries write "task option k=v ...", "policy option k=v" and "has no option 'k'".
const Entry* culprit(const Node* options, const std::string& msg) {
  if (!options) return nullptr;
  for (const Entry& e : options->map) {
    for (const std::string& pat :
         {"option " + e.key + "=", "option " + e.key + ":", "'" + e.key + "'", " " + e.key + "="}) {
      if (msg.find(pat) != std::string::npos) return &e;
    }
  }
  return nullptr;
}

// Bounds on the expanded matrix, so that a short config cannot ask for hours of expansion or all
// the memory before any error: combinations of one list item's options, and cells of the whole
// matrix (models x tasks x policies x budgets x question x seeds), both checked before expanding.
constexpr size_t kMaxCombinations = 1024;
constexpr size_t kMaxCells = 100000;

// Options with list values -> one map per combination (cartesian, first key outermost). More than
// kMaxCombinations is a usage error at `at`/`key`.
using Combo = std::map<std::string, std::string>;
std::vector<Combo> cartesian(
    const std::vector<std::pair<std::string, std::vector<std::string>>>& axes, const Node& at,
    const std::string& key) {
  size_t total = 1;
  std::string sizes;
  for (const auto& [k, values] : axes) {
    total = std::min(total * std::max<size_t>(values.size(), 1), kMaxCombinations + 1);
    sizes += (sizes.empty() ? "" : " x ") + std::to_string(values.size()) + " " + k;
  }
  if (total > kMaxCombinations) {
    fail(at, key,
         "the option lists give more than " + std::to_string(kMaxCombinations) +
             " combinations (" + sizes + "); split the entry or shorten the lists");
  }
  std::vector<Combo> out = {{}};
  for (const auto& [key, values] : axes) {
    std::vector<Combo> next;
    for (const Combo& c : out) {
      for (const std::string& v : values) {
        Combo d = c;
        d[key] = v;
        next.push_back(std::move(d));
      }
    }
    out = std::move(next);
  }
  return out;
}

bool is_path_option(const std::string& key) {
  static const std::set<std::string> keys = {"file",         "data",          "data_dir",
                                             "haystack_dir", "haystack_file", "fewshot_data"};
  return keys.count(key) != 0;
}

std::string spec_of(const std::string& name, const std::map<std::string, std::string>& options) {
  std::string s = name;
  for (const auto& [k, v] : options) s += " " + k + "=" + v;
  return s;
}

const std::vector<Entry> kNoEntries;

// A list item that is a registered name, or {name, options}.
struct Named {
  const Node* name_node;
  const Node* options;  // nullptr without options
  std::string name_key;
  std::string name;
};
Named read_named(const Node& item, const std::string& key, const std::string& what) {
  if (item.kind != Node::Kind::kMap) return {&item, nullptr, key, scalar(item, key)};
  expect_map(item, key, {"name", "options"});
  const Entry* nm = item.find("name");
  if (!nm) fail(item, key, "needs name: (a registered " + what + ")");
  const Entry* o = item.find("options");
  if (o && o->value.kind != Node::Kind::kMap) {
    fail(o->value, key + ".options", "expected a mapping of " + what + " options");
  }
  return {&nm->value, o ? &o->value : nullptr, key + ".name", scalar(nm->value, key + ".name")};
}

// Where each expanded entry came from, for errors found after expansion.
struct Origin {
  const Node* node = nullptr;     // the list item
  const Node* options = nullptr;  // its options mapping, if any
  std::string key;                // "policies[2]"
};

// ---- sections ---------------------------------------------------------------------------------
void parse_models(const Node& n, SweepConfig& cfg) {
  if (n.kind != Node::Kind::kSeq || n.seq.empty())
    fail(n, "models", "expected a non-empty list of {name, path, tokenizer}");
  for (const auto& [item, key] : items_of(n, "models")) {
    ModelEntry m;
    const Node* path_node = item;
    const Node* tok_node = nullptr;
    if (item->kind == Node::Kind::kMap) {
      expect_map(*item, key, {"name", "path", "tokenizer"});
      const Entry* p = item->find("path");
      if (!p) {
        fail(*item, key,
             "needs path: (a .gguf or llama2.c .bin model file, or a Hugging Face checkpoint "
             "folder)");
      }
      path_node = &p->value;
      if (const Entry* t = item->find("tokenizer")) tok_node = &t->value;
      if (const Entry* nm = item->find("name")) m.name = scalar(nm->value, key + ".name");
    }
    const std::string pkey = item->kind == Node::Kind::kMap ? key + ".path" : key;
    m.path = resolve_path(*path_node, scalar(*path_node, pkey));
    if (fs::is_directory(m.path) && !fs::exists(fs::path(m.path) / "config.json"))
      fail(*path_node, pkey, "'" + m.path + "' is a directory without config.json; give a model "
           "file, or a Hugging Face checkpoint folder");
    if (!fs::is_directory(m.path) && !fs::is_regular_file(m.path))
      fail(*path_node, pkey, "model file '" + m.path + "' does not exist");
    try {
      m.info = read_model_info(m.path);
    } catch (const Error& e) {
      fail(*path_node, pkey, e.what());
    }
    if (tok_node) {
      m.tokenizer = resolve_path(*tok_node, scalar(*tok_node, key + ".tokenizer"));
      if (!fs::is_regular_file(m.tokenizer)) {
        fail(*tok_node, key + ".tokenizer", "tokenizer file '" + m.tokenizer + "' does not exist");
      }
    } else if (m.info.format == "llama2c") {
      fail(*item, key, "llama2.c model '" + m.path + "' needs tokenizer: (its tokenizer.bin)");
    }
    if (m.name.empty()) {
      // A folder's name (a trailing slash leaves the path's stem empty), or the file's stem.
      const fs::path p = fs::path(m.path).lexically_normal();
      m.name = fs::is_directory(p) ? p.parent_path().filename().string() : p.stem().string();
      if (fs::is_directory(p) && !p.filename().empty()) m.name = p.filename().string();
    }
    for (const ModelEntry& o : cfg.models) {
      if (o.name == m.name)
        fail(*item, key, "model name '" + m.name + "' is used twice; set name:");
    }
    cfg.models.push_back(std::move(m));
  }
}

// The one name of an axis (STYLE.md: kv_budget, seed everywhere) and the spelling it replaced,
// still read: a deprecation note names the file, the line and the new spelling (`kvbench
// validate` prints it, the sweep logs it). Unit keys do not depend on the spelling.
void note_deprecated(SweepConfig& cfg, const Entry& old, const std::string& key,
                     const std::string& now) {
  cfg.notes.push_back(old.value.file + ":" + std::to_string(old.key_line) + ": " + key +
                      " is a deprecated spelling; write " + now +
                      " (same meaning, same unit keys)");
}

// The root's entry for an axis named `now` or, deprecated, `old`; both is an error (also across
// include files: which one wins would be a guess).
const Entry* axis_entry(SweepConfig& cfg, const Node& root, const char* now, const char* old) {
  const Entry* n = root.find(now);
  const Entry* o = root.find(old);
  if (n && o) {
    fail_at(o->value.file, o->key_line, old,
            std::string("the same axis as ") + now + " (" + n->value.file + ":" +
                std::to_string(n->key_line) + "); " + old + " is its deprecated spelling: keep " +
                now + " only");
  }
  if (o) note_deprecated(cfg, *o, old, std::string(now) + ":");
  return n ? n : o;
}

// {ratio: r} (the fraction kept, 0 < r <= 1) or {compression_ratio: c} (kvpress's fraction
// removed, 0 <= c < 1).
BudgetEntry budget_map(const Node& item, const std::string& key) {
  expect_map(item, key, {"ratio", "compression_ratio"});
  const Entry* r = item.find("ratio");
  const Entry* c = item.find("compression_ratio");
  if (!r && !c) fail(item, key, "expected {ratio: r} with 0 < r <= 1 or {compression_ratio: c} "
                                "with 0 <= c < 1");
  if (r && c) fail(item, key, "give ratio (the fraction kept) or compression_ratio (kvpress's "
                              "fraction removed), not both");
  BudgetEntry b;
  if (r) {
    b.ratio = to_double(r->value, key + ".ratio");
    if (!(b.ratio > 0 && b.ratio <= 1))
      fail(r->value, key + ".ratio", r->value.scalar + " is outside (0, 1]");
  } else {
    b.ratio = to_double(c->value, key + ".compression_ratio");
    b.removed = true;
    if (!(b.ratio >= 0 && b.ratio < 1))
      fail(c->value, key + ".compression_ratio",
           c->value.scalar + " is outside [0, 1) (the fraction removed)");
  }
  return b;
}

std::vector<Origin> parse_budgets(const Node& n, const std::string& axis, SweepConfig& cfg) {
  std::vector<Origin> origin;
  std::set<std::string> seen;
  auto add = [&](BudgetEntry b, const Node* at, const std::string& key) {
    if (!seen.insert(b.spec()).second) return;  // overlapping ranges: keep the first
    cfg.budgets.push_back(b);
    origin.push_back({at, nullptr, key});
  };
  for (const auto& [item, key] : items_of(n, axis)) {
    if (item->kind == Node::Kind::kMap) {
      add(budget_map(*item, key), item, key);
      continue;
    }
    const std::string text = scalar(*item, key);
    std::vector<int64_t> values;
    try {
      values = expand_int_range(text, "budget");
    } catch (const Error& e) {
      fail(*item, key, e.what());
    }
    for (int64_t v : values) {
      if (v <= 0) {
        fail(*item, key,
             "a budget of " + std::to_string(v) +
                 " tokens is not allowed; budgets are "
                 "positive token counts per KV head (or {ratio: r} with 0 < r <= 1, or "
                 "{compression_ratio: c} with 0 <= c < 1)");
      }
      if (v > INT_MAX) fail(*item, key, "budget " + std::to_string(v) + " is too large");
      add({static_cast<int>(v), 0}, item, key);
    }
  }
  return origin;
}

// A task item: a registered name, a definition named like one (found under the config's tasks/
// folder, then configs/tasks), or {task_file: path} (relative to the config). Returns the name
// node, the options, the name and, for a definition, the options the definition adds.
struct TaskItem {
  const Node* name_node;
  const Node* options;
  std::string name_key, name;
  std::map<std::string, std::string> def_options;  // task_file, task_sha256
};
TaskItem read_task_item(const Node& item, const std::string& key) {
  const Entry* tf = item.kind == Node::Kind::kMap ? item.find("task_file") : nullptr;
  TaskItem t;
  std::string file;
  if (tf) {
    expect_map(item, key, {"name", "task_file", "options"});
    const Entry* o = item.find("options");
    if (o && o->value.kind != Node::Kind::kMap)
      fail(o->value, key + ".options", "expected a mapping of task options");
    t = {&tf->value, o ? &o->value : nullptr, key + ".task_file", "", {}};
    file = resolve_path(tf->value, scalar(tf->value, key + ".task_file"));
    if (!fs::is_regular_file(file))
      fail(tf->value, key + ".task_file", "task definition '" + file + "' does not exist");
  } else {
    const auto [name_node, opts, nkey, name] = read_named(item, key, "task");
    t = {name_node, opts, nkey, name, {}};
    if (tasks::find_task(name)) return t;
    const std::string local = (fs::path(item.file).parent_path() / "tasks").string();
    try {
      std::vector<std::string> dirs = {local};
      for (const std::string& d : task_search_path()) dirs.push_back(d);
      file = find_task_file(name, dirs);
    } catch (const Error& e) {
      fail(*name_node, nkey, e.what());
    }
    if (file.empty()) {
      try {
        make_any_task(name, Options());
      } catch (const Error& e) {
        fail(*name_node, nkey, e.what());
      }
    }
  }
  tasks::DataTaskDef def;
  try {
    def = load_task_file(file);
  } catch (const Error& e) {
    fail(*t.name_node, t.name_key, e.what());
  }
  if (tf) {
    if (const Entry* nm = item.find("name")) {
      const std::string given = scalar(nm->value, key + ".name");
      if (given != def.name)
        fail(nm->value, key + ".name",
             file + " defines task '" + def.name + "', not '" + given + "'");
    }
    t.name = def.name;
  } else if (def.name != t.name) {
    fail(*t.name_node, t.name_key, file + " defines task '" + def.name + "', not '" + t.name + "'");
  }
  t.def_options = {{"task_file", fs::weakly_canonical(file).string()}, {"task_sha256", def.sha256}};
  return t;
}

void parse_tasks(const Node& n, SweepConfig& cfg) {
  if (n.kind != Node::Kind::kSeq || n.seq.empty())
    fail(n, "tasks", "expected a non-empty list of {name, options}");
  std::set<std::string> seen;  // specs, for duplicates
  for (const auto& [item, key] : items_of(n, "tasks")) {
    const TaskItem ti = read_task_item(*item, key);
    const Node* opts = ti.options;
    const std::string& name = ti.name;
    const tasks::TaskInfo* info = tasks::find_task(name);
    const std::vector<ParamDoc>& params = info ? info->params : tasks::data_task_params();
    // Lists of an option with fixed choices expand into entries; other lists join as "a,b".
    std::map<std::string, std::string> fixed;
    std::vector<std::pair<std::string, std::vector<std::string>>> axes;
    for (const Entry& e : opts ? opts->map : kNoEntries) {
      const std::string okey = key + ".options." + e.key;
      if (ti.def_options.count(e.key))
        fail(e.value, okey, e.key + " is set by the task item (task_file: or the task's name)");
      const auto doc = std::find_if(params.begin(), params.end(),
                                    [&](const ParamDoc& d) { return d.name == e.key; });
      std::vector<std::string> values;
      for (const auto& [v, vkey] : items_of(e.value, okey)) values.push_back(scalar(*v, vkey));
      if (is_path_option(e.key)) {
        if (e.value.kind != Node::Kind::kScalar) fail(e.value, okey, "takes one path");
        values[0] = resolve_path(e.value, values[0]);
        const bool dir = e.key.size() > 4 && e.key.substr(e.key.size() - 4) == "_dir";
        if (dir ? !fs::is_directory(values[0]) : !fs::is_regular_file(values[0])) {
          fail(e.value, okey,
               std::string(dir ? "folder" : "file") + " '" + values[0] + "' does not exist");
        }
      }
      if (e.value.kind == Node::Kind::kSeq && doc != params.end() && !doc->choices.empty()) {
        axes.push_back({e.key, values});
      } else {
        fixed[e.key] = join(values, ",");
      }
    }
    fixed.insert(ti.def_options.begin(), ti.def_options.end());
    for (const Combo& combo : cartesian(axes, *item, key + ".options")) {
      TaskEntry t{name, fixed};
      t.options.insert(combo.begin(), combo.end());
      // LongBench reads <data_dir>/<dataset>.jsonl: check the file the task will open.
      if (t.options.count("data_dir") && t.options.count("dataset")) {
        const std::string f = t.options["data_dir"] + "/" + t.options["dataset"] + ".jsonl";
        if (!fs::is_regular_file(f))
          fail(opts->find("data_dir")->value, key + ".options.data_dir",
               "data file '" + f + "' does not exist");
      }
      try {
        make_any_task(name, task_options(cfg, t));
      } catch (const Error& e) {
        const Entry* c = culprit(opts, e.what());
        if (c) fail(c->value, key + ".options." + c->key, e.what());
        fail(*item, key, e.what());
      }
      if (!seen.insert(t.spec()).second)
        fail(*item, key, "task '" + t.spec() + "' is listed twice");
      cfg.tasks.push_back(std::move(t));
    }
  }
}

std::vector<Origin> parse_policies(const Node& n, SweepConfig& cfg) {
  if (n.kind != Node::Kind::kSeq || n.seq.empty())
    fail(n, "policies", "expected a non-empty list of names or {name, options}");
  std::vector<Origin> origin;
  std::set<std::string> seen;  // specs, for duplicates
  for (const auto& [item, key] : items_of(n, "policies")) {
    const auto [name_node, opts, nkey, name] = read_named(*item, key, "policy");
    try {
      policies::require_policy(name);
    } catch (const Error& e) {
      fail(*name_node, nkey, e.what());
    }
    std::vector<std::pair<std::string, std::vector<std::string>>> axes;
    for (const Entry& e : opts ? opts->map : kNoEntries) {
      std::vector<std::string> values;
      for (const auto& [v, vkey] : items_of(e.value, key + ".options." + e.key))
        values.push_back(scalar(*v, vkey));
      // A path option (a Python policy's script, duo_attention's patterns) resolves against the
      // file it is written in, as task file options do, so that the worker opens what the unit
      // key hashed (harness/policy_files.h).
      if (is_policy_path_option(name, e.key)) {
        for (std::string& v : values) v = resolve_path(e.value, v);
      }
      axes.push_back({e.key, values});
    }
    for (const Combo& combo : cartesian(axes, *item, key + ".options")) {
      PolicyEntry p{name, combo};
      if (!seen.insert(p.spec()).second)
        fail(*item, key, "policy '" + p.spec() + "' is listed twice");
      cfg.policies.push_back(std::move(p));
      origin.push_back({item, opts, key});
    }
  }
  return origin;
}

// The number of cells before exclusions, against kMaxCells (before any per-cell work).
void check_cells(const SweepConfig& cfg, const Node& root) {
  size_t full = 0;
  for (const PolicyEntry& p : cfg.policies) full += !policies::budgeted(p.name);
  const std::vector<std::pair<std::string, size_t>> axes = {
      {"models", cfg.models.size()},
      {"tasks", cfg.tasks.size()},
      {"policies x budgets",
       full + (cfg.policies.size() - full) * std::max<size_t>(cfg.budgets.size(), 1)},
      {"question", cfg.questions.size()},
      {"seeds", cfg.seeds.size()}};
  double cells = 1;  // a double cannot overflow here: each factor is below 2^32
  std::string sizes, largest = axes[0].first;
  size_t most = 0;
  for (const auto& [name, size] : axes) {
    cells *= static_cast<double>(size);
    sizes += (sizes.empty() ? "" : " x ") + std::to_string(size) + " " + name;
    if (size > most) most = size, largest = name;
  }
  if (cells > static_cast<double>(kMaxCells)) {
    std::ostringstream n;
    n << std::fixed << std::setprecision(0) << cells;
    fail(root, largest,
         "the matrix has " + n.str() + " cells (" + sizes + "), over the limit of " +
             std::to_string(kMaxCells) + "; shorten " + largest + " or split the sweep");
  }
}

// Every policy entry through make_policy, on every model's shape and every budget.
void validate_policies(const SweepConfig& cfg, const std::vector<Origin>& porigin,
                       const std::vector<Origin>& borigin, const Node& root) {
  bool any_budgeted = false;
  for (const PolicyEntry& p : cfg.policies) any_budgeted |= policies::budgeted(p.name);
  if (any_budgeted && cfg.budgets.empty()) {
    fail(root, "budgets",
         "required: the policies other than full and think need kv budgets (e.g. kv_budget: [128, 256])");
  }
  for (const ModelEntry& m : cfg.models) {
    // Every layer sliding: the window alone bounds the cache, and a policy (acting on global
    // layers only, POLICIES.md "Sliding-window layers") would run exactly as full under its name.
    for (size_t i = 0; i < cfg.policies.size(); ++i) {
      try {
        engine::require_policy_layers(cfg.policies[i].name, m.name, m.info.global_layers,
                                      m.info.max_window);
      } catch (const Error& e) {
        fail(*porigin[i].node, porigin[i].key, e.what());
      }
    }
    for (size_t b = 0; any_budgeted && b < cfg.budgets.size(); ++b) {
      if (cfg.budgets[b].tokens > m.info.max_seq_len) {
        fail(*borigin[b].node, borigin[b].key,
             "kv_budget " + std::to_string(cfg.budgets[b].tokens) +
                 " exceeds the context of model '" + m.name + "' (" +
                 std::to_string(m.info.max_seq_len) + " tokens)");
      }
    }
    for (size_t i = 0; i < cfg.policies.size(); ++i) {
      const PolicyEntry& p = cfg.policies[i];
      const size_t nb = policies::budgeted(p.name) ? cfg.budgets.size() : 1;
      for (size_t b = 0; b < nb; ++b) {
        policies::PolicyConfig pc;
        pc.name = p.name;
        pc.shape = m.info.shape();
        pc.options = Options(p.options, "policy option");
        if (policies::budgeted(p.name)) {
          const BudgetEntry& be = cfg.budgets[b];
          // A ratio resolves per prompt; the largest it can become is ratio x the context.
          pc.kv_budget = be.tokens_for(m.info.max_seq_len);
        }
        try {
          policies::make_policy(pc);
        } catch (const Error& e) {
          const std::string ctx =
              !policies::budgeted(p.name) ? " (model " + m.name + ")"
                               : " (model " + m.name + ", kv_budget " + cfg.budgets[b].spec() + ")";
          const Entry* c = culprit(porigin[i].options, e.what());
          if (c) fail(c->value, porigin[i].key + ".options." + c->key, e.what() + ctx);
          fail(*porigin[i].node, porigin[i].key, e.what() + ctx);
        }
      }
    }
  }
}

// A policy that takes its window from the prompt's question (finch) in a cell whose question is
// streamed after compression: refused here, once per (model, policy), instead of failing every
// unit of the cell at its prefill.
void validate_question_placement(const SweepConfig& cfg, const std::vector<Origin>& porigin) {
  std::set<std::pair<int, int>> seen;  // (model, policy)
  for (const ConfigCell& cell : expand_config_cells(cfg)) {
    if (cfg.questions[cell.question] != "after_compression") continue;
    if (!seen.insert({cell.model, cell.policy}).second) continue;
    const PolicyEntry& p = cfg.policies[cell.policy];
    const ModelEntry& m = cfg.models[cell.model];
    policies::PolicyConfig pc;
    pc.name = p.name;
    pc.shape = m.info.shape();
    pc.options = Options(p.options, "policy option");
    if (cell.budget >= 0) pc.kv_budget = cfg.budgets[cell.budget].tokens_for(m.info.max_seq_len);
    try {
      std::unique_ptr<policies::Policy> policy = policies::make_policy(pc);
      policy->set_question_tokens(0, 0);
      policy->prefill_stats(1);
    } catch (const Error& e) {
      fail(*porigin[cell.policy].node, porigin[cell.policy].key,
           std::string(e.what()) + " (model " + m.name + ", question: after_compression; or " +
               "exclude {policy: " + p.name + ", question: after_compression})");
    }
  }
}

void parse_exclude(const Node& n, SweepConfig& cfg) {
  static const std::vector<std::string> keys = {"model",    "task",     "policy", "kv_budget",
                                                "kv_ratio", "question", "seed"};
  if (n.kind != Node::Kind::kSeq)
    fail(n, "exclude", "expected a list of rules such as {policy: h2o, kv_budget: 512}");
  for (const auto& [item, key] : items_of(n, "exclude")) {
    expect_map(*item, key, keys);
    if (item->map.empty()) fail(*item, key, "an empty rule would exclude everything");
    if (item->find("kv_budget") && item->find("kv_ratio"))
      fail(*item, key, "give kv_budget or kv_ratio, not both");
    std::vector<std::pair<std::string, std::vector<std::string>>> axes;
    for (const Entry& e : item->map) {
      const std::string ekey = key + "." + e.key;
      if (e.key == "kv_ratio") {
        note_deprecated(cfg, e, ekey, "kv_budget: {ratio: r}");
      }
      std::vector<std::string> allowed;
      if (e.key == "model")
        for (const auto& m : cfg.models) allowed.push_back(m.name);
      if (e.key == "task")
        for (const auto& t : cfg.tasks) allowed.push_back(t.name);
      if (e.key == "policy")
        for (const auto& p : cfg.policies) allowed.push_back(p.name);
      if (e.key == "kv_budget" || e.key == "kv_ratio")
        for (const auto& b : cfg.budgets) allowed.push_back(b.spec());
      if (e.key == "question") allowed = cfg.questions;
      if (e.key == "seed")
        for (uint64_t s : cfg.seeds) allowed.push_back(std::to_string(s));
      std::vector<std::string> values;
      for (const auto& [v, vkey] : items_of(e.value, ekey)) {
        std::string s;
        if (e.key == "kv_budget" && v->kind == Node::Kind::kMap) {  // as in kv_budget:
          s = budget_map(*v, vkey).spec();
        } else {
          s = scalar(*v, vkey);
          if (e.key == "kv_ratio") s = BudgetEntry{0, to_double(*v, vkey)}.spec();
        }
        if (std::find(allowed.begin(), allowed.end(), s) == allowed.end()) {
          std::set<std::string> uniq(allowed.begin(), allowed.end());
          fail(
              *v, vkey,
              "'" + s + "' is not in this config; its values: " + join({uniq.begin(), uniq.end()}));
        }
        values.push_back(s);
      }
      axes.push_back({e.key == "kv_ratio" ? "kv_budget" : e.key, values});
    }
    for (const Combo& c : cartesian(axes, *item, key)) cfg.exclude.push_back({c});
  }
}

}  // namespace

// ---- public -----------------------------------------------------------------------------------
BudgetEntry parse_budget_item(const yamlcfg::Node& item, const std::string& key) {
  if (item.kind == Node::Kind::kMap) return budget_map(item, key);
  return {static_cast<int>(to_int(item, key + " (a token count, {ratio: r} or {compression_ratio: c})",
                                  1, INT_MAX)),
          0};
}

std::string BudgetEntry::spec() const {
  if (tokens > 0) return std::to_string(tokens);
  if (ratio > 0 || removed) {
    std::ostringstream s;
    s << ratio << (removed ? " compression_ratio" : " ratio");
    return s.str();
  }
  return "";
}

int BudgetEntry::tokens_for(int prompt_tokens) const {
  if (tokens > 0) return tokens;
  if (removed) return std::max(1, static_cast<int>(prompt_tokens * (1 - ratio)));
  return std::max(1, static_cast<int>(ratio * prompt_tokens));
}

BudgetEntry parse_budget_flags(const std::string& kv_budget,
                               const std::string& compression_ratio) {
  KVB_USAGE_CHECK(kv_budget.empty() || compression_ratio.empty())
      << "give --kv-budget or --compression-ratio, not both";
  auto number = [](const std::string& text, const char* flag) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KVB_USAGE_CHECK(used == text.size() && !text.empty() && std::isfinite(v))
        << flag << " '" << text << "' is not a number; give tokens per KV head (--kv-budget 256), "
        << "the fraction of each prompt kept (--kv-budget 0.5) or kvpress's fraction removed "
        << "(--compression-ratio 0.5)";
    return v;
  };
  BudgetEntry b;
  if (!compression_ratio.empty()) {
    const double c = number(compression_ratio, "--compression-ratio");
    KVB_USAGE_CHECK(c >= 0 && c < 1)
        << "--compression-ratio " << compression_ratio << " is outside [0, 1) (the fraction of "
        << "each prompt's tokens removed, as kvpress's compression_ratio)";
    b.ratio = c;
    b.removed = true;
    return b;
  }
  if (kv_budget.empty()) return b;
  const double v = number(kv_budget, "--kv-budget");
  if (kv_budget.find_first_of(".eE") != std::string::npos) {
    KVB_USAGE_CHECK(v > 0 && v <= 1)
        << "--kv-budget " << kv_budget << " is a fraction outside (0, 1]; a fraction is the share "
        << "of each prompt kept (kvpress's compression_ratio is 1 minus it: --compression-ratio)";
    b.ratio = v;
    return b;
  }
  KVB_USAGE_CHECK(v >= 0) << "--kv-budget " << kv_budget << " is not a token count >= 0";
  KVB_USAGE_CHECK(v <= INT_MAX) << "--kv-budget " << kv_budget << " is more tokens than kvbench "
                                << "takes (at most " << INT_MAX << "); a budget at least the "
                                << "prompt's length keeps every token";
  b.tokens = static_cast<int>(v);
  return b;
}

std::string TaskEntry::spec() const { return spec_of(name, options); }
std::string PolicyEntry::spec() const { return spec_of(name, options); }

Options task_options(const SweepConfig& config, const TaskEntry& task) {
  Options opts(task.options, "task option");
  const tasks::TaskInfo* info = tasks::find_task(task.name);
  if (config.limit > 0 && !opts.has("limit") && (info || opts.has("task_file"))) {
    for (const ParamDoc& d : info ? info->params : tasks::data_task_params()) {
      if (d.name == "limit") opts.set("limit", std::to_string(config.limit));
    }
  }
  return opts;
}

SweepConfig load_sweep_config(const std::string& path) {
  SweepConfig cfg;
  cfg.path = path;
  LoadState state;
  const Node root = load_tree(path, state, nullptr, "");
  cfg.text = std::move(state.text);
  expect_map(root, "",
             {"description", "models", "tasks", "policies", "kv_budget", "question", "seed",
              "limit", "generation", "max_prompt_tokens", "unit_time_limit_s", "threads", "exclude",
              "decode_batch", "prefix_cache_mib", "include_path", "dtype", "findings", "budgets",
              "seeds"});  // the last two: deprecated spellings of kv_budget, seed
  auto get = [&](const char* key) -> const Node* {
    const Entry* e = root.find(key);
    return e ? &e->value : nullptr;
  };
  // Folders of task definitions found by name, relative to this file (before the tasks).
  if (const Node* n = get("include_path")) {
    std::vector<std::string> dirs;
    for (const auto& [item, key] : items_of(*n, "include_path")) {
      const std::string d = resolve_path(*item, scalar(*item, key));
      if (!fs::is_directory(d)) fail(*item, key, "folder '" + d + "' does not exist");
      dirs.push_back(d);
    }
    add_task_include_paths(dirs);
  }
  if (const Node* n = get("limit")) cfg.limit = static_cast<int>(to_int(*n, "limit", 0, INT_MAX));
  if (const Node* n = get("max_prompt_tokens")) {
    cfg.max_prompt_tokens = static_cast<int>(to_int(*n, "max_prompt_tokens", 0, INT_MAX));
  }
  if (const Node* n = get("threads"))
    cfg.threads = static_cast<int>(to_int(*n, "threads", 0, 4096));
  if (const Node* n = get("decode_batch")) {
    cfg.decode_batch = n->scalar == "auto"
                           ? 0
                           : static_cast<int>(to_int(*n, "decode_batch (auto or 1..4096)", 1, 4096));
  }
  if (const Node* n = get("dtype")) {
    cfg.dtype = scalar(*n, "dtype");
    if (cfg.dtype != "f32" && cfg.dtype != "bf16" && cfg.dtype != "native") {
      fail(*n, "dtype", "must be f32, bf16 or native, got '" + cfg.dtype + "'");
    }
  }
  if (const Node* n = get("prefix_cache_mib")) {
    cfg.prefix_cache_mib =
        static_cast<int>(to_int(*n, "prefix_cache_mib (MiB, 0: off)", 0, 1 << 20));
  }
  if (const Node* n = get("unit_time_limit_s")) {
    cfg.unit_time_limit_s = to_double(*n, "unit_time_limit_s");
    if (!(cfg.unit_time_limit_s > 0)) fail(*n, "unit_time_limit_s", "must be positive (seconds)");
  }
  if (const Node* n = get("generation")) {
    expect_map(*n, "generation", {"temperature", "top_k", "top_p", "max_new_tokens"});
    GenerationSettings& g = cfg.generation;
    if (const Entry* e = n->find("temperature")) {
      g.temperature = static_cast<float>(to_double(e->value, "generation.temperature"));
      if (!(g.temperature >= 0 && g.temperature <= 100))
        fail(e->value, "generation.temperature", "must be in [0, 100] (0: greedy)");
    }
    if (const Entry* e = n->find("top_k"))
      g.top_k = static_cast<int>(to_int(e->value, "generation.top_k", 0, INT_MAX));
    if (const Entry* e = n->find("top_p")) {
      g.top_p = static_cast<float>(to_double(e->value, "generation.top_p"));
      if (!(g.top_p > 0 && g.top_p <= 1))
        fail(e->value, "generation.top_p", e->value.scalar + " is outside (0, 1]");
    }
    if (const Entry* e = n->find("max_new_tokens")) {
      g.max_new_tokens =
          static_cast<int>(to_int(e->value, "generation.max_new_tokens", 0, 1 << 20));
    }
  }
  if (const Node* n = get("question")) {
    cfg.questions.clear();
    for (const auto& [item, key] : items_of(*n, "question")) {
      const std::string q = scalar(*item, key);
      if (q != "in_prompt" && q != "after_compression")
        fail(*item, key, "'" + q + "' is not allowed; choose one of: in_prompt, after_compression");
      if (std::find(cfg.questions.begin(), cfg.questions.end(), q) != cfg.questions.end())
        fail(*item, key, q + " is listed twice");
      cfg.questions.push_back(q);
    }
  }
  if (const Entry* e = axis_entry(cfg, root, "seed", "seeds")) {
    cfg.seeds.clear();
    std::set<uint64_t> seen;
    for (const auto& [item, key] : items_of(e->value, e->key)) {
      std::vector<int64_t> values;
      try {
        values = expand_int_range(scalar(*item, key), "seed");
      } catch (const Error& e) {
        fail(*item, key, e.what());
      }
      for (int64_t s : values) {
        if (seen.insert(static_cast<uint64_t>(s)).second) cfg.seeds.push_back(s);
      }
    }
  }
  for (const char* key : {"models", "tasks", "policies"}) {
    if (!get(key)) fail(root, key, "required (configs/README.md describes the schema)");
  }
  parse_models(*get("models"), cfg);
  std::vector<Origin> borigin;
  if (const Entry* e = axis_entry(cfg, root, "kv_budget", "budgets")) {
    borigin = parse_budgets(e->value, e->key, cfg);
  }
  parse_tasks(*get("tasks"), cfg);
  const std::vector<Origin> porigin = parse_policies(*get("policies"), cfg);
  check_cells(cfg, root);
  validate_policies(cfg, porigin, borigin, root);
  if (const Node* n = get("exclude")) parse_exclude(*n, cfg);
  validate_question_placement(cfg, porigin);
  if (const Node* n = get("findings")) {
    cfg.findings = parse_findings(*n);
    check_findings(*cfg.findings, cfg, *n);
  }
  return cfg;
}

}  // namespace kvb::harness
