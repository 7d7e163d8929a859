// The sweep's bundle runner (harness/README.md): one process's model and engine, reused across
// bundles; runs a bundle's units through workers::run_bundle, scores them and turns each into a
// results::UnitResult (failures typed: error, timeout, oom). Used by the one-process sweep and by
// every worker rank.
#pragma once

#include <exception>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "harness/sweep_config.h"
#include "harness/sweep_faults.h"
#include "harness/sweep_wire.h"
#include "results/store.h"
#include "workers/engine/engine.h"
#include "workers/prefix_store.h"
#include "workers/runner.h"

namespace kvb::harness {

// The runner's failure as the units table spells it.
results::UnitStatus unit_status(workers::FailureStatus s);
// Whether the exception is a kvb::Error of kind kUsage.
bool is_usage_error(std::exception_ptr e);

// A bundle ready to run: what its units name is resolved before the run starts (BundleRunner::
// resolve), so that nothing is looked up by name in the middle of it: the task (built once per
// config task, from the options the sweep keys it by; it scores the units and lists the prompts
// of the prefix store) and each unit's policy (its name checked against the registry) with its
// configuration, all but the model's shape, which the loaded model gives (a rank's shard under
// tensor parallelism). The model is the config's entry at wire.model, loaded by that index.
struct ResolvedBundle {
  const WireBundle& wire;
  tasks::Task& task;  // one of the runner's: it lives as long as the runner
  std::vector<policies::PolicyConfig> policies;  // one per wire.units; shape unset
};

// Runs a bundle on this process: loads (and caches) the model, runs every unit, scores. With a
// tensor-parallel group, every rank of the group runs the same bundle on its shard of the model
// (the leader's results are the group's).
class BundleRunner {
 public:
  // device/dtype/gpu: where this process runs the model (--device, --dtype, the GPU index).
  // Builds every task of the config (usage errors name a task that cannot be built).
  BundleRunner(const SweepConfig& cfg, bool share, engine::Device device, engine::DType dtype,
               int gpu, kernels::Communicator* tp = nullptr);

  // --max-rss-gb: a unit during which the memory charged to it exceeds `gib` GiB ends `oom`
  // (workers::UnitMemoryLimit; checked after the prompt and between tokens). 0: no cap. A unit is
  // charged what it would be in a worker that started with its model: this process's resident
  // set less what earlier models left resident (measured when a model is loaded, after the
  // previous model, engine and prefix store were freed and free heap memory was returned to the
  // system: workers::release_free_memory) and less the prefix store (--prefix-cache-mib bounds
  // it). Under a cap, free heap memory is also returned before every bundle, so that what an
  // earlier bundle freed does not count either.
  void limit_rss(double gib) { max_rss_bytes_ = static_cast<size_t>(gib * (1 << 30)); }
  // --decode-batch (parse_decode_batch's value; -1: the config's decode_batch).
  void set_decode_batch(int n) { decode_batch_ = n; }
  // --prefix-cache-mib (-1: the config's prefix_cache_mib): the memory of this process's prefix
  // store (workers/prefix_store.h), which the bundles' shared prefills use on CPU engines.
  void set_prefix_cache_mib(int mib) { prefix_cache_mib_ = mib; }

  // The config's model `index` with its tokenizer, loaded (with its engine and prefix store) if
  // it is not the one loaded now; the previous one is freed first. run() calls it for its
  // bundle's model; `kvbench eval` calls it first, to list the task's samples with the model's
  // tokenizer and check the policy against its shape, and its bundles then reuse the load.
  const workers::LoadedModel& model(int index);

  // The bundle with its task and policies resolved (ResolvedBundle). Throws a usage error for a
  // model or task index outside the config or an unknown policy name. `b` must outlive the
  // result.
  ResolvedBundle resolve(const WireBundle& b);

  // Runs every unit of the bundle and scores it; a unit's failure is its result (typed). Throws
  // what escapes a tensor-parallel group's units (the job must stop) and usage errors.
  std::vector<results::UnitResult> run(const ResolvedBundle& rb);
  std::vector<results::UnitResult> run(const WireBundle& b) { return run(resolve(b)); }

  // resolve() and run(), with a failure outside the units' own runs (loading the model, an
  // exception this code did not expect) recorded on every unit of the bundle, typed, so that the
  // rank goes on with its next bundle and the coordinator gets an answer. Usage errors (a bad config or model,
  // the same for every bundle) and any failure of a tensor-parallel group still propagate: the
  // job stops (cmd_sweep aborts it under mpirun).
  std::vector<results::UnitResult> run_or_fail(const WireBundle& b);

  // Prefixes shared between MPI workers (harness/sweep_prefix_share.h). offer_prefix: another
  // worker's, as rank 0 sent it (prefix_message), for the next bundle: run() imports it into the
  // prefix store once it has loaded that bundle's model, if the message names that model (one
  // that fails PrefixStore::import's checks is logged and dropped; the bundle runs as without).
  // take_kept_prefixes: the prefixes this store kept since the last call, as messages.
  void offer_prefix(std::string message);
  std::vector<std::string> take_kept_prefixes();

 private:
  // Tells the prefix store the shared-prefill tokens of every sample of `task` under `rs`.
  void learn_prompts(tasks::Task& task, const workers::RunSettings& rs);
  // Imports offer_prefix's messages of `model` (the one loaded) into the prefix store; drops all.
  void import_offered(int model);

  const SweepConfig& cfg_;
  // The config's tasks, built once (by index, as WireBundle::task names them).
  std::vector<std::unique_ptr<tasks::Task>> tasks_;
  bool share_;
  engine::Device device_;
  engine::DType dtype_;
  int gpu_ = 0;
  kernels::Communicator* tp_ = nullptr;
  size_t max_rss_bytes_ = 0;
  // The resident set before the first model was loaded (the program's own), and what earlier
  // models left above it when the current one was loaded (RunSettings::rss_not_charged_bytes).
  size_t rss_before_models_ = 0;
  bool rss_measured_ = false;
  size_t rss_left_by_models_ = 0;
  int decode_batch_ = -1;
  int prefix_cache_mib_ = -1;
  // The prefix store of the loaded model, and the (task, question placement) groups whose
  // prompts it knows.
  std::unique_ptr<workers::PrefixStore> prefixes_;
  std::vector<std::string> offered_;  // offer_prefix's messages, imported by the next run()
  std::set<std::pair<int, std::string>> planned_;
  FaultInjection faults_ = FaultInjection::from_env();
  int loaded_model_ = -1;
  workers::LoadedModel lm_;
  std::unique_ptr<engine::Engine> engine_;
};

}  // namespace kvb::harness
