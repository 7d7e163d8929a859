// `kvbench validate CONFIG`: loads and validates a sweep config (harness/sweep_config.h) without
// loading any model weights, then prints a Markdown summary on stdout: the models (from their
// headers), tasks with their sample counts, policies, budgets, the number of units and a rough
// estimate of the work. Each model's tokenizer is loaded as the sweep loads it, to refuse what
// would stop the sweep; token counts stay approximate (bytes / 4).
#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "common/error.h"
#include "common/table.h"
#include "harness/cli.h"
#include "harness/sweep_config.h"
#include "harness/task_file.h"
#include "kernels/policies/policy.h"
#include "tasks/task.h"
#include "workers/engine/tensor_parallel.h"
#include "workers/model_session.h"

namespace po = boost::program_options;

namespace kvb::harness {
namespace {

int approx_tokens(const std::string& text) { return static_cast<int>((text.size() + 3) / 4); }

std::string fixed(double v, int prec) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(prec) << v;
  return s.str();
}

std::string duration(double seconds) {
  if (seconds < 120) return fixed(seconds, 0) + " s";
  if (seconds < 7200) return fixed(seconds / 60, 1) + " min";
  return fixed(seconds / 3600, 1) + " h";
}

std::string count(size_t n, const std::string& one, const std::string& many = "") {
  return std::to_string(n) + " " + (n == 1 ? one : many.empty() ? one + "s" : many);
}

// Work of one unit of a sample, in approximate tokens.
struct SampleWork {
  int64_t prefill = 0;  // prompt tokens through a oneshot forward pass
  int64_t decode = 0;   // tokens one at a time: generated (at most), or perplexity's stream
  bool generates = false;  // generation: a bundle's units decode together (decode_batch)
  bool over_context = false;
};

// What a decode step of b sequences costs in single-sequence steps: the weights are read once
// for all of them, each sequence's attention and policy are its own. 1 + 0.3 (b - 1): SmolLM2
// on 2 cores measured 0.18 (512-token contexts) to 0.32 (2,048) (bench/README.md, bm_decode_batch).
constexpr double kBatchStepCost = 0.3;

// Single-sequence steps for the decode of one bundle's k generation units of g tokens each, in
// batches of at most `batch` units (0: all of them, decode_batch: auto).
double bundle_decode_steps(int64_t k, int64_t g, int batch) {
  const int64_t b = batch <= 0 ? k : std::min<int64_t>(k, batch);
  if (b <= 0 || g <= 0) return 0;
  const int64_t full = k / b, rest = k % b;
  auto steps = [&](int64_t size) { return g * (1 + kBatchStepCost * (size - 1)); };
  return full * steps(b) + (rest > 0 ? steps(rest) : 0);
}

SampleWork sample_work(const tasks::Sample& s, const SweepConfig& cfg, const ModelInfo& info) {
  SampleWork w;
  if (s.kind == tasks::SampleKind::kPerplexity) {
    const int64_t n = approx_tokens(s.text);
    w.decode = s.max_tokens > 0 ? std::min<int64_t>(n, s.max_tokens) : n;
    w.over_context = w.decode > info.max_seq_len;
    return w;
  }
  int64_t prompt =
      approx_tokens(s.context) + approx_tokens(s.question) + approx_tokens(s.answer_prefix);
  const int64_t gen =
      s.kind == tasks::SampleKind::kGenerate
          ? (cfg.generation.max_new_tokens > 0 ? cfg.generation.max_new_tokens : s.max_new_tokens)
          : 0;
  int64_t cap = info.max_seq_len - gen;
  if (cfg.max_prompt_tokens > 0) cap = std::min<int64_t>(cap, cfg.max_prompt_tokens);
  if (s.max_prompt_tokens > 0) cap = std::min<int64_t>(cap, s.max_prompt_tokens);
  w.over_context = prompt + gen > info.max_seq_len;
  prompt = std::max<int64_t>(1, std::min(prompt, cap));  // middle truncation
  if (s.kind == tasks::SampleKind::kChoice) {
    for (const std::string& c : s.choices) prompt += approx_tokens(c);  // scored continuations
  }
  w.prefill = prompt;
  w.decode = gen;
  w.generates = s.kind == tasks::SampleKind::kGenerate;
  return w;
}

// Cells per (model, task): the units of each of its samples' bundles.
std::map<std::pair<int, int>, int64_t> cells_by(const std::vector<ConfigCell>& cells) {
  std::map<std::pair<int, int>, int64_t> n;
  for (const ConfigCell& c : cells) ++n[{c.model, c.task}];
  return n;
}

// The longest sequence (prompt + decode, capped at the context) among a model's samples.
int64_t longest_sequence(const std::vector<std::vector<SampleWork>>& work, int64_t max_seq_len) {
  int64_t longest = 0;
  for (const auto& task_work : work) {
    for (const SampleWork& s : task_work) {
      longest = std::max(longest, std::min<int64_t>(s.prefill + s.decode, max_seq_len));
    }
  }
  return longest;
}

}  // namespace

int cmd_validate(const std::vector<std::string>& args) {
  std::string config_path;
  double prefill_rate = 400, decode_rate = 20;
  int ranks = 1, gpus_per_worker = 1;
  po::options_description desc(
      "usage: kvbench validate CONFIG [options]\n\n"
      "Checks a sweep config (configs/README.md) without loading any model weights: YAML, keys,\n"
      "ranges, every task and policy name and option, budgets against each model's context,\n"
      "files. Prints the models, tasks, policies, the number of units and a rough work estimate.\n"
      "Exit 0 when valid, 2 with an error naming file:line: key otherwise.\n\noptions");
  desc.add_options()("help,h", "print this help")(
      "prefill-tok-s", po::value(&prefill_rate)->default_value(400),
      "assumed prefill speed per rank for the estimate (tokens/s)")(
      "decode-tok-s", po::value(&decode_rate)->default_value(20),
      "assumed decode speed of one sequence per rank for the estimate (tokens/s; a decode batch's "
      "steps are costed from it)")(
      "ranks", po::value(&ranks)->default_value(1),
      "worker ranks (GPUs) for the estimate, the coordinator not counted")(
      "gpus-per-worker", po::value(&gpus_per_worker)->default_value(1),
      "ranks (GPUs) per worker group (tensor parallelism): checks that it splits every model and "
      "prints the groups and the memory per GPU")(
      "include-path", po::value<std::vector<std::string>>()->composing(),
      "a folder of task definitions (YAML) found by name, searched before KVBENCH_TASK_PATH and "
      "the working directory's configs/tasks (repeatable; also include_path: in the config)");
  po::options_description hidden;
  hidden.add_options()("config", po::value(&config_path));
  po::options_description all;
  all.add(desc).add(hidden).add(common_options());
  po::positional_options_description pos;
  pos.add("config", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    KVB_USAGE_FAIL() << e.what() << " (see kvbench validate --help)";
  }
  apply_common_options(vm);
  if (vm.count("help")) {
    std::cout << desc << "\n" << common_options() << "\n";
    return 0;
  }
  KVB_USAGE_CHECK(!config_path.empty()) << "a config file is required: kvbench validate CONFIG";
  set_task_include_paths(vm.count("include-path")
                             ? vm["include-path"].as<std::vector<std::string>>()
                             : std::vector<std::string>{});
  // inf passed a plain `> 0` and made every estimate 0 s.
  for (const auto& [flag, rate] :
       {std::pair{"--prefill-tok-s", prefill_rate}, std::pair{"--decode-tok-s", decode_rate}}) {
    KVB_USAGE_CHECK(std::isfinite(rate) && rate > 0)
        << flag << " must be a positive, finite speed in tokens/s, got " << rate;
  }
  KVB_USAGE_CHECK(ranks >= 1) << "--ranks must be >= 1, got " << ranks;
  KVB_USAGE_CHECK(gpus_per_worker >= 1)
      << "--gpus-per-worker must be >= 1, got " << gpus_per_worker;
  if (ranks < gpus_per_worker) ranks = gpus_per_worker;  // at least one group
  const int groups = ranks / gpus_per_worker;

  const SweepConfig cfg = load_sweep_config(config_path);
  for (const std::string& note : cfg.notes) std::cerr << "kvbench validate: note: " << note << "\n";
  for (const ModelEntry& me : cfg.models) {
    const std::string err = engine::tp_degree_error(me.name, me.info.num_heads,
                                                    me.info.num_kv_heads, me.info.hidden_dim,
                                                    gpus_per_worker);
    KVB_USAGE_CHECK(err.empty()) << config_path << ": " << err;
    // The sweep's coordinator loads this before any unit runs (sweep_plan.cc), and a worker then
    // checks it against the model's vocabulary (load_model_and_tokenizer): refused here alike.
    const std::string tok_file =
        me.tokenizer.empty() ? "the model's own" : "'" + me.tokenizer + "'";
    int vocab = 0;
    try {
      vocab = workers::load_tokenizer_only(me.path, me.tokenizer).tokenizer->vocab_size();
    } catch (const Error& e) {
      KVB_USAGE_FAIL() << config_path << ": model '" << me.name << "': tokenizer " << tok_file
                       << " cannot be loaded: " << e.what();
    }
    KVB_USAGE_CHECK(vocab <= me.info.vocab_size)
        << config_path << ": model '" << me.name << "': tokenizer " << tok_file << " has " << vocab
        << " tokens but the model only " << me.info.vocab_size << ": wrong tokenizer: for "
        << me.path << "?";
  }

  // Samples per (model, task): the task's own generator with approximate token counts.
  std::vector<std::vector<std::vector<SampleWork>>> work(cfg.models.size());
  for (size_t m = 0; m < cfg.models.size(); ++m) {
    for (const TaskEntry& t : cfg.tasks) {
      tasks::TaskContext ctx;
      ctx.render_jinja = render_task_jinja;  // a definition's Jinja templates (sandboxed)
      ctx.count_tokens = approx_tokens;
      ctx.max_context = cfg.models[m].info.max_seq_len;
      std::vector<tasks::Sample> samples;
      try {
        samples = make_any_task(t.name, task_options(cfg, t))->samples(ctx);
      } catch (const Error& e) {
        throw Error(cfg.path + ": task '" + t.spec() + "' on model '" + cfg.models[m].name +
                        "': " + e.what(),
                    e.kind(), e.origin());
      }
      const ModelInfo& info = cfg.models[m].info;
      const bool chat = std::any_of(samples.begin(), samples.end(),
                                    [](const tasks::Sample& s) { return s.chat; });
      KVB_USAGE_CHECK(!chat || info.chat_template != "none")
          << cfg.path << ": task '" << t.spec() << "' wraps its prompts in the model's chat "
          << "template, but model '" << cfg.models[m].name << "' (" << info.path
          << ") has none kvbench recognizes (no tokenizer.chat_template in the file; a base "
          << "model has none): give the task the option chat: false, or use an instruction-tuned "
          << "model";
      KVB_USAGE_CHECK(!chat || info.chat_template_error.empty())
          << cfg.path << ": task '" << t.spec() << "' wraps its prompts in the chat template of "
          << "model '" << cfg.models[m].name
          << "', which kvbench cannot use: " << info.chat_template_error
          << " (give the task the option chat: false)";
      std::vector<SampleWork> w;
      for (const auto& s : samples) w.push_back(sample_work(s, cfg, info));
      work[m].push_back(std::move(w));
    }
  }

  const std::vector<ConfigCell> cells = expand_config_cells(cfg);
  int64_t units = 0, prefill = 0, decode = 0, shared_prefill = 0;
  std::map<std::pair<int, int>, int64_t> units_by;  // (model, task) -> units
  std::set<std::tuple<int, int, int>> bundles;      // shared prefill: (model, task, question)
  for (const ConfigCell& c : cells) {
    const auto& w = work[c.model][c.task];
    units += static_cast<int64_t>(w.size());
    units_by[{c.model, c.task}] += static_cast<int64_t>(w.size());
    for (const SampleWork& s : w) {
      prefill += s.prefill;
      decode += s.decode;
    }
    if (bundles.insert({c.model, c.task, c.question}).second) {
      for (const SampleWork& s : w) shared_prefill += s.prefill;
    }
  }

  // Decode in single-sequence steps, the config's decode_batch applied: a bundle is one sample
  // of a (model, task) with a unit per cell; its generation units decode together.
  double decode_steps = 0;
  for (const auto& [mt, k] : cells_by(cells)) {
    for (const SampleWork& s : work[mt.first][mt.second]) {
      decode_steps += s.generates ? bundle_decode_steps(k, s.decode, cfg.decode_batch)
                                  : static_cast<double>(k) * s.decode;
    }
  }

  std::cout << "# kvbench validate: " << cfg.path
            << "\n\nconfig OK: " << count(cfg.models.size(), "model") << ", "
            << count(cfg.tasks.size(), "task") << ", "
            << count(cfg.policies.size(), "policy entry", "policy entries") << ", "
            << count(cfg.budgets.size(), "budget") << ", "
            << count(cfg.questions.size(), "question placement") << ", "
            << count(cfg.seeds.size(), "seed") << "; " << count(cells.size(), "cell") << " after "
            << count(cfg.exclude.size(), "exclusion rule") << ".\n\nunits: " << units
            << "\n\n## Models (from file headers; no weights loaded)\n\n";
  Table mt({"model", "format", "arch", "type", "params (M)", "layers", "heads", "kv heads",
            "head_dim", "context", "KV KiB/token", "f32 weights MiB", "peak KV MiB (full)"});
  for (size_t m = 0; m < cfg.models.size(); ++m) {
    const ModelInfo& i = cfg.models[m].info;
    const int64_t longest = longest_sequence(work[m], i.max_seq_len);
    mt.add({cfg.models[m].name, i.format, i.arch, i.weight_type, fixed(i.num_params / 1e6, 2),
            std::to_string(i.num_layers), std::to_string(i.num_heads),
            std::to_string(i.num_kv_heads), std::to_string(i.head_dim),
            std::to_string(i.max_seq_len), fixed(i.kv_bytes_per_token() / 1024.0, 1),
            fixed(i.f32_weight_bytes() / 1048576.0, 1),
            fixed(longest * i.kv_bytes_per_token() / 1048576.0, 1)});
  }
  mt.print(std::cout, "md");

  // Worker groups (tensor parallelism): the layout of `mpirun -np 1 + ranks` and memory per GPU.
  std::cout << "\n## Workers\n\n- groups: " << groups << " of " << gpus_per_worker
            << " GPU(s) each (" << groups * gpus_per_worker << " worker ranks";
  if (ranks % gpus_per_worker) std::cout << "; " << ranks % gpus_per_worker << " idle";
  std::cout << "; mpirun -np " << 1 + groups * gpus_per_worker << ")\n- GPUs per group: "
            << gpus_per_worker << "\n\n";
  Table wt({"model", "GPUs per group", "weights MiB per GPU (f32)", "peak KV MiB per GPU (full)",
            "total MiB per GPU"});
  for (size_t m = 0; m < cfg.models.size(); ++m) {
    const ModelInfo& i = cfg.models[m].info;
    const int64_t longest = longest_sequence(work[m], i.max_seq_len);
    // Each GPU caches its own KV heads: num_kv_heads / degree of them.
    const double kv = static_cast<double>(longest) * i.kv_bytes_per_token() / gpus_per_worker;
    const double w = static_cast<double>(i.f32_weight_bytes_per_rank(gpus_per_worker));
    wt.add({cfg.models[m].name, std::to_string(gpus_per_worker), fixed(w / 1048576.0, 1),
            fixed(kv / 1048576.0, 1), fixed((w + kv) / 1048576.0, 1)});
  }
  wt.print(std::cout, "md");

  std::cout << "\n## Tasks (samples per model; prompt tokens approximate: bytes / 4)\n\n";
  Table tt({"model", "task", "options", "samples", "mean prompt tok", "max prompt tok",
            "over context", "units"});
  for (size_t m = 0; m < cfg.models.size(); ++m) {
    for (size_t t = 0; t < cfg.tasks.size(); ++t) {
      const auto& w = work[m][t];
      int64_t sum = 0, mx = 0, over = 0;
      for (const SampleWork& s : w) {
        const int64_t p = s.prefill + (s.prefill == 0 ? s.decode : 0);
        sum += p;
        mx = std::max(mx, p);
        over += s.over_context;
      }
      std::string opts;
      for (const auto& [k, v] : cfg.tasks[t].options)
        opts += (opts.empty() ? "" : " ") + k + "=" + v;
      auto it = units_by.find({static_cast<int>(m), static_cast<int>(t)});
      tt.add({cfg.models[m].name, cfg.tasks[t].name, opts, std::to_string(w.size()),
              w.empty() ? "0" : std::to_string(sum / static_cast<int64_t>(w.size())),
              std::to_string(mx), std::to_string(over),
              std::to_string(it == units_by.end() ? 0 : it->second)});
    }
  }
  tt.print(std::cout, "md");

  std::cout << "\n## Policies\n\n";
  Table pt({"policy", "options", "budgets"});
  for (const PolicyEntry& p : cfg.policies) {
    std::string opts;
    for (const auto& [k, v] : p.options) opts += (opts.empty() ? "" : " ") + k + "=" + v;
    pt.add(
        {p.name, opts,
         policies::budgeted(p.name) ? std::to_string(cfg.budgets.size()) : "none (one unit)"});
  }
  pt.print(std::cout, "md");
  std::string budgets, seeds, questions;
  for (const BudgetEntry& b : cfg.budgets) budgets += (budgets.empty() ? "" : ", ") + b.spec();
  for (uint64_t s : cfg.seeds) seeds += (seeds.empty() ? "" : ", ") + std::to_string(s);
  for (const std::string& q : cfg.questions) questions += (questions.empty() ? "" : ", ") + q;
  std::cout << "\nbudgets (kv_budget, tokens per KV head): " << (budgets.empty() ? "none" : budgets)
            << "\nquestion: " << questions << "\nseeds: " << seeds << "\nlimit: "
            << (cfg.limit > 0 ? std::to_string(cfg.limit) + " samples per task" : "the tasks' own")
            << "\nexclusion rules: " << cfg.exclude.size() << "\n";
  if (cfg.findings) {
    std::cout << "findings: " << cfg.findings->claims.size() << " claim(s) of "
              << cfg.findings->paper << ", " << cfg.findings->baselines.size()
              << " baseline bar(s), checked against this matrix (after the sweep: kvbench query "
                 "--db DB findings)\n";
  }

  const double t_full = (prefill / prefill_rate + decode_steps / decode_rate) / groups;
  const double t_shared = (shared_prefill / prefill_rate + decode_steps / decode_rate) / groups;
  const std::string batching =
      cfg.decode_batch == 1
          ? "one unit at a time (decode_batch: 1)"
          : "each bundle's generation units in batches of " +
                (cfg.decode_batch == 0 ? std::string("all of them (decode_batch: auto)")
                                       : "up to " + std::to_string(cfg.decode_batch)) +
                ", a step of b sequences costing 1 + " + fixed(kBatchStepCost, 1) +
                " (b - 1) single steps";
  std::cout << "\n## Work estimate (approximate)\n\n"
            << "- units: " << units << " in " << cells.size() << " cells\n"
            << "- prompt tokens: " << prefill << " over all units; " << shared_prefill
            << " if each (model, sample, question) prefill is shared across policies"
            << (cfg.prefix_cache_mib > 0
                    ? " (fewer where prompts begin alike: prefix reuse, not estimated)"
                    : "")
            << "\n"
            << "- generated or streamed tokens: at most " << decode << "; decoded " << batching
            << ": " << fixed(decode_steps, 0) << " single-sequence steps\n"
            << "- time: " << duration(t_full) << " without prefill sharing, " << duration(t_shared)
            << " with it, on " << groups << (gpus_per_worker > 1 ? " worker group" : " rank")
            << (groups > 1 ? "s" : "") << ", ASSUMING " << fixed(prefill_rate, 0)
            << " prefill tok/s and " << fixed(decode_rate, 0) << " decode tok/s per "
            << (gpus_per_worker > 1 ? "group" : "rank")
            << " (a 2-core CPU on a ~135M model; set --prefill-tok-s, --decode-tok-s, --ranks"
            << (gpus_per_worker > 1 ? ", --gpus-per-worker" : "") << ")\n";
  return 0;
}

}  // namespace kvb::harness
