// `kvbench sweep CONFIG --db FILE`: the options, MPI start-up, thread counts and the choice of role
// per rank (harness/sweep_roles.h). The roles: sweep_coordinator.cc (rank 0: plan, schedule,
// write), sweep_worker.cc (ranks 1..), with sweep_plan.* (matrix expansion) and bundle_runner.*
// (running a bundle) (DESIGN.md "Scheduling", "Results", "Faults").
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <boost/program_options.hpp>
#include <filesystem>
#include <cstdlib>
#include <iostream>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "harness/cli.h"
#include "harness/task_file.h"
#include "harness/mpi_comm.h"
#include "harness/mpi_group.h"
#include "harness/sweep_config.h"
#include "harness/sweep_roles.h"
#include "harness/sweep_tp.h"
#include "results/store.h"
#include "workers/engine/tensor_parallel.h"

namespace po = boost::program_options;

namespace kvb::harness {

namespace {

// --rerun-status "oom,timeout" -> {kOom, kTimeout}; a usage error names a bad status.
std::set<results::UnitStatus> parse_rerun_statuses(const std::string& text) {
  std::set<results::UnitStatus> out;
  // Given empty, it ran nothing again without a word.
  KVB_USAGE_CHECK(!text.empty())
      << "--rerun-status needs at least one status: ok, error, oom, timeout or crashed, "
         "comma-separated";
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
  desc.add_options()("help,h", "print this help")(
      "db", po::value(&a.db),
      "results database (SQLite; created if missing); default out/<config name>.db")(
      "resume", po::bool_switch(&a.resume),
      "continue after a crash: units in flight go back to pending (crashed after 2 crashes)")(
      "rerun", po::bool_switch(&a.rerun), "run finished units of this matrix again")(
      "rerun-status", po::value(&a.rerun_status),
      "run again only the units of this matrix with these statuses, comma-separated: ok, error, "
      "oom, timeout, crashed (e.g. --rerun-status oom,timeout after freeing memory)")(
      "no-share-prefill", po::bool_switch(), "run every unit's own prefill (for comparisons)")(
      "progress", po::bool_switch(&a.progress),
      "progress lines even when stderr is not a terminal")(
      "limit", po::value(&a.limit)->default_value(0),
      "a quick look: the first N samples of each task (0: all). The units are the full run's "
      "own (the task's options do not change), so a later run without --limit runs only the "
      "rest")(
      "threads", po::value(&a.threads)->default_value(0),
      "OpenMP threads per worker (0: OMP_NUM_THREADS when set, else cores / ranks on this node)")(
      "gpus-per-worker", po::value(&a.gpus_per_worker)->default_value(1),
      "ranks (GPUs) per worker group: each group runs one model split over its ranks (tensor "
      "parallelism: heads and MLP columns); -np must be 1 + a multiple of it")(
      "device", po::value(&a.device)->default_value("cpu"),
      "where workers run the model: cpu, or cuda (one GPU per worker rank, by its index among "
      "the node's workers; builds with CUDA only; tensor-parallel groups stay on cpu)")(
      "dtype", po::value(&a.dtype)->notifier([](const std::string& s) {
        engine::parse_dtype(s);  // given empty, it would mean the device's default
      }),
      "f32, bf16 or native (default: the config's dtype:, else the device's); cuda: weights, "
      "GEMM inputs and KV cache (default bf16); cpu: bf16 weights only, f32 arithmetic and cache "
      "(default f32, the reference); cpu native: a GGUF model's linear layers in the file's own "
      "quantized blocks with 8-bit activations")(
      "max-rss-gb", po::value(&a.max_rss_gb)->default_value(0),
      "a unit whose memory is above this many GiB ends oom and the worker goes on. A unit's "
      "memory: its worker process's resident set (the program, the model's weights, the "
      "bundle's caches) less what earlier models left resident and less the prefix store "
      "(bounded by --prefix-cache-mib), i.e. what it would hold in a worker that started with "
      "its model; checked after the prompt and between tokens, so not a hard cap (use ulimit "
      "-v / prlimit --as for that); 0: none")(
      "decode-batch", po::value(&a.decode_batch),
      "how many generation units of a bundle decode together: auto (all of them) or N; 1 runs "
      "each unit alone (latency measurements); default: the config's decode_batch, else 1. "
      "Tokens and scores are the same bits; decode times are the batch's (measurements."
      "decode_batch records the size)")(
      "prefix-cache-mib", po::value(&a.prefix_cache_mib),
      "memory (MiB) each CPU worker may keep for prefix reuse: a bundle's shared prefill starts "
      "from the K/V rows and statistics of an earlier prompt's identical first tokens (NIAH "
      "depths of one haystack); the same bits, less prefill time (measurements.prefill_reused "
      "counts the tokens; the store is not charged to units under --max-rss-gb); 0: off; "
      "default: the config's prefix_cache_mib, else 1024")(
      "no-prefix-sharing", po::bool_switch(),
      "under mpirun, workers keep their prefixes to themselves. By default a worker sends rank "
      "0 each prefix its store keeps, and rank 0 (holding at most --prefix-cache-mib of them) "
      "sends one to a worker before a bundle whose prompt it begins better than that worker's "
      "own recent prompts do: the same bits, fewer tokens prefilled cold, at the cost of a copy "
      "per prefix (a 4K-token SmolLM2 prefix: 188 MB) and rank 0's memory")(
      "include-path", po::value<std::vector<std::string>>()->composing(),
      "a folder of task definitions (YAML) found by name, searched before KVBENCH_TASK_PATH and "
      "the working directory's configs/tasks (repeatable; also include_path: in the config)")(
      "config", po::value(&a.config), "the YAML matrix (positional)");
  po::positional_options_description pos;
  pos.add("config", 1);
  po::variables_map vm;
  if (!parse_command_line(args, desc, &pos, "sweep", &vm)) return 0;
  set_task_include_paths(vm.count("include-path")
                             ? vm["include-path"].as<std::vector<std::string>>()
                             : std::vector<std::string>{});
  a.share_prefill = !vm["no-share-prefill"].as<bool>();
  a.share_prefixes = !vm["no-prefix-sharing"].as<bool>();
  // Given empty, --db meant the default out/<config>.db.
  KVB_USAGE_CHECK(!vm.count("db") || !a.db.empty())
      << "--db needs a file name (without --db, results go to out/<config name>.db)";
  if (vm.count("rerun-status")) a.rerun_statuses = parse_rerun_statuses(a.rerun_status);
  KVB_USAGE_CHECK(!(a.rerun && !a.rerun_statuses.empty()))
      << "--rerun runs every finished unit again; --rerun-status " << a.rerun_status
      << " only those with a status: give one of them";
  // Together, --resume marked the units in flight during two crashes `crashed` (so that they
  // cannot crash the sweep again) and --rerun then cleared their crash counts and ran them.
  KVB_USAGE_CHECK(!(a.resume && a.rerun))
      << "--resume continues a run that did not finish and skips the units that were in flight "
         "when it crashed twice; --rerun would clear their crash counts and run them again: give "
         "one of them. To run the matrix again after a crash: --resume --rerun-status "
         "ok,error,oom,timeout (add crashed to retry the units that crashed it)";
  const engine::Device device = engine::parse_device(a.device);
  // The config's `dtype:` where --dtype is not given (its errors name the file and line).
  if (a.dtype.empty() && !a.config.empty()) a.dtype = load_sweep_config(a.config).dtype;
  engine::resolve_dtype(device, a.dtype);  // a bad --dtype fails before MPI
  KVB_USAGE_CHECK(device == engine::Device::kCpu || a.gpus_per_worker == 1)
      << "--device cuda with --gpus-per-worker " << a.gpus_per_worker
      << ": tensor-parallel groups run on the CPU engine only (NCCL groups of CUDA engines are "
         "future work); use --gpus-per-worker 1 or --device cpu";
  KVB_USAGE_CHECK(a.gpus_per_worker >= 1)
      << "--gpus-per-worker must be >= 1, got " << a.gpus_per_worker;
  KVB_USAGE_CHECK(a.gpus_per_worker == 1 ||
                  engine::resolve_dtype(device, a.dtype) != engine::DType::kNative)
      << "--dtype native runs a model on one rank; tensor-parallel groups (--gpus-per-worker "
      << a.gpus_per_worker << ") split f32 or bf16 weights: use --dtype f32 or bf16";
  parse_decode_batch(a.decode_batch);  // a bad value fails before MPI
  KVB_USAGE_CHECK(a.limit >= 0) << "--limit must be a number of samples >= 0 (0: all), got "
                                << a.limit;
  KVB_USAGE_CHECK(vm.count("prefix-cache-mib") == 0 ||
                  (a.prefix_cache_mib >= 0 && a.prefix_cache_mib <= 1 << 20))
      << "--prefix-cache-mib must be a number of MiB in [0, 1048576] (0: off), got "
      << a.prefix_cache_mib;
  KVB_USAGE_CHECK(std::isfinite(a.max_rss_gb) && a.max_rss_gb >= 0 && a.max_rss_gb <= 1 << 20)
      << "--max-rss-gb must be a number of GiB in [0, 1048576] (0: no cap), got " << a.max_rss_gb;
  MpiComm comm = MpiComm::init_if_launched();
  set_process_identity(comm.rank(), comm.size());
  // cuda: "this build has no CUDA" everywhere; "no GPU visible" where this process runs units
  // (one process), else on each worker when it binds its GPU.
  const bool one_process = comm.size() == 1;
  const std::string cuda_label =
      device == engine::Device::kCuda ? engine::cuda_device_label(/*require_device=*/one_process)
                                      : "";
  a.device_label =
      engine::run_device_label(device, engine::resolve_dtype(device, a.dtype), cuda_label);
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
  // OMP_NUM_THREADS, when set, is the user's (or the batch system's: scripts/sbatch.sh) choice.
  const char* omp_env = std::getenv("OMP_NUM_THREADS");
  if (threads <= 0 && omp_env && *omp_env) threads = omp_get_max_threads();
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
    const bool default_db = a.db.empty();
    // out/<config stem>.db, as scripts/quickstart.sh names its database.
    if (default_db) a.db = "out/" + std::filesystem::path(a.config).stem().string() + ".db";
    if (comm.rank() == 0) {
      // The database's folder is created, as `report --out` creates its own (out/smoke.db on a
      // fresh clone, where out/ does not exist yet).
      const std::filesystem::path folder = std::filesystem::path(a.db).parent_path();
      std::error_code ec;
      if (!folder.empty()) std::filesystem::create_directories(folder, ec);
      KVB_USAGE_CHECK(!ec) << "cannot create the folder " << folder << " of the results database "
                           << a.db << ": " << ec.message() << " (pass another --db FILE)";
      if (default_db) KVB_LOG_INFO << "no --db given: results go to " << a.db;
    }
    return comm.rank() == 0 ? coordinate(a, comm, layout) : work(a, comm, layout, group);
  } catch (const Error& e) {
    if (comm.size() > 1) {
      std::cerr << "kvbench sweep: error: " << e.what() << "\n";
      if (!e.origin().empty()) {
        KVB_LOG_DEBUG << "kvbench sweep: raised at " << e.origin();
      }
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
