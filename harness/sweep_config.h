// The experiment matrix of a sweep (YAML, see configs/README.md): models x tasks x policies x
// budgets x question placements x seeds, with exclusions. Parsed and validated without loading
// any model weights; expanded into units (one per task sample) by the sweep.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/options.h"
#include "harness/model_info.h"
#include "results/findings.h"

namespace kvb::harness {

struct ModelEntry {
  std::string name;       // label in results (default: the file name without its extension)
  std::string path;       // .gguf or llama2.c .bin, resolved relative to the config file
  std::string tokenizer;  // "" for GGUF; llama2.c tokenizer.bin
  ModelInfo info;         // read from the header at load (no weights)
};

struct TaskEntry {
  std::string name;                            // registered task
  std::map<std::string, std::string> options;  // task options (lists already joined "a,b")
  std::string spec() const;                    // "niah context_lengths=1024,2048 depths=0,50"
};

struct PolicyEntry {
  std::string name;
  std::map<std::string, std::string> options;
  std::string spec() const;  // "snapkv window=16" (the name alone without options)
};

// A budget as configured: tokens (kv_budget: 256) or a ratio of the prompt ({ratio: 0.1}),
// resolved per sample to tokens. Policy `full` ignores budgets (one unit, no budget).
// A budget: tokens per KV head, or a fraction of each prompt's tokens, either the fraction kept
// (`{ratio: r}`, 0 < r <= 1) or kvpress's compression_ratio, the fraction removed
// (`{compression_ratio: c}`, 0 <= c < 1; `removed`, and `ratio` holds c).
struct BudgetEntry {
  int tokens = 0;
  double ratio = 0;
  bool removed = false;
  bool none() const { return tokens == 0 && ratio == 0 && !removed; }  // `full`'s cells
  // The fraction of each prompt kept when the budget is one (1 - c for a compression_ratio c, as
  // kvpress computes it; r for {ratio: r}); 0 for a token count (PolicyConfig::budget_fraction).
  double fraction() const { return tokens > 0 ? 0 : removed ? 1 - ratio : ratio; }
  // "256", "0.1 ratio" or "0.25 compression_ratio" ("" for none()): the unit key's budget and
  // the label every report shows.
  std::string spec() const;
  // The tokens this budget keeps of a prompt of `prompt_tokens`: ratio r gives max(1, int(r *
  // n)); compression_ratio c gives kvpress's compute_n_kept, max(1, int(n * (1 - c))).
  int tokens_for(int prompt_tokens) const;
};

namespace yamlcfg {
struct Node;
}
// One budget as a YAML item: a token count, {ratio: r} or {compression_ratio: c} (no ranges), as
// `kv_budget:` reads its items; `findings:` names its budgets this way.
BudgetEntry parse_budget_item(const yamlcfg::Node& item, const std::string& key);

// A budget given on the command line (generate, eval): --kv-budget TEXT is a token count ("256"),
// or, written with a decimal point, the fraction kept ("0.5"); --compression-ratio C (kvpress's
// fraction removed) instead. Both empty: no budget. Usage errors name the flag and the forms.
BudgetEntry parse_budget_flags(const std::string& kv_budget, const std::string& compression_ratio);

// `exclude:` rule: a unit matching every given key is dropped. Keys: model, task, policy,
// kv_budget (the spec text; YAML gives tokens or {ratio: r}, or kv_ratio: r, deprecated),
// question, seed. Values compare as strings; a key the unit lacks
// (kv_budget for policy full) does not match. A YAML list value is expanded into one rule per
// value at load, so `match` holds single values.
struct ExcludeRule {
  std::map<std::string, std::string> match;
};

struct GenerationSettings {
  float temperature = 0;  // 0 = greedy
  int top_k = 0;
  float top_p = 1;
  int max_new_tokens = 0;  // 0: the task's own per sample
};

struct SweepConfig {
  std::string path;  // the YAML file
  std::string text;  // its full text (provenance), includes resolved
  std::vector<ModelEntry> models;
  std::vector<TaskEntry> tasks;
  std::vector<PolicyEntry> policies;  // list-valued options already expanded
  std::vector<BudgetEntry> budgets;   // ranges expanded, duplicates dropped
  std::vector<std::string> questions = {"in_prompt"};
  std::vector<uint64_t> seeds = {0};
  std::vector<ExcludeRule> exclude;
  GenerationSettings generation;
  int limit = 0;                   // samples per task (0: the task's own)
  int max_prompt_tokens = 0;       // middle truncation (0: the model's context)
  double unit_time_limit_s = 600;  // per unit; a unit over it is recorded as `timeout`
  int threads = 0;                 // OpenMP threads per worker rank (0: OMP_NUM_THREADS or cores / ranks)
  // `decode_batch: auto | N`: how many generation units of a bundle decode together
  // (workers::RunSettings::decode_batch; 0 = auto: all of them). 1: one at a time.
  int decode_batch = 1;
  // `prefix_cache_mib: N`: memory a worker's prefix store may hold (workers/prefix_store.h:
  // shared prefills start from an earlier prompt's identical first tokens; the same bits, less
  // prefill time). 0 turns it off. CPU workers only.
  int prefix_cache_mib = 1024;
  // `dtype: f32 | bf16 | native`: the workers' precision when `--dtype` is not given ("": the
  // device's default). native: a GGUF model's own quantized blocks on the CPU (issue 35).
  std::string dtype;
  // Deprecated spellings read (`budgets:`, `seeds:`, exclude's `kv_ratio:`), one note each:
  // "FILE:LINE: budgets is a deprecated spelling; write kv_budget: (...)".
  std::vector<std::string> notes;
  // `findings:` (configs/README.md "Findings"): the paper's claims, checked against this matrix
  // at load; no unit key reads them.
  std::optional<results::Findings> findings;
  // `kvbench sweep --limit N` (not YAML): the first N samples of each task, its options (and
  // so its unit keys) unchanged. 0: all.
  int sample_cap = 0;
};

// Reads and validates a config: YAML syntax, unknown keys, types and ranges, every task and
// policy name and option (through the registries), budgets > 0, files that must exist (models,
// tokenizers, data paths named in task options). Errors are usage errors naming the file, the
// line and the key, e.g. "configs/x.yaml:12: policies[2].options.window: ...".
// `include:` entries (paths relative to the including file) are merged before validation.
SweepConfig load_sweep_config(const std::string& path);

// Whether a unit with these axis values is excluded.
bool excluded(const SweepConfig& config, const std::map<std::string, std::string>& axes);

// The options to build a task with (tasks::make_task): the entry's options plus the config's
// `limit` as the task option `limit` where the task has one and the entry does not set it.
// (TaskEntry::options leave `limit` out, so raising the limit keeps the same task parameters.)
Options task_options(const SweepConfig& config, const TaskEntry& task);

// One cell of the matrix before its task's samples: indices into the config's lists.
struct ConfigCell {
  int model = 0;
  int task = 0;
  int policy = 0;
  int budget = -1;  // index into budgets; -1 for policy `full` (no budget)
  int question = 0;
  int seed = 0;
};
// The cartesian product, most expensive setup outermost (model > task > policy > budget >
// question > seed), without excluded cells. Every sample of a cell's task is one unit.
std::vector<ConfigCell> expand_config_cells(const SweepConfig& config);
// The axis values `excluded` compares: model, task, policy (names), kv_budget (spec, absent for
// `full`), question, seed.
std::map<std::string, std::string> cell_axes(const SweepConfig& config, const ConfigCell& cell);

// "64-512*2" -> 64,128,256,512; "100-400+100" -> 100,200,300,400; "0-3" -> 0,1,2,3; "4k" = 4096;
// comma-separated items may mix plain numbers and ranges. Throws a usage error naming `what`.
std::vector<int64_t> expand_int_range(const std::string& text, const std::string& what);

}  // namespace kvb::harness
