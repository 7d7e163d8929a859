// Keep-set dumps and the tensor-parallel traffic line.
#include "harness/sweep_tp.h"

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "common/error.h"

namespace kvb::harness {

void dump_keep_set(const std::string& dir, const std::string& unit_key, int tp_rank,
                   const kernels::KvCache& cache, const policies::Policy& policy) {
  const std::string path = dir + "/" + unit_key + ".tp" + std::to_string(tp_rank);
  std::ofstream out(path);
  KVB_CHECK(out.good()) << "KVB_DUMP_KEEPSETS: cannot write " << path;
  kernels::KvCache& c = const_cast<kernels::KvCache&>(cache);  // layer() has no const overload
  for (int l = 0; l < cache.shape().num_layers; ++l) {
    const kernels::LayerKvView v = c.layer(l);
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      out << l << " " << policy.global_head(h) << ":";
      for (int s = 0; s < cache.length(l, h); ++s) out << " " << v.position(h)[s];
      out << "\n";
    }
  }
  KVB_CHECK(out.good()) << "KVB_DUMP_KEEPSETS: cannot write " << path;
}

std::string tp_traffic_line(const std::string& unit_key, const workers::UnitMeasurements& m) {
  const kernels::CommStats& d = m.tp_decode_comm;
  const kernels::CommStats& p = m.tp_prefill_comm;
  const double steps = std::max(1, m.tp_decode_steps);
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << "tp unit " << unit_key.substr(0, 12) << ": prompt "
    << p.all_reduce.calls << " all-reduces + " << p.all_gather.calls << " all-gathers, "
    << p.all_reduce.payload_bytes + p.all_gather.payload_bytes << " B payload, " << p.wire_bytes
    << " B sent; decode " << m.tp_decode_steps << " steps, per step " << d.all_reduce.calls / steps
    << " all-reduces + " << d.all_gather.calls / steps << " all-gathers, "
    << (d.all_reduce.payload_bytes + d.all_gather.payload_bytes) / steps << " B payload, "
    << d.wire_bytes / steps << " B sent; all-reduce " << std::setprecision(3)
    << d.all_reduce.seconds * 1e3 / steps << " ms of " << m.decode_ms / steps << " ms per step ("
    << std::setprecision(1)
    << (m.decode_ms > 0 ? 100.0 * d.all_reduce.seconds * 1e3 / m.decode_ms : 0.0) << "%)";
  return o.str();
}

}  // namespace kvb::harness
