// Communicator's bookkeeping (calls, bytes, time) around the implementations' collectives.
#include "kernels/comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/error.h"

namespace kvb::kernels {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
CollectiveStats minus(const CollectiveStats& a, const CollectiveStats& b) {
  return {a.calls - b.calls, a.payload_bytes - b.payload_bytes, a.seconds - b.seconds};
}
}  // namespace

CommStats CommStats::operator-(const CommStats& o) const {
  CommStats d;
  d.all_reduce = minus(all_reduce, o.all_reduce);
  d.all_gather = minus(all_gather, o.all_gather);
  d.broadcast = minus(broadcast, o.broadcast);
  d.wire_bytes = wire_bytes - o.wire_bytes;
  return d;
}

void Communicator::all_reduce_sum(float* data, size_t count) {
  const auto t0 = std::chrono::steady_clock::now();
  if (size() > 1 && count > 0) do_all_reduce_sum(data, count);
  stats_.all_reduce.seconds += seconds_since(t0);
  ++stats_.all_reduce.calls;
  stats_.all_reduce.payload_bytes += count * sizeof(float);
  if (size() > 1) stats_.wire_bytes += wire_all_reduce(count * sizeof(float));
}

void Communicator::all_gather(const void* in, size_t bytes, void* out) {
  KVB_CHECK(bytes == 0 ||
            (static_cast<const char*>(in) + bytes <= static_cast<char*>(out) ||
             static_cast<char*>(out) + bytes * size() <= static_cast<const char*>(in)))
      << "all_gather: input and output overlap";
  const auto t0 = std::chrono::steady_clock::now();
  if (bytes > 0) do_all_gather(in, bytes, out);
  stats_.all_gather.seconds += seconds_since(t0);
  ++stats_.all_gather.calls;
  stats_.all_gather.payload_bytes += bytes;
  if (size() > 1) stats_.wire_bytes += wire_all_gather(bytes);
}

void Communicator::broadcast(void* data, size_t bytes, int root) {
  KVB_CHECK(root >= 0 && root < size())
      << "broadcast root " << root << " outside [0, " << size() << ")";
  const auto t0 = std::chrono::steady_clock::now();
  if (size() > 1 && bytes > 0) do_broadcast(data, bytes, root);
  stats_.broadcast.seconds += seconds_since(t0);
  ++stats_.broadcast.calls;
  if (rank() == root) stats_.broadcast.payload_bytes += bytes;
  if (size() > 1) stats_.wire_bytes += wire_broadcast(bytes);
}

// A ring all-gather sends every part but one's own once more around: (size - 1) x part.
uint64_t Communicator::wire_all_reduce(size_t bytes) const {
  return static_cast<uint64_t>(size() - 1) * bytes;
}
uint64_t Communicator::wire_all_gather(size_t bytes) const {
  return static_cast<uint64_t>(size() - 1) * bytes;
}
// A pipelined (chain) broadcast: each rank but the last forwards the buffer once.
uint64_t Communicator::wire_broadcast(size_t bytes) const {
  return rank() == size() - 1 ? 0 : bytes;
}

void SingleRankComm::do_all_gather(const void* in, size_t bytes, void* out) {
  std::memcpy(out, in, bytes);
}

int all_max(Communicator& comm, int value) {
  if (comm.size() == 1) return value;
  const std::vector<int> all = all_gather_value<int>(comm, value);
  return *std::max_element(all.begin(), all.end());
}

bool any_rank(Communicator& comm, bool flag) {
  if (comm.size() == 1) return flag;
  const std::vector<uint8_t> all = all_gather_value<uint8_t>(comm, flag ? 1 : 0);
  return std::find(all.begin(), all.end(), uint8_t{1}) != all.end();
}

}  // namespace kvb::kernels
