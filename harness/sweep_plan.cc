// Matrix expansion into keyed units and bundles (harness/sweep_plan.h).
#include "harness/sweep_plan.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "harness/model_digest.h"
#include "harness/model_info.h"
#include "harness/sweep_affinity.h"
#include "harness/task_file.h"
#include "tasks/fed_tokens.h"
#include "workers/model_session.h"

namespace kvb::harness {

namespace {
bool is_file_option(const std::string& k) {
  return k == "file" || k == "data" || k == "data_dir" || k == "haystack_dir" ||
         k == "haystack_file" || k == "fewshot_data" || k == "task_file";
}
}  // namespace

Options keyed_task_options(const SweepConfig& cfg, const TaskEntry& te) {
  Options in = task_options(cfg, te);
  Options out({}, "task option");
  for (const auto& [k, v] : in.values()) {
    std::error_code ec;
    const bool is_path = is_file_option(k) && std::filesystem::exists(v, ec);
    out.set(k, is_path ? std::filesystem::weakly_canonical(v, ec).string() : v);
  }
  return out;
}

std::map<std::string, std::string> content_task_options(const Options& run_options) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : run_options.values()) {
    if (!is_file_option(k)) out[k] = v;
  }
  return out;
}

std::map<std::string, std::string> slot_task_options(const Options& run_options,
                                                     const std::string& config_path) {
  std::error_code ec;
  const std::filesystem::path base =
      std::filesystem::weakly_canonical(std::filesystem::absolute(config_path, ec), ec)
          .parent_path();
  std::map<std::string, std::string> out = run_options.values();
  for (auto& [k, v] : out) {
    if (is_file_option(k)) v = std::filesystem::path(v).lexically_relative(base).generic_string();
  }
  return out;
}

Plan expand(const SweepConfig& cfg, results::Store& store, int64_t run_id,
            std::map<std::string, std::string>* model_hashes, FileDigests* file_digests) {
  Plan plan;
  // Each policy entry's options as the keys hash them (a Python policy's script by content).
  // load_sweep_config already resolved a relative script path against the file it is written
  // in (parse_policies), so it is not joined to the config's folder again: with a relative
  // config path (`kvbench sweep cfg/sweep.yaml`) that made cfg/cfg/my.py, a usage error.
  FileDigests own_digests;
  std::vector<std::map<std::string, std::string>> keyed_policy(cfg.policies.size());
  for (size_t pi = 0; pi < cfg.policies.size(); ++pi) {
    keyed_policy[pi] = keyed_policy_options(cfg.policies[pi].name, cfg.policies[pi].options, "",
                                            file_digests ? *file_digests : own_digests);
  }
  std::vector<results::UnitRow> rows;
  std::vector<std::pair<int, WireUnit>> units;  // bundle index, unit
  // The matrix's cells (sweep_cells.cc, the one expansion: `kvbench validate` counts the same),
  // model > task > policy > budget > question > seed; every sample of a cell's task is a unit.
  const std::vector<ConfigCell> cells = expand_config_cells(cfg);
  for (size_t mi = 0; mi < cfg.models.size(); ++mi) {
    const ModelEntry& me = cfg.models[mi];
    const ModelInfo info = read_model_info(me.path);
    const std::string model_sha = model_file_sha256(store, me.path).sha256;
    (*model_hashes)[me.name] = model_sha;
    workers::LoadedModel tok = workers::load_tokenizer_only(me.path, me.tokenizer);
    tasks::TaskContext ctx;
    ctx.render_jinja = render_task_jinja;  // a definition's Jinja templates (sandboxed)
    ctx.count_tokens = [&](const std::string& t) {
      return static_cast<int>(workers::encode_text(tok, t, false, false).size());
    };
    ctx.max_context = info.max_seq_len;
    for (size_t ti = 0; ti < cfg.tasks.size(); ++ti) {
      const TaskEntry& te = cfg.tasks[ti];
      const Options topts = keyed_task_options(cfg, te);
      std::unique_ptr<tasks::Task> task = make_any_task(te.name, topts);
      std::vector<tasks::Sample> samples = task->samples(ctx);
      // --limit N (a quick look): the first N samples, with the task's options unchanged, so
      // the units are those of the full run and a later run without --limit skips them.
      if (cfg.sample_cap > 0 && samples.size() > static_cast<size_t>(cfg.sample_cap)) {
        samples.resize(cfg.sample_cap);
      }
      std::vector<ConfigCell> task_cells;  // this (model, task)'s cells, in the matrix's order
      for (const ConfigCell& cell : cells) {
        if (cell.model == static_cast<int>(mi) && cell.task == static_cast<int>(ti)) {
          task_cells.push_back(cell);
        }
      }
      const std::map<std::string, std::string> content_options = content_task_options(topts);
      const std::map<std::string, std::string> slot_options = slot_task_options(topts, cfg.path);
      for (tasks::Sample& s : samples) {
        const std::string sample_sha = tasks::sample_sha256(s);  // as the task built it
        if (cfg.generation.max_new_tokens > 0) s.max_new_tokens = cfg.generation.max_new_tokens;
        const std::vector<int32_t> prompt_ids =
            workers::encode_text(tok, s.context + s.question + s.text, false, false);
        const int prompt_tokens = static_cast<int>(prompt_ids.size());
        WireBundle b{static_cast<int>(mi), static_cast<int>(ti), s, {}};
        const int bundle_index = static_cast<int>(plan.bundles.size());
        plan.bundles.push_back(b);
        plan.bundle_tokens.push_back(prompt_tokens);
        plan.bundle_prefixes.push_back(prefix_chain(prompt_ids));
        for (const ConfigCell& cell : task_cells) {
          const PolicyEntry& pe = cfg.policies[cell.policy];
          const bool budgeted = cell.budget >= 0;  // not `full`
          const BudgetEntry be = budgeted ? cfg.budgets[cell.budget] : BudgetEntry{};
          const std::string& q = cfg.questions[cell.question];
          const uint64_t seed = cfg.seeds[cell.seed];
          const std::string spec = budgeted ? be.spec() : "";
          const int tokens =
              be.tokens_for(tasks::fed_prompt_tokens(s, prompt_tokens, cfg.max_prompt_tokens));
          results::UnitRow row;
          row.spec.model_sha256 = model_sha;
          row.spec.task = te.name;
          row.spec.task_version = task->version();
          row.spec.task_options = content_options;
          row.shown_task_options = topts.values();
          row.spec.sample_id = s.id;
          row.spec.policy = pe.name;
          row.spec.policy_options = keyed_policy[cell.policy];
          if (keyed_policy[cell.policy] != pe.options) row.shown_policy_options = pe.options;
          row.spec.kv_budget_spec = spec;
          row.spec.question = q;
          row.spec.max_new_tokens = s.max_new_tokens;
          row.spec.seed = seed;
          row.spec.generation = {{"temperature", std::to_string(cfg.generation.temperature)},
                                 {"top_k", std::to_string(cfg.generation.top_k)},
                                 {"top_p", std::to_string(cfg.generation.top_p)}};
          row.model = me.name;
          if (budgeted) row.kv_budget = tokens;
          row.spec.sample_sha256 = sample_sha;
          row.sample_fields = s.fields;
          row.references = s.references;
          {
            results::UnitSpec legacy = row.spec;  // result schema 1: the files by path
            legacy.task_options = topts.values();
            row.legacy_key = results::legacy_unit_key(legacy);
            results::UnitSpec slot = row.spec;  // the files by their paths from the config
            slot.task_options = slot_options;
            row.slot_key = results::unit_slot_key(slot);
          }
          const std::string key = results::unit_key(row.spec);
          rows.push_back(row);
          WireUnit u{key, pe.name, pe.options, budgeted ? tokens : 0, q, seed, be.fraction()};
          units.push_back({bundle_index, u});
          plan.metric_info[key] = task->metrics();
          plan.key_task[key] = te.name;
          plan.key_policy[key] = pe.name;
          plan.key_budget[key] = spec.empty() ? "-" : spec;
        }
      }
    }
  }
  plan.all_keys = store.register_units(run_id, rows, &plan.registered);
  for (const results::UnitRow& row : rows) plan.legacy_keys.push_back(row.legacy_key);
  // Units still to run go into their bundles.
  const std::vector<std::string> keys = [&] {
    std::vector<std::string> k;
    for (const auto& u : units) k.push_back(u.second.key);
    return k;
  }();
  const std::map<std::string, results::UnitState> states = store.unit_status(keys);
  std::set<std::string> seen;
  for (const auto& [bi, u] : units) {
    const auto it = states.find(u.key);
    if (it == states.end() || it->second.status != results::UnitStatus::kPending) continue;
    if (!seen.insert(u.key).second) continue;  // the same unit twice in the matrix
    plan.bundles[bi].units.push_back(u);
  }
  return plan;
}

}  // namespace kvb::harness
