// `kvbench sweep CONFIG --db FILE`: expands the matrix into units, skips finished ones, and runs
// bundles (units sharing a sample) on worker ranks over MPI — or on this process when started
// without mpirun — writing every result on rank 0, one transaction per bundle (DESIGN.md
// "Scheduling", "Results", "Faults").
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "common/sha256.h"
#include "harness/cli.h"
#include "harness/model_info.h"
#include "harness/mpi_comm.h"
#include "harness/mpi_group.h"
#include "harness/sweep_config.h"
#include "harness/sweep_faults.h"
#include "harness/sweep_tp.h"
#include "harness/sweep_wire.h"
#include "common/table.h"
#include "results/analysis.h"
#include "results/store.h"
#include "workers/engine/tensor_parallel.h"
#include "workers/runner.h"

namespace po = boost::program_options;

namespace kvb::harness {

namespace {

struct SweepArgs {
  std::string config, db;
  bool resume = false, rerun = false, share_prefill = true, progress = false;
  std::string rerun_status;  // --rerun-status: comma-separated statuses
  std::set<results::UnitStatus> rerun_statuses;
  int threads = 0;
  int gpus_per_worker = 1;  // tensor-parallel degree of each worker group
  std::string device = "cpu";
  std::string dtype;  // "" : the device's default (engine::resolve_dtype)
  std::string device_label;  // the run's provenance: "cpu", or "cuda: <GPU name> x<count>"
};

// One unit as the coordinator plans it.
struct PlannedUnit {
  WireUnit wire;
  int bundle = 0;
};

struct Plan {
  std::vector<WireBundle> bundles;       // all bundles (units: only those still to run)
  std::vector<std::string> all_keys;     // every unit of the matrix
  std::vector<int> bundle_tokens;        // approximate prompt tokens, for ordering
  std::map<std::string, std::vector<tasks::MetricInfo>> metric_info;  // by unit key
  std::map<std::string, std::string> key_task, key_policy, key_budget;
};

std::string file_sha256(const std::string& path) { return sha256_file(path); }

// The task's options as the sweep runs and keys them: the config's (with `limit` for tasks that
// take one), file paths made absolute so that unit keys do not depend on the directory the sweep
// was started from.
Options keyed_task_options(const SweepConfig& cfg, const TaskEntry& te) {
  Options in = task_options(cfg, te);
  Options out({}, "task option");
  for (const auto& [k, v] : in.values()) {
    std::error_code ec;
    const bool is_path = (k == "file" || k == "data" || k == "data_dir" || k == "haystack_dir" ||
                          k == "haystack_file" || k == "fewshot_data") &&
                         std::filesystem::exists(v, ec);
    out.set(k, is_path ? std::filesystem::weakly_canonical(v, ec).string() : v);
  }
  return out;
}

// Expands the matrix: for every model, its tokenizer (no weights) builds every task's samples;
// every (sample, policy entry, budget, question, seed) not excluded is a unit.
Plan expand(const SweepConfig& cfg, results::Store& store, int64_t run_id,
            std::map<std::string, std::string>* model_hashes) {
  Plan plan;
  std::vector<results::UnitRow> rows;
  std::vector<std::pair<int, WireUnit>> units;  // bundle index, unit
  for (size_t mi = 0; mi < cfg.models.size(); ++mi) {
    const ModelEntry& me = cfg.models[mi];
    const ModelInfo info = read_model_info(me.path);
    const std::string model_sha = file_sha256(me.path);
    (*model_hashes)[me.name] = model_sha;
    workers::LoadedModel tok = workers::load_tokenizer_only(me.path, me.tokenizer);
    tasks::TaskContext ctx;
    ctx.count_tokens = [&](const std::string& t) {
      return static_cast<int>(workers::encode_text(tok, t, false, false).size());
    };
    ctx.max_context = info.max_seq_len;
    for (size_t ti = 0; ti < cfg.tasks.size(); ++ti) {
      const TaskEntry& te = cfg.tasks[ti];
      const Options topts = keyed_task_options(cfg, te);
      std::unique_ptr<tasks::Task> task = tasks::make_task(te.name, topts);
      std::vector<tasks::Sample> samples = task->samples(ctx);
      for (tasks::Sample& s : samples) {
        if (cfg.generation.max_new_tokens > 0) s.max_new_tokens = cfg.generation.max_new_tokens;
        const int prompt_tokens = ctx.count_tokens(s.context + s.question + s.text);
        WireBundle b{static_cast<int>(mi), static_cast<int>(ti), s, {}};
        const int bundle_index = static_cast<int>(plan.bundles.size());
        plan.bundles.push_back(b);
        plan.bundle_tokens.push_back(prompt_tokens);
        for (const PolicyEntry& pe : cfg.policies) {
          std::vector<BudgetEntry> budgets = cfg.budgets;
          if (pe.name == "full") budgets = {BudgetEntry{}};
          for (const BudgetEntry& be : budgets) {
            for (const std::string& q : cfg.questions) {
              for (uint64_t seed : cfg.seeds) {
                const std::string spec = pe.name == "full" ? "" : be.spec();
                std::map<std::string, std::string> axes = {{"model", me.name},
                                                           {"task", te.name},
                                                           {"policy", pe.name},
                                                           {"kv_budget", spec},
                                                           {"question", q},
                                                           {"seed", std::to_string(seed)}};
                if (excluded(cfg, axes)) continue;
                int tokens = be.tokens;
                if (be.ratio > 0) tokens = std::max(1, static_cast<int>(be.ratio * prompt_tokens));
                results::UnitRow row;
                row.spec.model_sha256 = model_sha;
                row.spec.task = te.name;
                row.spec.task_version = task->version();
                row.spec.task_options = topts.values();
                row.spec.sample_id = s.id;
                row.spec.policy = pe.name;
                row.spec.policy_options = pe.options;
                row.spec.kv_budget_spec = spec;
                row.spec.question = q;
                row.spec.max_new_tokens = s.max_new_tokens;
                row.spec.seed = seed;
                row.spec.generation = {{"temperature", std::to_string(cfg.generation.temperature)},
                                       {"top_k", std::to_string(cfg.generation.top_k)},
                                       {"top_p", std::to_string(cfg.generation.top_p)}};
                row.model = me.name;
                if (pe.name != "full") row.kv_budget = tokens;
                row.sample_fields = s.fields;
                const std::string key = results::unit_key(row.spec);
                rows.push_back(row);
                WireUnit u{key, pe.name, pe.options, pe.name == "full" ? 0 : tokens, q, seed};
                units.push_back({bundle_index, u});
                plan.metric_info[key] = task->metrics();
                plan.key_task[key] = te.name;
                plan.key_policy[key] = pe.name;
                plan.key_budget[key] = spec.empty() ? "-" : spec;
              }
            }
          }
        }
      }
    }
  }
  plan.all_keys = store.register_units(run_id, rows);
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

// The runner's failure as the units table spells it.
results::UnitStatus unit_status(workers::FailureStatus s) {
  switch (s) {
    case workers::FailureStatus::kTimeout:
      return results::UnitStatus::kTimeout;
    case workers::FailureStatus::kOom:
      return results::UnitStatus::kOom;
    case workers::FailureStatus::kCrashed:
      return results::UnitStatus::kCrashed;
    case workers::FailureStatus::kError:
      break;
  }
  return results::UnitStatus::kError;
}

bool is_usage_error(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.kind() == ErrorKind::kUsage;
  } catch (...) {
    return false;
  }
}

// Runs a bundle on this process: loads (and caches) the model, runs every unit, scores. With a
// tensor-parallel group, every rank of the group runs the same bundle on its shard of the model
// (the leader's results are the group's).
class BundleRunner {
 public:
  // device/dtype/gpu: where this process runs the model (--device, --dtype, the GPU index).
  BundleRunner(const SweepConfig& cfg, bool share, engine::Device device, engine::DType dtype,
               int gpu, kernels::Communicator* tp = nullptr)
      : cfg_(cfg), share_(share), device_(device), dtype_(dtype), gpu_(gpu), tp_(tp) {}

  std::vector<results::UnitResult> run(const WireBundle& b) {
    if (loaded_model_ != b.model) {
      engine_.reset();
      lm_ = workers::load_model_and_tokenizer(cfg_.models[b.model].path, cfg_.models[b.model].tokenizer);
      if (tp_) *lm_.model = engine::shard_model(*lm_.model, tp_->rank(), tp_->size());
      engine_ = engine::make_engine(*lm_.model, device_, dtype_, gpu_, tp_);
      if (device_ == engine::Device::kCuda) {
        KVB_LOG_INFO << "model " << lm_.model->config.name << " on "
                     << engine_->device_description() << " (" << engine::dtype_name(dtype_) << ")";
      }
      loaded_model_ = b.model;
    }
    std::unique_ptr<tasks::Task> task =
        tasks::make_task(cfg_.tasks[b.task].name, keyed_task_options(cfg_, cfg_.tasks[b.task]));
    const engine::ModelConfig& c = lm_.model->config;
    std::vector<policies::PolicyConfig> pcs;
    std::vector<results::UnitResult> out(b.units.size());
    // Units of one bundle may differ in question placement: run each placement as a group.
    std::map<std::string, std::vector<size_t>> by_question;
    for (size_t i = 0; i < b.units.size(); ++i) by_question[b.units[i].question].push_back(i);
    for (const auto& [q, idx] : by_question) {
      workers::RunSettings rs;
      rs.question = workers::parse_question_placement(q);
      rs.max_prompt_tokens = cfg_.max_prompt_tokens;
      rs.time_limit_s = cfg_.unit_time_limit_s;
      rs.sampling = {cfg_.generation.temperature, cfg_.generation.top_k, cfg_.generation.top_p, 0};
      if (const char* dir = std::getenv("KVB_DUMP_KEEPSETS")) {
        rs.on_final_cache = [&, dir](size_t k, const kernels::KvCache& cache,
                                     const policies::Policy& policy) {
          dump_keep_set(dir, b.units[idx[k]].key, tp_ ? tp_->rank() : 0, cache, policy);
        };
      }
      std::vector<policies::PolicyConfig> group;
      for (size_t i : idx) {
        const WireUnit& u = b.units[i];
        policies::PolicyConfig pc;
        pc.name = u.policy;
        pc.kv_budget = u.kv_budget;
        pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
        pc.options = policies::PolicyOptions(u.policy_options);
        pc.seed = u.seed;
        group.push_back(pc);
      }
      faults_.crash_if(b.sample.id);
      rs.faults.bad_alloc_unit = -1;
      for (size_t k = 0; k < idx.size(); ++k) {
        const WireUnit& u = b.units[idx[k]];
        if (faults_.bad_alloc_in(b.sample.id, u.policy, u.kv_budget)) {
          rs.faults.bad_alloc_unit = static_cast<int>(k);
        }
      }
      rs.faults.shared_prefill_sleep_ms = faults_.shared_prefill_sleep_ms;
      std::vector<std::optional<workers::UnitFailure>> failures;
      std::vector<workers::UnitOutput> outs;
      try {
        faults_.throw_if(b.sample.id, tp_ ? tp_->rank() : 0);
        outs = workers::run_bundle(lm_, *engine_, b.sample, group, rs, share_, &failures);
      } catch (...) {
        // Whatever escaped run_bundle (the shared prefill, a usage error, a tensor-parallel
        // rank's failure) fails every unit of this placement group with its type; the rank goes
        // on with its next bundle.
        const workers::UnitFailure f = workers::current_failure("sample " + b.sample.id);
        // A tensor-parallel rank's runtime failure (out of memory, a device fault) may be its
        // alone: the group's other ranks then wait in a collective it will never join. Stop the
        // job (cmd_sweep aborts it); the bundle's units stay in flight for --resume, which
        // retries them and marks them crashed after a second time. Usage errors come from the
        // config and the model, the same on every rank, and fail only the bundle's units.
        if (tp_ && tp_->size() > 1 && !is_usage_error(std::current_exception())) {
          throw Error("worker group rank " + std::to_string(tp_->rank()) + "/" +
                      std::to_string(tp_->size()) + ", sample " + b.sample.id + ": " + f.message +
                      "; the group's other ranks may be waiting for this one, so the job stops "
                      "(rerun with --resume: the bundle's units are retried once, then marked "
                      "crashed)");
        }
        outs.assign(group.size(), {});
        failures.assign(group.size(), f);
      }
      for (size_t k = 0; k < idx.size(); ++k) {
        const WireUnit& u = b.units[idx[k]];
        results::UnitResult& r = out[idx[k]];
        r.unit_key = u.key;
        if (u.policy != "full") r.kv_budget = u.kv_budget;
        if (failures[k]) {
          r.status = unit_status(failures[k]->status);
          r.error = failures[k]->message;
          continue;
        }
        const workers::UnitOutput& o = outs[k];
        try {
          const tasks::Scores sc = task->score(b.sample, o.prediction);
          for (const auto& mi : task->metrics()) {
            if (sc.count(mi.name)) r.metrics.push_back({mi.name, sc.at(mi.name), mi.higher_is_better});
          }
          for (const auto& [name, v] : sc) {
            bool declared = false;
            for (const auto& mi : task->metrics()) declared |= mi.name == name;
            if (!declared) r.metrics.push_back({name, v, true});
          }
        } catch (const std::exception& e) {
          r.status = results::UnitStatus::kError;
          r.error = std::string("scoring: ") + e.what();
        }
        const workers::UnitMeasurements& m = o.m;
        r.measurements = to_store(m);
        r.prediction = results::PredictionRow{o.prediction.text, b.sample.references};
        if (tp_ && tp_->rank() == 0) {
          KVB_LOG_INFO << tp_traffic_line(u.key, m);
        }
      }
    }
    return out;
  }

  // run(), with a failure outside the units' own runs (loading the model, an exception this code
  // did not expect) recorded on every unit of the bundle, typed, so that the rank goes on with
  // its next bundle and the coordinator gets an answer. Usage errors (a bad config or model,
  // the same for every bundle) and any failure of a tensor-parallel group still propagate: the
  // job stops (cmd_sweep aborts it under mpirun).
  std::vector<results::UnitResult> run_or_fail(const WireBundle& b) {
    try {
      return run(b);
    } catch (...) {
      if ((tp_ && tp_->size() > 1) || is_usage_error(std::current_exception())) throw;
      const workers::UnitFailure f = workers::current_failure("sample " + b.sample.id);
      KVB_LOG_WARN << "bundle of sample " << b.sample.id << " failed: " << f.message;
      loaded_model_ = -1;  // the model may be half loaded: load it again for the next bundle
      std::vector<results::UnitResult> out(b.units.size());
      for (size_t i = 0; i < b.units.size(); ++i) {
        out[i].unit_key = b.units[i].key;
        if (b.units[i].policy != "full") out[i].kv_budget = b.units[i].kv_budget;
        out[i].status = unit_status(f.status);
        out[i].error = f.message;
      }
      return out;
    }
  }

 private:
  const SweepConfig& cfg_;
  bool share_;
  engine::Device device_;
  engine::DType dtype_;
  int gpu_ = 0;
  kernels::Communicator* tp_ = nullptr;
  FaultInjection faults_ = FaultInjection::from_env();
  int loaded_model_ = -1;
  workers::LoadedModel lm_;
  std::unique_ptr<engine::EngineBase> engine_;
};

class Progress {
 public:
  Progress(int total, bool enabled) : total_(total), enabled_(enabled) {}
  void add(int n) {
    done_ += n;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    const double rate = s > 0 ? done_ / s : 0;
    const double eta = rate > 0 ? (total_ - done_) / rate : 0;
    if (!enabled_) return;
    std::ostringstream o;
    o << std::fixed << std::setprecision(2) << "sweep: " << done_ << "/" << total_ << " units, "
      << rate << " units/s, " << std::setprecision(0) << s << " s elapsed, ETA " << eta << " s";
    KVB_LOG_INFO << o.str();
  }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  int total_, done_ = 0;
  bool enabled_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

void print_summary(results::Store& store, const std::set<std::string>& declared, std::ostream& os) {
  // Mean of each declared metric per model x task x policy x budget with its t interval (the
  // cells of `kvbench query summary` and the report), then counts by status.
  Table t({"model", "task", "policy", "kv_budget", "metric", "n", "mean", "ci95 lo", "ci95 hi"});
  for (const results::ScoreCell& c : results::score_cells(store, {})) {
    if (!declared.count(c.metric)) continue;  // aggregation helpers (e.g. perplexity's nll sums)
    t.add({c.model, c.task, c.policy, c.budget, c.metric, std::to_string(c.ci.n),
           results::fixed(c.ci.mean), results::fixed(c.ci.lo), results::fixed(c.ci.hi)});
  }
  t.print(os, "md");
  const results::QueryResult s =
      store.query("SELECT status, COUNT(*) FROM units GROUP BY status ORDER BY status");
  os << "\nunits:";
  for (const auto& r : s.rows) os << " " << r[1].text << " " << r[0].text;
  os << "\n";
}

// The config's `threads` applies when the command line left it at 0.
void apply_config_threads(const SweepArgs& a, const SweepConfig& cfg) {
  if (a.threads <= 0 && cfg.threads > 0) omp_set_num_threads(cfg.threads);
}

// Every model of the config must split over the group's ranks (checked before any unit runs).
void check_tp_degree(const SweepConfig& cfg, int degree) {
  if (degree == 1) return;
  for (const ModelEntry& me : cfg.models) {
    const ModelInfo info = read_model_info(me.path);
    const std::string err = engine::tp_degree_error(me.name, info.num_heads, info.num_kv_heads,
                                                    info.hidden_dim, degree);
    KVB_USAGE_CHECK(err.empty()) << err;
  }
}

// --rerun-status "oom,timeout" -> {kOom, kTimeout}; a usage error names a bad status.
std::set<results::UnitStatus> parse_rerun_statuses(const std::string& text) {
  std::set<results::UnitStatus> out;
  if (text.empty()) return out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    bool found = false;
    for (auto st : {results::UnitStatus::kOk, results::UnitStatus::kError,
                    results::UnitStatus::kOom, results::UnitStatus::kTimeout,
                    results::UnitStatus::kCrashed}) {
      if (item == results::to_string(st)) {
        out.insert(st);
        found = true;
      }
    }
    KVB_USAGE_CHECK(found) << "--rerun-status " << text << ": '" << item
                           << "' is not a finished unit status; use ok, error, oom, timeout or "
                              "crashed, comma-separated";
  }
  return out;
}

// How long the coordinator waits out another connection's lock on the database before it gives
// up (each attempt already waits the store's busy timeout).
constexpr double kMaxLockWaitS = 1800;

// Runs `write` (a Store call), retrying with back-off while another connection holds the
// database lock (results::DatabaseBusy): a second writer or a long checkpoint must not discard
// finished results. The caller keeps what it writes (`units` of them) in memory meanwhile; under
// mpirun the workers wait for their next bundle. Gives up after kMaxLockWaitS with an error that
// says what was not written.
template <typename Fn>
auto retry_while_locked(const std::string& db, const char* what, size_t units, Fn write) {
  const auto t0 = std::chrono::steady_clock::now();
  double pause_s = 0.5;
  for (int attempt = 1;; ++attempt) {
    try {
      return write();
    } catch (const results::DatabaseBusy& e) {
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited > kMaxLockWaitS) {
        throw Error(std::string(e.what()) + "; gave up " + what + " after " +
                    std::to_string(static_cast<int>(waited)) + " s of retries (" +
                    std::to_string(units) + " finished units not written; find the process that "
                    "holds " + db + " open for writing, then rerun with --resume)");
      }
      KVB_LOG_WARN << "results database " << db << " is locked by another connection (" << what
                   << ", attempt " << attempt << "); keeping " << units
                   << " unit(s) in memory, retrying in " << pause_s << " s";
      std::this_thread::sleep_for(std::chrono::duration<double>(pause_s));
      pause_s = std::min(pause_s * 2, 30.0);
    }
  }
}

int coordinate(const SweepArgs& a, MpiComm& comm, const WorkerLayout& layout) {
  SweepConfig cfg = load_sweep_config(a.config);
  apply_config_threads(a, cfg);
  check_tp_degree(cfg, a.gpus_per_worker);
  results::Store store = results::Store::open(a.db, results::Mode::kReadWrite);
  const results::QueryResult inflight =
      store.query("SELECT COUNT(*) FROM units WHERE status = 'running'");
  const bool has_inflight = !inflight.rows.empty() && inflight.rows[0][0].text != "0";
  KVB_USAGE_CHECK(a.resume || !has_inflight)
      << a.db << " has " << inflight.rows[0][0].text
      << " units in flight from a run that did not finish; continue it with --resume";
  results::RunInfo info;
  info.config_text = cfg.text;
  info.git_rev = KVB_GIT_REV;
  info.kvbench_version = KVB_VERSION;
  info.host = process_host();
  info.ranks = comm.size();
  info.devices_json = worker_layout_json(comm.size(), a.gpus_per_worker, a.device_label);
  const int64_t run_id =
      retry_while_locked(a.db, "starting the run", 0, [&] { return store.begin_run(info); });
  if (a.resume) {
    const results::Recovery rec = store.recover_after_crash(run_id);
    KVB_LOG_INFO << "resume: " << rec.requeued.size() << " units requeued, " << rec.crashed.size()
                 << " marked crashed (in flight during " << results::kMaxCrashes
                 << " crashed runs), " << rec.dead_runs << " dead runs";
  }
  std::map<std::string, std::string> model_hashes;
  Plan plan = expand(cfg, store, run_id, &model_hashes);
  if (a.rerun) {
    store.rerun_units(plan.all_keys);
    plan = expand(cfg, store, run_id, &model_hashes);
  } else if (!a.rerun_statuses.empty()) {
    std::vector<std::string> again;
    for (const auto& [key, st] : store.unit_status(plan.all_keys)) {
      if (a.rerun_statuses.count(st.status)) again.push_back(key);
    }
    KVB_LOG_INFO << "--rerun-status " << a.rerun_status << ": " << again.size()
                 << " unit(s) of this matrix run again";
    store.rerun_units(again);
    plan = expand(cfg, store, run_id, &model_hashes);
  }
  // Longest prompt first; bundles with nothing left are dropped.
  std::vector<int> order;
  int total = 0;
  for (size_t i = 0; i < plan.bundles.size(); ++i) {
    if (!plan.bundles[i].units.empty()) {
      order.push_back(static_cast<int>(i));
      total += static_cast<int>(plan.bundles[i].units.size());
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int x, int y) { return plan.bundle_tokens[x] > plan.bundle_tokens[y]; });
  KVB_LOG_INFO << "sweep " << a.config << ": " << plan.all_keys.size() << " units in the matrix, "
               << total << " to run in " << order.size() << " bundles on "
               << std::max(1, layout.groups) << " worker group(s) of " << a.gpus_per_worker
               << " rank(s) (device " << a.device << "); database " << a.db;
  Progress progress(total, a.progress || isatty(2));
  int failed = 0;  // units of this run that did not end ok
  auto write = [&](const std::vector<results::UnitResult>& rs) {
    retry_while_locked(a.db, "writing a bundle", rs.size(), [&] { store.write_bundle(rs); });
    for (const auto& r : rs) failed += r.status != results::UnitStatus::kOk;
    progress.add(static_cast<int>(rs.size()));
  };
  auto keys_of = [](const WireBundle& b) {
    std::vector<std::string> k;
    for (const auto& u : b.units) k.push_back(u.key);
    return k;
  };
  if (comm.size() == 1) {
    BundleRunner runner(cfg, a.share_prefill, engine::parse_device(a.device),
                        engine::resolve_dtype(engine::parse_device(a.device), a.dtype), 0);
    for (int bi : order) {
      retry_while_locked(a.db, "handing out a bundle", 0, [&] {
        store.mark_running(run_id, keys_of(plan.bundles[bi]), 0, process_host());
      });
      write(runner.run_or_fail(plan.bundles[bi]));
    }
  } else {
    // Dynamic scheduling: idle worker groups (their leaders) ask; each gets the next bundle or a
    // stop. Leftover ranks in no group get their stop at the end.
    size_t next = 0;
    int active = layout.groups;
    while (active > 0) {
      int source = 0;
      const std::string msg = comm.recv_any(&source);
      if (msg != "ready") write(results_from_json(msg));
      if (next < order.size()) {
        const WireBundle& b = plan.bundles[order[next++]];
        retry_while_locked(a.db, "handing out a bundle", 0, [&] {
          store.mark_running(run_id, keys_of(b), source, "rank" + std::to_string(source));
        });
        comm.send(source, to_json(b));
      } else {
        comm.send(source, "stop");
        --active;
      }
    }
    for (int r = layout.leader_of(layout.groups); r < comm.size(); ++r) comm.send(r, "stop");
  }
  retry_while_locked(a.db, "finishing the run", 0,
                     [&] { store.finish_run(run_id, results::RunStatus::kOk); });
  KVB_LOG_INFO << "sweep done: " << total << " units in " << std::fixed << std::setprecision(1)
               << progress.seconds() << " s ("
               << (progress.seconds() > 0 ? total / progress.seconds() : 0) << " units/s)";
  std::set<std::string> declared;
  for (const auto& [key, infos] : plan.metric_info) {
    for (const auto& mi : infos) declared.insert(mi.name);
  }
  print_summary(store, declared, std::cout);
  if (failed > 0) {
    KVB_LOG_WARN << failed << " of " << total
                 << " units of this run did not finish ok (exit status 1); `kvbench query --db "
                 << a.db << " failures` lists them";
    return 1;
  }
  return 0;
}

// A worker rank: the leader of a group receives bundles from the coordinator and broadcasts
// them to its group; every rank of the group runs them; the leader returns the results.
int work(const SweepArgs& a, MpiComm& comm, const WorkerLayout& layout, WorkerGroup& group) {
  if (layout.group < 0) {
    // A leftover rank: wait (sleeping, not spinning) for the coordinator's stop.
    int source = 0;
    while (comm.recv_any(&source) != "stop") {
    }
    return 0;
  }
  SweepConfig cfg = load_sweep_config(a.config);
  apply_config_threads(a, cfg);
  // --device cuda: one GPU per worker rank, by its index among the node's workers.
  const engine::Device device = engine::parse_device(a.device);
  const int gpu =
      device == engine::Device::kCuda ? engine::node_local_gpu(comm.local_worker_index()) : 0;
  if (device == engine::Device::kCuda) {
    KVB_LOG_INFO << "worker rank " << comm.rank() << ": GPU " << gpu << " (node-local worker "
                 << comm.local_worker_index() << ")";
  }
  BundleRunner runner(cfg, a.share_prefill, device, engine::resolve_dtype(device, a.dtype), gpu,
                      group.comm.get());
  if (layout.leader) comm.send(0, "ready");
  while (true) {
    std::string msg;
    if (layout.leader) msg = comm.recv(0);
    if (group.comm) broadcast_text(*group.comm, &msg);
    if (msg == "stop") return 0;
    const std::vector<results::UnitResult> results = runner.run_or_fail(bundle_from_json(msg));
    if (layout.leader) comm.send(0, to_json(results));
  }
}

}  // namespace

int cmd_sweep(const std::vector<std::string>& args) {
  SweepArgs a;
  po::options_description desc(
      "usage: kvbench sweep CONFIG [--db FILE] [--resume] [options]\n"
      "       mpirun -np N kvbench sweep CONFIG [--db FILE] [--resume]\n"
      "       mpirun -np 1+k*G kvbench sweep CONFIG [--db FILE] --gpus-per-worker G --device cpu\n\n"
      "Expands the experiment matrix CONFIG (YAML; see configs/README.md) into units, skips those\n"
      "the database already finished, and runs the rest: under mpirun rank 0 coordinates and\n"
      "writes the database while ranks 1..N-1 run bundles; without mpirun one process does both.\n"
      "With --gpus-per-worker G, ranks 1.. form groups of G ranks that each run one model split\n"
      "over their ranks (tensor parallelism; harness/README.md \"Tensor-parallel workers\").\n"
      "Prints a summary table (md) on stdout; progress with an ETA on stderr.\n\noptions");
  desc.add_options()("help,h", "print this help")
      ("db", po::value(&a.db),
       "results database (SQLite; created if missing); default out/<config name>.db")
      ("resume", po::bool_switch(&a.resume),
       "continue after a crash: units in flight go back to pending (crashed after 2 crashes)")
      ("rerun", po::bool_switch(&a.rerun), "run finished units of this matrix again")
      ("rerun-status", po::value(&a.rerun_status),
       "run again only the units of this matrix with these statuses, comma-separated: ok, error, "
       "oom, timeout, crashed (e.g. --rerun-status oom,timeout after freeing memory)")
      ("no-share-prefill", po::bool_switch(), "run every unit's own prefill (for comparisons)")
      ("progress", po::bool_switch(&a.progress), "progress lines even when stderr is not a terminal")
      ("threads", po::value(&a.threads)->default_value(0),
       "OpenMP threads per worker (0: cores / ranks on this node)")
      ("gpus-per-worker", po::value(&a.gpus_per_worker)->default_value(1),
       "ranks (GPUs) per worker group: each group runs one model split over its ranks (tensor "
       "parallelism: heads and MLP columns); -np must be 1 + a multiple of it")
      ("device", po::value(&a.device)->default_value("cpu"),
       "where workers run the model: cpu, or cuda (one GPU per worker rank, by its index among "
       "the node's workers; builds with CUDA only; tensor-parallel groups stay on cpu)")
      ("dtype", po::value(&a.dtype),
       "f32 or bf16 on cuda (default bf16); cpu runs f32")
      ("config", po::value(&a.config), "the YAML matrix (positional)");
  po::positional_options_description pos;
  pos.add("config", 1);
  po::variables_map vm;
  if (!parse_command_line(args, desc, &pos, "sweep", &vm)) return 0;
  a.share_prefill = !vm["no-share-prefill"].as<bool>();
  a.rerun_statuses = parse_rerun_statuses(a.rerun_status);
  KVB_USAGE_CHECK(!(a.rerun && !a.rerun_statuses.empty()))
      << "--rerun runs every finished unit again; --rerun-status " << a.rerun_status
      << " only those with a status: give one of them";
  const engine::Device device = engine::parse_device(a.device);
  engine::resolve_dtype(device, a.dtype);  // a bad --dtype (or bf16 on cpu) fails before MPI
  KVB_USAGE_CHECK(device == engine::Device::kCpu || a.gpus_per_worker == 1)
      << "--device cuda with --gpus-per-worker " << a.gpus_per_worker
      << ": tensor-parallel groups run on the CPU engine only (NCCL groups of CUDA engines are "
         "future work); use --gpus-per-worker 1 or --device cpu";
  KVB_USAGE_CHECK(a.gpus_per_worker >= 1)
      << "--gpus-per-worker must be >= 1, got " << a.gpus_per_worker;
  MpiComm comm = MpiComm::init_if_launched();
  set_process_identity(comm.rank(), comm.size());
  // cuda: "this build has no CUDA" everywhere; "no GPU visible" where this process runs units
  // (one process), else on each worker when it binds its GPU.
  a.device_label = device == engine::Device::kCuda
                       ? engine::cuda_device_label(/*require_device=*/comm.size() == 1)
                       : "cpu";
  KVB_USAGE_CHECK(a.gpus_per_worker == 1 || comm.size() > a.gpus_per_worker)
      << "--gpus-per-worker " << a.gpus_per_worker << " needs mpirun with at least "
      << 1 + a.gpus_per_worker << " ranks (a coordinator plus one group); this run has "
      << comm.size();
  const WorkerLayout layout = plan_worker_layout(comm.size(), comm.rank(), a.gpus_per_worker);
  // Collective over every rank; destroyed before comm (MPI_Finalize).
  WorkerGroup group = a.gpus_per_worker > 1 ? split_worker_groups(comm, layout) : WorkerGroup{};
  if (comm.size() > 1 && layout.leftover > 0 && (comm.rank() == 0 || layout.group < 0)) {
    KVB_LOG_WARN << (comm.rank() == 0 ? "" : "this rank idles: ")
                 << leftover_warning(comm.size(), a.gpus_per_worker);
  }
  if (group.comm) {
    KVB_LOG_INFO << "worker group " << layout.group << " rank " << layout.tp_rank << "/"
                 << a.gpus_per_worker << (layout.leader ? " (leader)" : "")
                 << ": device cpu; node-local GPU index for --device cuda: " << group.local_gpu;
  }
  // Threads: cores shared by the ranks of this node (the coordinator mostly waits).
  int threads = a.threads;
  if (threads <= 0) {
    const int cores = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
    const int workers_here = std::max(1, comm.local_size() - (comm.rank() == 0 ? 0 : 1));
    threads = std::max(1, cores / (comm.size() > 1 ? workers_here : 1));
  }
  // mpirun binds each rank to one core when np <= 2: more threads than the rank's CPUs would
  // only time-slice. Use what the binding allows and say how to get more.
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0) {
    const int allowed = CPU_COUNT(&mask);
    if (allowed > 0 && allowed < threads) {
      if (comm.rank() != 0) {
        KVB_LOG_WARN << "this rank may run on " << allowed << " CPU(s) only (MPI binding); using "
                     << allowed << " thread(s) instead of " << threads
                     << " (mpirun --bind-to none lets ranks share the node's cores)";
      }
      threads = allowed;
    }
  }
  omp_set_num_threads(threads);
  try {
    KVB_USAGE_CHECK(!a.config.empty()) << "give the CONFIG file (see kvbench sweep --help)";
    if (a.db.empty()) {
      // out/<config stem>.db, as scripts/quickstart.sh names its database.
      a.db = "out/" + std::filesystem::path(a.config).stem().string() + ".db";
      if (comm.rank() == 0) {
        std::error_code ec;
        std::filesystem::create_directories("out", ec);
        KVB_USAGE_CHECK(!ec) << "no --db given and cannot create out/ for " << a.db << ": "
                             << ec.message() << " (pass --db FILE)";
        KVB_LOG_INFO << "no --db given: results go to " << a.db;
      }
    }
    return comm.rank() == 0 ? coordinate(a, comm, layout) : work(a, comm, layout, group);
  } catch (const Error& e) {
    if (comm.size() > 1) {
      std::cerr << "kvbench sweep: error: " << e.what() << "\n";
      comm.abort(e.kind() == ErrorKind::kUsage ? 2 : 1);
    }
    throw;
  } catch (const std::exception& e) {
    // Not ours (std::bad_alloc outside a unit, ...): under mpirun a rank that returned would leave
    // the others waiting for it forever (rank 0 in recv_any, workers in MPI_Finalize).
    if (comm.size() > 1) {
      std::cerr << "kvbench sweep: error: " << e.what() << "\n";
      comm.abort(1);
    }
    throw;
  }
}

}  // namespace kvb::harness
