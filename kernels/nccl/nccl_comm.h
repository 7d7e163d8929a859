// The NCCL communicator (kernels/comm.h) for tensor-parallel groups on GPUs: one rank per GPU,
// tensors in device memory, NCCL carries every group collective; MPI (the bootstrap
// communicator) only carries the NCCL unique id and, in the sweep, the control messages
// (bundles to the group leader and its broadcast, results back). Built only with KVB_HAVE_NCCL
// (CMake target kvb_nccl; compiled as C++ against the CUDA runtime, cuBLAS and NCCL headers).
//
// all_reduce_sum keeps comm.h's rank-order contract: ncclAllGather of the ranks' buffers, then
// data = x0, data += x1, data += x2, ... with cublasSaxpy (alpha = 1: one rounding per add, the
// same bits as the CPU communicators). Its wire volume is a ring all-gather's, (size - 1) x the
// buffer per rank; ncclAllReduce (ring: 2 (size - 1) / size x) sends less at size > 2 but adds
// in an order of NCCL's choosing, so results would no longer equal the CPU path's bit for bit.
#pragma once

#include <memory>

#include "kernels/comm.h"

namespace kvb::kernels {

class NcclComm final : public Communicator {
 public:
  // Collective over `bootstrap` (every rank calls it): binds this thread to `device`, rank 0
  // creates the NCCL unique id and broadcasts it, every rank joins with bootstrap's rank and
  // size. Throws kvb::Error naming the failing CUDA/NCCL call.
  NcclComm(Communicator& bootstrap, int device);
  ~NcclComm() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  int device() const { return device_; }

  // The number of CUDA devices visible to this process (0 when there is no driver or device).
  static int visible_devices();

 protected:
  // Device pointers, or host pointers (staged through device memory: policies that decide on
  // the host, measurements and the time-limit flag use the same group); each call returns after
  // its work on the communicator's stream finished.
  void do_all_reduce_sum(float* data, size_t count) override;
  void do_all_gather(const void* in, size_t bytes, void* out) override;
  void do_broadcast(void* data, size_t bytes, int root) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1, device_ = 0;
};

}  // namespace kvb::kernels
