// A worker rank of `kvbench sweep` (harness/sweep_roles.h): receives bundles, runs them, returns
// the results; the leader of a tensor-parallel group relays for its group.
#include <omp.h>

#include <chrono>
#include <climits>

#include "common/log.h"
#include "harness/bundle_runner.h"
#include "harness/mpi_group.h"
#include "harness/sweep_prefix_share.h"
#include "harness/sweep_roles.h"
#include "harness/sweep_wire.h"
#include "workers/engine/engine_types.h"

namespace kvb::harness {

int parse_decode_batch(const std::string& text) {
  if (text.empty()) return -1;
  if (text == "auto") return 0;
  int n = 0;
  size_t used = 0;
  try {
    n = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KVB_USAGE_CHECK(used == text.size() && n >= 1 && n <= 4096)
      << "--decode-batch must be auto or a whole number in 1..4096, got '" << text << "'";
  return n;
}

bool shares_prefixes(const SweepArgs& a, const WorkerLayout& layout) {
  return a.share_prefixes && a.share_prefill && layout.groups > 1 && a.gpus_per_worker == 1;
}

void apply_config_threads(const SweepArgs& a, const SweepConfig& cfg) {
  if (a.threads <= 0 && cfg.threads > 0) omp_set_num_threads(cfg.threads);
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
  runner.limit_rss(a.max_rss_gb);
  runner.set_decode_batch(parse_decode_batch(a.decode_batch));
  runner.set_prefix_cache_mib(a.prefix_cache_mib);
  const bool share = shares_prefixes(a, layout);
  if (layout.leader) comm.send(0, "ready");
  while (true) {
    std::string msg;
    if (layout.leader) msg = comm.recv(0);
    if (group.comm) broadcast_text(*group.comm, &msg);
    if (msg == "stop") return 0;
    if (is_prefix_message(msg)) {  // another worker's prefix, for the bundle that follows
      runner.offer_prefix(std::move(msg));
      continue;
    }
    const std::vector<results::UnitResult> results = runner.run_or_fail(bundle_from_json(msg));
    if (layout.leader && share) {
      // Before the results: rank 0 then has them when it hands out the next bundle.
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<std::string> kept = runner.take_kept_prefixes();
      const auto t1 = std::chrono::steady_clock::now();
      size_t bytes = 0;
      for (const std::string& m : kept) {
        bytes += m.size();
        if (m.size() <= INT_MAX) {
          comm.send(0, m);
        } else {
          KVB_LOG_WARN << "a prefix of " << (m.size() >> 20)
                       << " MiB is kept for this worker only: one MPI message carries 2 GiB";
        }
      }
      if (!kept.empty()) {
        const auto t2 = std::chrono::steady_clock::now();
        using ms = std::chrono::duration<double, std::milli>;
        KVB_LOG_DEBUG << "prefixes kept in this bundle: " << kept.size() << ", " << (bytes >> 20)
                      << " MiB, written in " << ms(t1 - t0).count() << " ms, sent to rank 0 in "
                      << ms(t2 - t1).count() << " ms";
      }
    }
    if (layout.leader) comm.send(0, to_json(results));
  }
}

}  // namespace kvb::harness
