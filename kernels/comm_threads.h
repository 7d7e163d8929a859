// A tensor-parallel group whose ranks are threads of one process (host memory), for tests of
// the tensor-parallel engine and policies without mpirun. Same rank-order reduction as the MPI
// communicator, so results equal a group of MPI ranks bit for bit.
#pragma once

#include <barrier>
#include <memory>
#include <vector>

#include "kernels/comm.h"

namespace kvb::kernels {

// Shared by the threads of one group; create it once, then one ThreadComm per thread.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size);
  int size() const { return size_; }

 private:
  friend class ThreadComm;
  int size_;
  std::barrier<> barrier_;
  std::vector<const void*> slots_;  // what each rank published for the current collective
};

class ThreadComm final : public Communicator {
 public:
  ThreadComm(ThreadGroup& group, int rank);
  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }
  std::string name() const override { return "threads"; }

 protected:
  void do_all_reduce_sum(float* data, size_t count) override;
  void do_all_gather(const void* in, size_t bytes, void* out) override;
  void do_broadcast(void* data, size_t bytes, int root) override;

 private:
  ThreadGroup& group_;
  int rank_;
  std::vector<float> sum_;
};

}  // namespace kvb::kernels
