// The two roles of `kvbench sweep` (cmd_sweep.cc parses the options and picks one per rank):
// rank 0 coordinates and alone writes the database (sweep_coordinator.cc; without mpirun it also
// runs every bundle itself), ranks 1.. run bundles (sweep_worker.cc).
#pragma once

#include <set>
#include <string>

#include "harness/mpi_comm.h"
#include "harness/mpi_group.h"
#include "harness/sweep_config.h"
#include "results/store.h"

namespace kvb::harness {

struct SweepArgs {
  std::string config, db;
  bool resume = false, rerun = false, share_prefill = true, progress = false;
  std::string rerun_status;  // --rerun-status: comma-separated statuses
  std::set<results::UnitStatus> rerun_statuses;
  int threads = 0;
  int limit = 0;  // --limit N: a quick look at the first N samples of each task (0: all)
  int gpus_per_worker = 1;  // tensor-parallel degree of each worker group
  double max_rss_gb = 0;    // --max-rss-gb: per-unit resident-memory check (0: none)
  std::string decode_batch;  // --decode-batch auto|N ("": the config's decode_batch)
  int prefix_cache_mib = -1;  // --prefix-cache-mib (-1: the config's prefix_cache_mib)
  bool share_prefixes = true;  // !--no-prefix-sharing (harness/sweep_prefix_share.h)
  std::string device = "cpu";
  std::string dtype;  // "" : the device's default (engine::resolve_dtype)
  std::string device_label;  // the run's provenance: "cpu", or "cuda: <GPU name> x<count>"
};

// Rank 0. Returns the exit status: 0, or 1 when a unit of this run did not end ok.
int coordinate(const SweepArgs& a, MpiComm& comm, const WorkerLayout& layout);
// Ranks 1..: until the coordinator's stop.
int work(const SweepArgs& a, MpiComm& comm, const WorkerLayout& layout, WorkerGroup& group);
// --decode-batch: "" -> -1 (the config decides), "auto" -> 0, N in 1..4096 -> N; else a usage
// error naming the value.
int parse_decode_batch(const std::string& text);
// Whether the workers of this run pass their stored prefixes through rank 0
// (harness/sweep_prefix_share.h): two or more worker groups of one rank each, and
// --no-prefix-sharing not given. Both ends decide alike from the same arguments.
bool shares_prefixes(const SweepArgs& a, const WorkerLayout& layout);
// The config's `threads` applies when the command line left it at 0.
void apply_config_threads(const SweepArgs& a, const SweepConfig& cfg);

}  // namespace kvb::harness
