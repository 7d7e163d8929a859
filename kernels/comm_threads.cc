// ThreadComm: each collective publishes a pointer per rank, meets at a barrier, reads the
// others' data, and meets again before anyone may reuse its buffer.
#include "kernels/comm_threads.h"

#include <cstring>

#include "common/error.h"

namespace kvb::kernels {

ThreadGroup::ThreadGroup(int size) : size_(size), barrier_(size), slots_(size, nullptr) {
  KVB_CHECK(size >= 1) << "thread group of " << size << " ranks";
}

ThreadComm::ThreadComm(ThreadGroup& group, int rank) : group_(group), rank_(rank) {
  KVB_CHECK(rank >= 0 && rank < group.size())
      << "rank " << rank << " outside [0, " << group.size() << ")";
}

void ThreadComm::do_all_reduce_sum(float* data, size_t count) {
  group_.slots_[rank_] = data;
  group_.barrier_.arrive_and_wait();
  sum_.assign(static_cast<const float*>(group_.slots_[0]),
              static_cast<const float*>(group_.slots_[0]) + count);
  for (int r = 1; r < size(); ++r) {
    const float* x = static_cast<const float*>(group_.slots_[r]);
    for (size_t i = 0; i < count; ++i) sum_[i] += x[i];
  }
  group_.barrier_.arrive_and_wait();  // everyone has read every input
  std::memcpy(data, sum_.data(), count * sizeof(float));
}

void ThreadComm::do_all_gather(const void* in, size_t bytes, void* out) {
  group_.slots_[rank_] = in;
  group_.barrier_.arrive_and_wait();
  for (int r = 0; r < size(); ++r) {
    std::memcpy(static_cast<char*>(out) + r * bytes, group_.slots_[r], bytes);
  }
  group_.barrier_.arrive_and_wait();
}

void ThreadComm::do_broadcast(void* data, size_t bytes, int root) {
  if (rank_ == root) group_.slots_[root] = data;
  group_.barrier_.arrive_and_wait();
  if (rank_ != root) std::memcpy(data, group_.slots_[root], bytes);
  group_.barrier_.arrive_and_wait();
}

}  // namespace kvb::kernels
