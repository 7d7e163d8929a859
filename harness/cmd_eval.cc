// `kvbench eval`: one task end to end in one process under one policy and budget; prints a
// per-sample table and the aggregate (md, csv or jsonl on stdout), progress on stderr. Each sample
// is a bundle of one unit, run, scored and failed by the sweep's own BundleRunner.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>
#include <chrono>
#include <fstream>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include "common/error.h"
#include "common/escape.h"
#include "common/log.h"
#include "harness/bundle_runner.h"
#include "harness/cli.h"
#include "harness/sweep_config.h"
#include "harness/sweep_wire.h"
#include "harness/task_file.h"
#include "common/table.h"
#include "results/analysis.h"
#include "results/stats.h"
#include "tasks/fed_tokens.h"
#include "tasks/task.h"
#include "workers/model_session.h"
#include "workers/runner.h"

namespace po = boost::program_options;

namespace kvb::harness {

namespace {
std::string fmt(double v, int prec = 4) {
  if (!std::isfinite(v)) return "nan";
  std::ostringstream s;
  s << std::fixed << std::setprecision(prec) << v;
  return s.str();
}

// An eval run as the sweep's runner takes it: a matrix of one model, one task and one policy,
// whose units (one per sample) come as bundles of one. As `kvbench eval` always ran them: no
// time limit, each unit prefills its own prompt (no shared prefill, no prefix store), one unit
// at a time.
SweepConfig eval_config(const std::string& model_path, const std::string& tokenizer_path,
                        const std::string& task_name, const Options& task_options,
                        const std::string& policy_name, const policies::PolicyOptions& popts,
                        int max_prompt_tokens) {
  SweepConfig cfg;
  cfg.path = "(kvbench eval)";
  cfg.models = {ModelEntry{model_path, model_path, tokenizer_path, ModelInfo{}}};
  cfg.tasks = {TaskEntry{task_name, task_options.values()}};
  cfg.policies = {PolicyEntry{policy_name, popts.values()}};
  cfg.max_prompt_tokens = max_prompt_tokens;
  cfg.unit_time_limit_s = 0;  // none
  cfg.decode_batch = 1;
  cfg.prefix_cache_mib = 0;
  return cfg;
}
}  // namespace

int cmd_eval(const std::vector<std::string>& args) {
  std::string model_path, tokenizer_path, task_name, policy_name = "full", question = "in_prompt",
                                                     output = "md";
  std::vector<std::string> task_opts, policy_opts, include_paths;
  DeviceOptions dev_opts;
  std::string kv_budget_text, compression_text, log_samples;
  int limit = -1, threads = 0, max_prompt_tokens = 0, show_prediction = 60;
  std::string seed_text = "0";
  po::options_description desc(
      "usage: kvbench eval --model PATH --task NAME [--task-opt k=v ...] [--policy NAME "
      "--kv-budget N] [options]\n\n"
      "Runs one task end to end in one process and prints per-sample and aggregate scores.\n"
      "Tasks and their options: kvbench ls tasks; policies: kvbench ls policies.\n\noptions");
  desc.add_options()
      ("help,h", "print this help")
      ("model,m", po::value(&model_path),
       "model: .gguf, llama2.c .bin or Hugging Face checkpoint folder")
      ("tokenizer,t", po::value(&tokenizer_path), "tokenizer (required for llama2.c models)")
      ("task", po::value(&task_name),
       "task name (built in, or a definition on the task search path: --include-path, "
       "KVBENCH_TASK_PATH, ./configs/tasks), or a definition file .yaml")
      ("task-opt", po::value(&task_opts)->composing(), "task option key=value (repeatable)")
      ("include-path", po::value(&include_paths)->composing(),
       "a folder of task definitions (YAML) found by --task NAME, searched before "
       "KVBENCH_TASK_PATH and the working directory's configs/tasks (repeatable)")
      ("policy", po::value(&policy_name)->default_value("full"), "eviction policy")
      ("kv-budget", po::value(&kv_budget_text),
       "retained tokens per KV head per layer (256), or with a decimal point the fraction of each "
       "prompt kept (0.5)")
      ("compression-ratio", po::value(&compression_text),
       "instead of --kv-budget: kvpress's compression_ratio, the fraction of each prompt removed")
      ("policy-opt", po::value(&policy_opts)->composing(), "policy option key=value (repeatable)")
      ("limit", po::value(&limit)->default_value(-1), "evaluate at most K samples (task option limit)")
      ("question", po::value(&question)->default_value("in_prompt"),
       "question placement: in_prompt | after_compression")
      ("max-prompt-tokens", po::value(&max_prompt_tokens)->default_value(0),
       "middle-truncate prompts above this many tokens (0: the model's context)")
      ("seed", po::value(&seed_text)->default_value("0"), "seed for randomised policies")
      ("threads", po::value(&threads)->default_value(0), "OpenMP threads (0 = all cores; at most 1024)");
  add_device_options(desc, &dev_opts);
  desc.add_options()
      ("output,o", po::value(&output)->default_value("md"),
       "md | csv | jsonl. csv and jsonl take plain keys (sample_id, the sample's fields, each "
       "metric's name, prompt_tokens, prompt_sha256, prediction, references, ...); jsonl writes "
       "one typed object per sample as it finishes, then the aggregate ({\"task\": ...})")
      ("log-samples", po::value(&log_samples),
       "also write every sample as a jsonl object (the -o jsonl rows) to this file, whatever -o "
       "is (lm-eval's --log_samples)")
      ("show-prediction", po::value(&show_prediction)->default_value(60),
       "characters of each prediction shown in the md table (0: hide)");
  po::variables_map vm;
  if (!parse_command_line(args, desc, nullptr, "eval", &vm)) return 0;
  KVB_USAGE_CHECK(vm.count("model")) << "--model is required (see kvbench eval --help)";
  KVB_USAGE_CHECK(vm.count("task")) << "--task is required (kvbench ls tasks lists them)";
  set_task_include_paths(include_paths);
  KVB_USAGE_CHECK(output == "md" || output == "csv" || output == "jsonl")
      << "--output must be md, csv or jsonl, got " << output;
  KVB_USAGE_CHECK(limit >= 0 || vm["limit"].defaulted())
      << "--limit must be >= 0 (samples), got " << limit;
  KVB_USAGE_CHECK(max_prompt_tokens >= 0)
      << "--max-prompt-tokens must be >= 0 (tokens; 0: the model's context), got "
      << max_prompt_tokens;
  KVB_USAGE_CHECK(show_prediction >= 0)
      << "--show-prediction must be >= 0 (characters; 0: hide the column), got " << show_prediction;
  const uint64_t seed = parse_seed_option(seed_text);
  set_threads_option(threads);
  const DeviceChoice dc = resolve_device_options(dev_opts);  // before the (slow) model load
  Options topts = Options::from_key_values(task_opts, "--task-opt", "task option");
  if (limit >= 0) {
    KVB_USAGE_CHECK(!topts.has("limit")) << "give --limit or --task-opt limit, not both";
    topts.set("limit", std::to_string(limit));
  }
  workers::parse_question_placement(question);  // checked before the model is loaded
  // Names and options are checked before the model is loaded.
  if (task_name.size() > 5 && (task_name.ends_with(".yaml") || task_name.ends_with(".yml"))) {
    KVB_USAGE_CHECK(!topts.has("task_file")) << "give --task FILE.yaml or task_file, not both";
    topts.set("task_file", task_name);
    task_name = load_task_file(task_name).name;
  }
  std::unique_ptr<tasks::Task> task = make_any_task(task_name, topts);
  policies::require_policy(policy_name);
  const BudgetEntry budget = parse_budget_flags(kv_budget_text, compression_text);
  const policies::PolicyOptions popts = workers::parse_policy_options(policy_opts);

  // The sweep's own runner (harness/bundle_runner.h) runs each sample as a bundle of one unit, so
  // that eval and sweep build, run, score and fail units the same way.
  const SweepConfig cfg = eval_config(model_path, tokenizer_path, task_name, topts, policy_name,
                                      popts, max_prompt_tokens);
  BundleRunner runner(cfg, /*share=*/false, dc.device, dc.dtype, /*gpu=*/0);
  const workers::LoadedModel& lm = runner.model(0);
  const engine::ModelConfig& c = lm.model->config;
  policies::PolicyConfig pc;
  pc.name = policy_name;
  // A fraction resolves per prompt; the largest it can become is that of the context.
  pc.kv_budget = budget.none() ? 0 : budget.tokens_for(c.max_seq_len);
  pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len,
              c.has_sliding_layers()};
  pc.options = popts;
  pc.seed = seed;
  // Validate the budget and options against the model, and a window the question placement
  // leaves empty (finch with the question after compression) before any sample runs.
  std::unique_ptr<policies::Policy> probe = policies::make_policy(pc);
  if (question == "after_compression") {
    probe->set_question_tokens(0, 0);
    probe->prefill_stats(1);
  }
  engine::require_policy_layers(policy_name, model_path, c.global_layers(),
                                c.window.empty() ? 0 : c.window[0]);

  tasks::TaskContext ctx;

  ctx.render_jinja = render_task_jinja;  // a definition's Jinja templates (sandboxed)
  ctx.count_tokens = [&](const std::string& text) {
    return static_cast<int>(workers::encode_text(lm, text, false, false).size());
  };
  ctx.max_context = c.max_seq_len;
  std::vector<tasks::Sample> samples = task->samples(ctx);
  if (samples.empty()) {
    // Name what the samples came from: the task's options hold its data file or folder.
    std::string given;
    for (const std::string& kv : task_opts) given += (given.empty() ? "" : ", ") + kv;
    if (limit >= 0) given += (given.empty() ? "" : ", ") + ("limit=" + std::to_string(limit));
    KVB_USAGE_FAIL() << "task " << task_name << " produced no samples"
                     << (given.empty() ? " with its default options" : " with the options " + given)
                     << "; check its data (kvbench ls tasks lists each task's options)";
  }

  // Columns: sample fields (union, in first-seen order), metrics, measurements.
  std::vector<std::string> field_names;
  for (const auto& s : samples) {
    for (const auto& [k, v] : s.fields) {
      if (std::find(field_names.begin(), field_names.end(), k) == field_names.end()) {
        field_names.push_back(k);
      }
    }
  }
  // md: headers for people; csv: plain keys, and the prediction, references and prompt hash.
  const bool md = output == "md";
  std::vector<std::string> cols = {md ? "sample" : "sample_id"};
  cols.insert(cols.end(), field_names.begin(), field_names.end());
  for (const auto& mi : task->metrics()) {
    cols.push_back(md ? mi.name + (mi.higher_is_better ? " ↑" : " ↓") : mi.name);
  }
  for (const auto& [human, plain] : std::vector<std::pair<const char*, const char*>>{
           {"prompt tok", "prompt_tokens"}, {"gen tok", "generated_tokens"},
           {"prefill ms", "prefill_ms"}, {"decode ms/tok", "decode_ms_per_token"},
           {"KV MiB", "kv_mib_final"}, {"status", "status"}}) {
    cols.push_back(md ? human : plain);
  }
  if (md && show_prediction > 0) cols.push_back("prediction");
  if (!md) {
    for (const char* c : {"error", "prompt_sha256", "prediction", "references"}) cols.push_back(c);
  }
  Table table(cols);
  std::ofstream log_file;
  if (!log_samples.empty()) {
    log_file.open(log_samples);
    KVB_USAGE_CHECK(log_file.good()) << "--log-samples " << log_samples << " cannot be written";
  }

  std::vector<tasks::Scores> per_sample;
  int failed = 0;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < samples.size(); ++i) {
    const tasks::Sample& s = samples[i];
    std::vector<std::string> row = {s.id};
    for (const auto& f : field_names) row.push_back(s.fields.count(f) ? s.fields.at(f) : "");
    // A failure of the unit, of any exception type, is its result (status and message), as in
    // the sweep; usage errors outside the unit's own run (the model, the config) stop eval.
    // The sweep's resolution of a fraction: the prompt's tokens as the planner counts them.
    const int kv_budget =
        budget.none() ? 0
                      : budget.tokens_for(tasks::fed_prompt_tokens(
                            s, ctx.count_tokens(s.context + s.question + s.text), max_prompt_tokens));
    const WireBundle bundle{0, 0, s, {WireUnit{s.id, policy_name, popts.values(), kv_budget,
                                               question, seed, budget.fraction()}}};
    const results::UnitResult r = runner.run_or_fail(bundle).at(0);
    const results::Measurements m = r.measurements.value_or(results::Measurements{});
    const std::string prediction = r.prediction ? r.prediction->text : "";
    std::string status = "ok", error;
    tasks::Scores sc;
    if (r.status == results::UnitStatus::kOk) {
      for (const results::Metric& metric : r.metrics) sc[metric.name] = metric.value;
      per_sample.push_back(sc);
    } else {
      status = results::to_string(r.status);
      error = r.error;
      ++failed;
    }
    for (const auto& mi : task->metrics()) row.push_back(sc.count(mi.name) ? fmt(sc[mi.name]) : "");
    const double per_tok = m.generated_tokens > 1 ? m.decode_ms / (m.generated_tokens - 1) : 0;
    row.push_back(std::to_string(m.prompt_tokens));
    row.push_back(std::to_string(m.generated_tokens));
    row.push_back(fmt(m.prefill_ms, 1));
    row.push_back(fmt(per_tok, 2));
    row.push_back(fmt(m.kv_bytes_final / 1048576.0, 3));
    row.push_back(status == "ok" ? status : status + ": " + error);
    if (md && show_prediction > 0) row.push_back(cut_chars(prediction, show_prediction));
    const std::vector<std::string> references = r.prediction ? r.prediction->references
                                                             : std::vector<std::string>{};
    if (!md) {
      row.push_back(error);
      row.push_back(m.prompt_sha256);
      row.push_back(prediction);
      row.push_back(nlohmann::json(references).dump());
    }
    table.add(row);
    if (output == "jsonl" || log_file.is_open()) {
      // One typed object per sample, under plain keys (numbers as numbers, text as strings).
      nlohmann::json j;
      j["sample_id"] = s.id;
      j["fields"] = s.fields;
      nlohmann::json scores = nlohmann::json::object();
      for (const auto& [name, value] : sc) scores[name] = std::isfinite(value) ? nlohmann::json(value)
                                                                               : nlohmann::json();
      j["scores"] = scores;
      j["status"] = status;
      j["error"] = error;
      j["prompt_tokens"] = m.prompt_tokens;
      j["truncated_tokens"] = m.truncated_tokens;
      j["prompt_sha256"] = m.prompt_sha256;
      j["prediction"] = prediction;
      j["references"] = references;
      j["generated_tokens"] = m.generated_tokens;
      j["prefill_ms"] = m.prefill_ms;
      j["decode_ms"] = m.decode_ms;
      j["kv_bytes_final"] = m.kv_bytes_final;
      j["kv_budget"] = kv_budget;
      const std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      if (output == "jsonl") std::cout << line << "\n" << std::flush;
      if (log_file.is_open()) log_file << line << "\n" << std::flush;
    }
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double eta = elapsed / (i + 1) * (samples.size() - i - 1);
    KVB_LOG_INFO << "eval " << task_name << " " << policy_name << ": " << (i + 1) << "/"
                 << samples.size() << " samples, " << fmt(elapsed, 1) << " s elapsed, ETA "
                 << fmt(eta, 1) << " s" << (status == "ok" ? "" : " (" + error + ")");
  }
  if (output != "jsonl") table.print(std::cout, output);

  // Aggregate with the 95% interval of the mean per metric (results/stats.h score_ci, the
  // interval the sweep, query and report show), labelled.
  tasks::Scores agg = task->aggregate(per_sample);
  std::vector<std::string> acols = {"task", "policy", "kv_budget", "n", "failed"};
  // A composition (then:) is named with its options, as the sweep's tables name it.
  const std::string shown =
      popts.has("then") ? results::label_with_options(policy_name, popts.values()) : policy_name;
  std::vector<std::string> arow = {task_name, shown,
                                   budget.none() ? "0" : budget.spec(),
                                   std::to_string(per_sample.size()), std::to_string(failed)};
  bool intervals = false;
  for (const auto& [name, value] : agg) {
    acols.push_back(name);
    std::vector<double> x;
    for (const auto& s : per_sample) {
      if (s.count(name)) x.push_back(s.at(name));
    }
    // The task's own aggregate (perplexity pools tokens) unless it is the plain mean of samples.
    const results::MeanCI ci = results::score_ci(x);
    const bool plain_mean = x.size() == per_sample.size() && x.size() > 1 &&
                            std::fabs(ci.mean - value) <= 1e-12 * std::max(1.0, std::fabs(value));
    intervals = intervals || plain_mean;
    if (md) {
      arow.push_back(plain_mean ? fmt(value) + " (" + fmt(ci.lo) + ", " + fmt(ci.hi) + ")"
                                : fmt(value));
    } else {  // plain keys: the value, then its interval's bounds (empty where none)
      arow.push_back(fmt(value));
      acols.push_back(name + "_ci95_lo");
      arow.push_back(plain_mean ? fmt(ci.lo) : "");
      acols.push_back(name + "_ci95_hi");
      arow.push_back(plain_mean ? fmt(ci.hi) : "");
    }
  }
  Table at(acols);
  at.add(arow);
  if (md) std::cout << "\n";
  at.print(std::cout, output);
  if (intervals && md) std::cout << "\n(lo, hi): " << results::kScoreCiMethod << "\n";
  return failed > 0 ? 1 : 0;
}

}  // namespace kvb::harness
