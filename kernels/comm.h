// The tensor-parallel communicator (DESIGN.md "Scheduling"; issue "Multi-GPU workers"): the
// collectives a tensor-parallel group needs, behind one interface so that the same engine and
// policy code runs on CPU ranks over MPI (CI) and on GPUs over NCCL (production).
//
// Implementations: SingleRankComm (below; size 1, every collective is a copy), ThreadComm
// (kernels/comm_threads.h; ranks are threads of one process, for unit tests), MpiTensorComm
// (harness/mpi_group.h; CPU tensors over an MPI sub-communicator) and NcclComm
// (kernels/nccl/nccl_comm.h, only with KVB_HAVE_NCCL; device pointers).
//
// Determinism: all_reduce_sum adds the ranks' buffers in rank order, ((x0 + x1) + x2) + ...,
// element by element, on every rank, so every rank of a group gets the same bits and a run is
// reproducible. (The sum differs in the last bits from a single device's, whose matmul adds the
// same products in another order.) Every implementation must keep that order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvb::kernels {

// What one rank handed to one kind of collective: calls, payload bytes (its own contribution:
// all_reduce: count * 4; all_gather: its part; broadcast: the buffer, counted on the root only)
// and wall time spent inside the call (waiting for slower ranks included).
struct CollectiveStats {
  uint64_t calls = 0;
  uint64_t payload_bytes = 0;
  double seconds = 0;
};

struct CommStats {
  CollectiveStats all_reduce, all_gather, broadcast;
  // Bytes this rank sent on the wire, as the implementation's algorithm sends them (MPI here:
  // all_reduce and all_gather as ring all-gathers, (size - 1) x payload; see each class).
  uint64_t wire_bytes = 0;
  CommStats operator-(const CommStats& o) const;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "single", "threads", "mpi", "nccl"

  // In place: data[i] = sum over ranks r (in rank order) of rank r's data[i]. Host memory for
  // CPU communicators, device memory for NCCL.
  void all_reduce_sum(float* data, size_t count);
  // Every rank contributes `bytes` from `in`; `out` receives size() * bytes, rank r's part at
  // r * bytes (in and out must not overlap).
  void all_gather(const void* in, size_t bytes, void* out);
  // root's `bytes` at data are copied into data on every rank.
  void broadcast(void* data, size_t bytes, int root);

  const CommStats& stats() const { return stats_; }

 protected:
  virtual void do_all_reduce_sum(float* data, size_t count) = 0;
  virtual void do_all_gather(const void* in, size_t bytes, void* out) = 0;
  virtual void do_broadcast(void* data, size_t bytes, int root) = 0;
  // Wire bytes of one call of each kind (the algorithm's, per rank); default: ring all-gather.
  virtual uint64_t wire_all_reduce(size_t bytes) const;
  virtual uint64_t wire_all_gather(size_t bytes) const;
  virtual uint64_t wire_broadcast(size_t bytes) const;

 private:
  CommStats stats_;
};

// One rank: collectives are copies. Used when a worker runs the whole model.
class SingleRankComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single"; }

 protected:
  void do_all_reduce_sum(float*, size_t) override {}
  void do_all_gather(const void* in, size_t bytes, void* out) override;
  void do_broadcast(void*, size_t, int) override {}
};

// Helpers built on the collectives (host memory).
// Gathers one value per rank, in rank order.
template <typename T>
std::vector<T> all_gather_value(Communicator& comm, const T& value) {
  std::vector<T> out(comm.size());
  comm.all_gather(&value, sizeof(T), out.data());
  return out;
}
// Gathers a vector per rank (lengths may differ): out[r] = rank r's values.
template <typename T>
std::vector<std::vector<T>> all_gather_vectors(Communicator& comm, const std::vector<T>& values) {
  const std::vector<uint64_t> n = all_gather_value<uint64_t>(comm, values.size());
  uint64_t most = 0;
  for (uint64_t x : n) most = x > most ? x : most;
  std::vector<T> padded(most), all(most * comm.size());
  for (size_t i = 0; i < values.size(); ++i) padded[i] = values[i];
  if (most > 0) comm.all_gather(padded.data(), most * sizeof(T), all.data());
  std::vector<std::vector<T>> out(comm.size());
  for (int r = 0; r < comm.size(); ++r) {
    out[r].assign(all.begin() + r * most, all.begin() + r * most + n[r]);
  }
  return out;
}
// The largest value over ranks.
int all_max(Communicator& comm, int value);
// Whether any rank passed true.
bool any_rank(Communicator& comm, bool flag);

}  // namespace kvb::kernels
