// Rank 0 of `kvbench sweep` (harness/sweep_roles.h): opens the database, expands and registers
// the matrix, hands bundles to idle workers (or runs them itself without mpirun), writes every
// result (one transaction per bundle, retried while another connection holds the lock) and
// prints the summary (DESIGN.md "Scheduling", "Results", "Faults").
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "common/table.h"
#include "harness/bundle_runner.h"
#include "harness/git_rev.h"
#include "harness/model_info.h"
#include "harness/sweep_affinity.h"
#include "harness/sweep_plan.h"
#include "harness/sweep_prefix_share.h"
#include "harness/sweep_roles.h"
#include "harness/sweep_wire.h"
#include "results/analysis.h"
#include "workers/engine/engine_types.h"
#include "workers/engine/tensor_parallel.h"
#include "workers/prefix_store.h"

namespace kvb::harness {

namespace {

// The termination signal rank 0 of an MPI sweep received (0: none). When a rank dies, mpirun
// (Open MPI 4.1) sends the others SIGCONT, then SIGTERM about a second later, then SIGKILL within
// tens of milliseconds; a coordinator killed outright (SIGKILL, the OOM killer) gets nothing.
// Recording the first of them (runs.end_signal) tells the next --resume which happened; SIGCONT
// gives the recording a second's margin (SIGTERM alone was seen to lose the race to SIGKILL).
volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_cont_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }
extern "C" void on_cont_signal(int) { g_cont_signal = 1; }

struct StopSignal {
  int signal;
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

// What registering the matrix did to the units already in the database (content keys).
void report_registration(const results::RegisterStats& r, const std::string& db) {
  if (r.adopted > 0) {
    KVB_LOG_INFO << r.adopted << " unit(s) of " << db
                 << " were keyed by an older kvbench (by the task's file paths) and are adopted "
                    "under content keys with their results: their sample fields and references "
                    "equal the data as it is now (their prompt text was not stored, so an edit "
                    "to a context or question made before this run is not seen; `--rerun` runs "
                    "the matrix again)";
  }
  if (r.stale > 0) {
    KVB_LOG_INFO << r.stale << " unit(s) of " << db
                 << " were keyed by an older kvbench and their sample's data changed since: they "
                    "are superseded (kept, not counted) and run again";
  }
  if (r.superseded > 0) {
    KVB_LOG_INFO << r.superseded
                 << " unit(s) are superseded: their sample's data changed (an edited item), so "
                    "the units of the new content run and the old ones are kept but no longer "
                    "counted";
  }
  if (r.restored > 0) {
    KVB_LOG_INFO << r.restored
                 << " superseded unit(s) are current again: their sample's data is back as it "
                    "was when they ran";
  }
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

// Units of this matrix that earlier runs finished are kept as they are; if those runs computed
// in another precision (f32 against bf16: the CPU reference against a GPU's default, or CPU bf16
// weights) than this run, the database would hold one matrix in two precisions under one set of
// unit keys. Refused, naming the runs and the ways out; a recorded label that does not say its
// precision (a cuda run of an older kvbench) is only warned about.
void refuse_mixed_precision(results::Store& store, const std::vector<std::string>& keys,
                            const SweepArgs& a, int64_t run_id) {
  const std::string mine = engine::label_precision(a.device_label);
  if (mine.empty()) return;
  std::map<int64_t, int> kept_by_run;  // earlier run -> finished units of this matrix it computed
  for (const auto& [key, st] : store.unit_status(keys)) {
    if (st.status != results::UnitStatus::kPending && st.status != results::UnitStatus::kRunning &&
        st.run_id != run_id) {
      ++kept_by_run[st.run_id];
    }
  }
  int clash = 0, unknown = 0;
  std::ostringstream which;
  for (const auto& [run, units] : kept_by_run) {
    const results::QueryResult r =
        store.query("SELECT devices FROM runs WHERE run_id = ?", {std::to_string(run)});
    std::set<std::string> labels;
    if (!r.rows.empty()) {
      const nlohmann::json devices = nlohmann::json::parse(r.rows[0][0].text, nullptr, false);
      if (devices.is_array()) {
        for (const auto& d : devices) {
          if (d.is_object() && d.contains("device") && d["device"].is_string()) {
            labels.insert(d["device"].get<std::string>());
          }
        }
      }
    }
    for (const std::string& label : labels) {
      const std::string theirs = engine::label_precision(label);
      if (theirs.empty()) {
        unknown += units;
      } else if (theirs != mine) {
        clash += units;
        which << (clash == units ? "" : "; ") << "run " << run << " ('" << label << "', "
              << theirs << "): " << units << " unit(s)";
      }
    }
  }
  if (unknown > 0) {
    KVB_LOG_WARN << unknown << " finished unit(s) of this matrix in " << a.db
                 << " come from runs whose device label does not say its precision (an older "
                    "kvbench); this run computes in "
                 << mine << " ('" << a.device_label << "')";
  }
  if (clash == 0) return;
  retry_while_locked(a.db, "closing the refused run", 0,
                     [&] { store.finish_run(run_id, results::RunStatus::kError); });
  KVB_USAGE_FAIL() << a.db << ": " << clash << " finished unit(s) of this matrix were computed in "
                   << "another precision than this run's " << mine << " ('" << a.device_label
                   << "'): " << which.str()
                   << ". They would be kept beside units computed now, under the same unit keys. "
                      "Use another --db, or --rerun to recompute every unit in "
                   << mine << ".";
}

}  // namespace

int coordinate(const SweepArgs& a, MpiComm& comm, const WorkerLayout& layout) {
  SweepConfig cfg = load_sweep_config(a.config);
  cfg.sample_cap = a.limit;
  for (const std::string& note : cfg.notes) KVB_LOG_WARN << note;
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
  info.git_rev = git_rev();
  info.kvbench_version = KVB_VERSION;
  info.host = process_host();
  info.ranks = comm.size();
  info.devices_json = worker_layout_json(comm.size(), a.gpus_per_worker, a.device_label);
  // One process runs its units itself: its death may be a unit's, so it records nothing.
  info.records_signals = comm.size() > 1;
  const int64_t run_id =
      retry_while_locked(a.db, "starting the run", 0, [&] { return store.begin_run(info); });
  if (a.resume) {
    const results::Recovery rec = store.recover_after_crash(run_id);
    KVB_LOG_INFO << "resume: " << rec.requeued.size() << " units requeued, " << rec.crashed.size()
                 << " marked crashed (in flight during " << results::kMaxCrashes
                 << " crashed runs), " << rec.released.size()
                 << " requeued without a crash counted (their coordinator died alone), "
                 << rec.dead_runs << " dead runs";
  }
  std::map<std::string, std::string> model_hashes;
  FileDigests file_digests;  // a policy's files, hashed once for every expansion of this run
  Plan plan;
  results::RegisterStats registered;
  try {
    plan = expand(cfg, store, run_id, &model_hashes, &file_digests);
    registered = plan.registered;
    if (a.rerun) {
      store.rerun_units(plan.all_keys);
      plan = expand(cfg, store, run_id, &model_hashes, &file_digests);
    } else if (!a.rerun_statuses.empty()) {
      std::vector<std::string> again;
      for (const auto& [key, st] : store.unit_status(plan.all_keys)) {
        if (a.rerun_statuses.count(st.status)) again.push_back(key);
      }
      KVB_LOG_INFO << "--rerun-status " << a.rerun_status << ": " << again.size()
                   << " unit(s) of this matrix run again";
      store.rerun_units(again);
      plan = expand(cfg, store, run_id, &model_hashes, &file_digests);
    }
  } catch (const Error&) {
    // A matrix that does not expand (its task data, a policy's file) ran nothing: the run ends
    // `error` rather than staying `running` until a later --resume calls it crashed.
    retry_while_locked(a.db, "closing the run whose matrix did not expand", 0,
                       [&] { store.finish_run(run_id, results::RunStatus::kError); });
    throw;
  }
  report_registration(registered, a.db);
  refuse_mixed_precision(store, plan.all_keys, a, run_id);
  // Provenance: the digests the unit keys were made from (known only now, after begin_run).
  retry_while_locked(a.db, "recording model hashes", 0,
                     [&] { store.record_model_hashes(run_id, model_hashes); });
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
               << " rank(s) (device " << a.device
               << (comm.size() == 1
                       ? ", " + std::to_string(omp_get_max_threads()) + " OpenMP thread(s)"
                       : std::string())
               << "); database " << a.db;
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
    runner.limit_rss(a.max_rss_gb);
    runner.set_decode_batch(parse_decode_batch(a.decode_batch));
    runner.set_prefix_cache_mib(a.prefix_cache_mib);
    for (int bi : order) {
      retry_while_locked(a.db, "handing out a bundle", 0, [&] {
        store.mark_running(run_id, keys_of(plan.bundles[bi]), 0, process_host());
      });
      write(runner.run_or_fail(plan.bundles[bi]));
    }
  } else {
    // Dynamic scheduling: idle worker groups (their leaders) ask; each gets the next bundle or a
    // stop. Leftover ranks in no group get their stop at the end.
    const FaultInjection faults = FaultInjection::from_env();
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) std::signal(sig, on_stop_signal);
    std::signal(SIGCONT, on_cont_signal);
    bool cont_recorded = false;
    auto check_stop = [&] {
      if (g_cont_signal && !cont_recorded) {
        // Also sent when a suspended job resumes: then the run goes on, and should it die later,
        // its units in flight count a crash as they would without this record (conservative).
        cont_recorded = true;
        try {
          store.record_signal(run_id, SIGCONT);
        } catch (const std::exception& e) {
          KVB_LOG_WARN << "could not record SIGCONT: " << e.what();
        }
      }
      if (g_stop_signal) throw StopSignal{static_cast<int>(g_stop_signal)};
    };
    // Longest first, but each worker is handed the bundles that begin as its recent ones did,
    // so that its prefix store serves them (sweep_affinity.h).
    PrefixAffinity affinity(order, plan.bundle_prefixes);
    // The workers' prefixes, passed between them (sweep_prefix_share.h); rank 0 holds as much as
    // one worker's store.
    const bool share = shares_prefixes(a, layout);
    const int mib = a.prefix_cache_mib >= 0 ? a.prefix_cache_mib : cfg.prefix_cache_mib;
    SharedPrefixes shared(plan.bundle_prefixes, share ? static_cast<size_t>(mib) << 20 : 0);
    // What each busy worker runs, since when, and how many of its prompt's tokens it is
    // expected to prefill (those its own recent prompts or a sent prefix do not hold).
    struct Flight {
      int bundle = 0;
      std::chrono::steady_clock::time_point start;
      int prefill_tokens = 0;
    };
    std::map<int, Flight> running;  // by worker leader
    // Milliseconds per prefilled prompt token, the fewest over finished bundles that prefilled
    // 512+ tokens (0 until one has: a bundle's time is mostly its prefill there; the fewest
    // keeps waiting rare).
    double ms_per_token = 0;
    std::set<int> waiting;  // idle workers held back for a prefix in flight (worth_waiting)
    int handed = 0;
    int active = layout.groups;
    const auto since = [](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t)
          .count();
    };
    // Whether `worker` should wait for a bundle in flight rather than start `bi` now: only at the
    // end (no more bundles left than other workers busy), so that waiting starves nothing.
    auto should_wait = [&](int worker, int bi) {
      if (ms_per_token <= 0 || affinity.left() > running.size()) return false;
      const int model = plan.bundles[bi].model;
      const int now =
          std::max(affinity.shared_blocks(worker, bi), shared.best_blocks(worker, bi, model));
      for (const auto& [w, f] : running) {
        if (w == worker || plan.bundles[f.bundle].model != model) continue;
        const int later = common_blocks(plan.bundle_prefixes[bi], plan.bundle_prefixes[f.bundle]);
        const double remaining = ms_per_token * f.prefill_tokens - since(f.start);
        if (worth_waiting(remaining, ms_per_token, now, later)) return true;
      }
      return false;
    };
    // Hands `worker` its next bundle (with another worker's prefix where one serves it), or its
    // stop when none is left; false when it waits instead.
    auto serve = [&](int worker) {
      if (affinity.left() == 0) {
        comm.send(worker, "stop");
        --active;
        return true;
      }
      const int bi = affinity.peek(worker);
      if (should_wait(worker, bi)) return false;
      affinity.take(worker, bi);
      const WireBundle& b = plan.bundles[bi];
      ++handed;
      retry_while_locked(a.db, "handing out a bundle", 0, [&] {
        store.mark_running(run_id, keys_of(b), worker, "rank" + std::to_string(worker));
      });
      int served = affinity.last_shared_blocks();
      const int offered = shared.best_blocks(worker, bi, b.model);
      if (const std::string* p = shared.pick(worker, bi, b.model, served)) {
        served = std::max(served, offered);
        comm.send(worker, *p);
      }
      comm.send(worker, to_json(b));
      running[worker] = {bi, std::chrono::steady_clock::now(),
                         std::max(0, plan.bundle_tokens[bi] - served * kPrefixBlock)};
      faults.kill_coordinator_if(handed);
      return true;
    };
    try {
      while (active > 0) {
        int source = 0;
        std::string msg = comm.recv_any(&source, check_stop);
        if (is_prefix_message(msg)) {  // a prefix the worker's store kept in its bundle
          try {
            const PrefixMessage pm = parse_prefix_message(msg);
            const workers::PrefixStore::Summary sum = workers::PrefixStore::summarize(pm.body);
            const auto r = running.find(source);
            KVB_CHECK(r != running.end()) << "rank " << source << " runs no bundle";
            shared.add(source, r->second.bundle, pm.model, sum.tokens, std::move(msg));
          } catch (const Error& e) {
            KVB_LOG_WARN << "a prefix from rank " << source << " is not shared: " << e.what();
          }
        } else {
          if (msg != "ready") {
            const std::vector<results::UnitResult> rs = results_from_json(msg);
            write(rs);
            const auto r = running.find(source);
            if (r != running.end()) {
              int64_t reused = 0;
              for (const auto& u : rs) {
                if (u.measurements)
                  reused = std::max<int64_t>(reused, u.measurements->prefill_reused);
              }
              const int64_t tokens = plan.bundle_tokens[r->second.bundle] - reused;
              if (tokens >= 512) {
                const double rate = since(r->second.start) / static_cast<double>(tokens);
                ms_per_token = ms_per_token > 0 ? std::min(ms_per_token, rate) : rate;
              }
            }
          }
          running.erase(source);
          if (!serve(source)) waiting.insert(source);
        }
        // What arrived (a prefix, a finished bundle) may be what a waiting worker waits for.
        for (const int w : std::vector<int>(waiting.begin(), waiting.end())) {
          if (w != source && serve(w)) waiting.erase(w);
        }
        check_stop();
      }
    } catch (const StopSignal& s) {
      // Quickly, before mpirun's SIGKILL: one UPDATE, no retry. Units in flight stay `running`;
      // --resume counts a crash against them (a rank died, or the job was stopped).
      try {
        if (!cont_recorded) store.record_signal(run_id, s.signal);
      } catch (const std::exception& e) {
        KVB_LOG_WARN << "could not record signal " << s.signal << ": " << e.what();
      }
      KVB_LOG_WARN << "stopped by signal " << s.signal
                   << " (mpirun stops the job this way when a rank died); continue with --resume";
      std::signal(s.signal, SIG_DFL);
      std::raise(s.signal);
    }
    for (int r = layout.leader_of(layout.groups); r < comm.size(); ++r) comm.send(r, "stop");
    if (shared.received() > 0) {
      KVB_LOG_INFO << "prefixes shared between workers: " << shared.received() << " received ("
                   << (shared.received_bytes() >> 20) << " MiB), " << shared.sent() << " sent ("
                   << (shared.sent_bytes() >> 20) << " MiB)";
    }
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

}  // namespace kvb::harness
