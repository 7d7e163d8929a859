// The sweep's plan (DESIGN.md "Work unit and its key", "Scheduling"): the config's matrix
// expanded into keyed units, registered in the store, and grouped into bundles (units sharing one
// sample) of the units still to run.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/options.h"
#include "harness/policy_files.h"
#include "harness/sweep_config.h"
#include "harness/sweep_wire.h"
#include "results/store.h"
#include "tasks/task.h"

namespace kvb::harness {

struct Plan {
  std::vector<WireBundle> bundles;       // all bundles (units: only those still to run)
  std::vector<std::string> all_keys;     // every unit of the matrix
  std::vector<std::string> legacy_keys;  // their keys under result schema 1 (file paths)
  results::RegisterStats registered;     // legacy rows adopted, rows superseded or restored
  std::vector<int> bundle_tokens;        // approximate prompt tokens, for ordering
  // prefix_chain of each bundle's prompt (its task text's ids, no chat template), for handing
  // bundles to the worker whose prefix store holds their beginning (sweep_affinity.h)
  std::vector<std::vector<uint64_t>> bundle_prefixes;
  std::map<std::string, std::vector<tasks::MetricInfo>> metric_info;  // by unit key
  std::map<std::string, std::string> key_task, key_policy, key_budget;
};

// The task's options as the sweep runs them: the config's (with `limit` for tasks that take
// one), file paths made absolute so that they do not depend on the directory the sweep was
// started from. (Result schema 1 keyed these; the units table shows them.)
Options keyed_task_options(const SweepConfig& cfg, const TaskEntry& te);
// The task options a unit key holds: the above without the file options (file, data, data_dir,
// haystack_dir, haystack_file, fewshot_data, task_file). What the files held enters the key as
// the sample's content (tasks::sample_sha256) and the definition's task_sha256, so moving or
// copying a folder keeps every key and editing one data item changes only its sample's keys.
std::map<std::string, std::string> content_task_options(const Options& run_options);
// The task options of a unit's slot (results::UnitRow::slot_key): the file options as paths
// relative to the config file's folder, so that a folder moved whole keeps its slots and two data
// files of one task never share one.
std::map<std::string, std::string> slot_task_options(const Options& run_options,
                                                     const std::string& config_path);

// Expands the matrix: for every model, its tokenizer (no weights) builds every task's samples;
// every sample of a cell of expand_config_cells (the one expansion of the matrix, which `kvbench
// validate` counts too) is a unit. Registers them all under run_id; bundles hold only the units still `pending`. Fills model name -> file SHA-256
// (harness/model_digest.h: from the store's digest cache when the file is unchanged). Files a
// policy reads enter the keys by content (harness/policy_files.h), hashed through `file_digests`
// (null: a digest cache of this call's own; a sweep passes one to all its expansions).
Plan expand(const SweepConfig& cfg, results::Store& store, int64_t run_id,
            std::map<std::string, std::string>* model_hashes,
            FileDigests* file_digests = nullptr);

}  // namespace kvb::harness
