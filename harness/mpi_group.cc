// Worker groups over MPI sub-communicators; MpiTensorComm implements kernels::Communicator on one.
#include "harness/mpi_group.h"

#include <algorithm>
#include <sstream>

#include "common/error.h"

#include "harness/mpi_check.h"

namespace kvb::harness {

WorkerLayout plan_worker_layout(int world_size, int rank, int per_group) {
  KVB_USAGE_CHECK(per_group >= 1) << "--gpus-per-worker must be >= 1, got " << per_group;
  WorkerLayout L;
  L.per_group = per_group;
  const int workers = std::max(0, world_size - 1);
  L.groups = workers / per_group;
  L.leftover = workers % per_group;
  if (rank >= 1 && rank - 1 < L.groups * per_group) {
    L.group = (rank - 1) / per_group;
    L.tp_rank = (rank - 1) % per_group;
    L.leader = L.tp_rank == 0;
  }
  return L;
}

std::string worker_layout_json(int world_size, int per_group, const std::string& device) {
  std::ostringstream o;
  o << "[";
  if (world_size == 1) {
    o << "{\"group\":0,\"ranks\":[0],\"device\":\"" << device << "\"}";
  } else {
    const WorkerLayout L = plan_worker_layout(world_size, 0, per_group);
    for (int g = 0; g < L.groups; ++g) {
      o << (g ? "," : "") << "{\"group\":" << g << ",\"ranks\":[";
      for (int r = 0; r < per_group; ++r) o << (r ? "," : "") << L.leader_of(g) + r;
      o << "],\"device\":\"" << device << "\"}";
    }
  }
  o << "]";
  return o.str();
}

std::string leftover_warning(int world_size, int per_group) {
  const int workers = world_size - 1;
  const int down = 1 + workers / per_group * per_group, up = down + per_group;
  std::ostringstream o;
  o << "with --gpus-per-worker " << per_group << ", " << workers << " worker rank(s) form "
    << workers / per_group << " group(s) and " << workers % per_group
    << " rank(s) stay idle; size -np as 1 + a multiple of " << per_group << " (here -np " << up;
  if (down > 1) o << " or -np " << down;
  o << ")";
  return o.str();
}

#ifdef KVB_WITH_MPI
namespace {

// CPU tensors over one MPI communicator. all_reduce_sum is an MPI_Allgather followed by the sum
// in rank order on every rank (the deterministic order comm.h promises; MPI_Allreduce's order
// is the library's choice), so its wire volume is that of a ring all-gather: (size - 1) x the
// buffer per rank, the same as a ring all-reduce's 2 (size - 1) / size x for size 2.
class MpiTensorComm final : public kernels::Communicator {
 public:
  explicit MpiTensorComm(MPI_Comm comm) : comm_(comm) {
    KVB_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    KVB_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiTensorComm() override { MPI_Comm_free(&comm_); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

 protected:
  void do_all_reduce_sum(float* data, size_t count) override {
    KVB_CHECK(count < (1ull << 31))
        << "all_reduce_sum of " << count << " floats: above MPI's count limit of 2^31 - 1";
    gathered_.resize(count * size_);
    KVB_MPI_CHECK(MPI_Allgather(data, static_cast<int>(count), MPI_FLOAT, gathered_.data(),
                             static_cast<int>(count), MPI_FLOAT, comm_));
    for (size_t i = 0; i < count; ++i) {
      float acc = gathered_[i];
      for (int r = 1; r < size_; ++r) acc += gathered_[r * count + i];
      data[i] = acc;
    }
  }
  void do_all_gather(const void* in, size_t bytes, void* out) override {
    KVB_CHECK(bytes < (1ull << 31))
        << "all_gather of " << bytes << " bytes: above MPI's count limit of 2^31 - 1";
    KVB_MPI_CHECK(MPI_Allgather(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes),
                             MPI_BYTE, comm_));
  }
  void do_broadcast(void* data, size_t bytes, int root) override {
    KVB_CHECK(bytes < (1ull << 31))
        << "broadcast of " << bytes << " bytes: above MPI's count limit of 2^31 - 1";
    KVB_MPI_CHECK(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_));
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<float> gathered_;
};

}  // namespace
#endif

WorkerGroup split_worker_groups(MpiComm& world, const WorkerLayout& L) {
  WorkerGroup g;
  if (world.size() == 1) return g;
#ifdef KVB_WITH_MPI
  MPI_Comm group = MPI_COMM_NULL;
  KVB_MPI_CHECK(
      MPI_Comm_split(MPI_COMM_WORLD, L.group >= 0 ? L.group : MPI_UNDEFINED, world.rank(), &group));
  if (group != MPI_COMM_NULL) g.comm = std::make_unique<MpiTensorComm>(group);
  // GPU index: rank among the group members on the same node (by world rank).
  MPI_Comm members = MPI_COMM_NULL, node = MPI_COMM_NULL;
  KVB_MPI_CHECK(
      MPI_Comm_split(MPI_COMM_WORLD, L.group >= 0 ? 0 : MPI_UNDEFINED, world.rank(), &members));
  if (members != MPI_COMM_NULL) {
    KVB_MPI_CHECK(
        MPI_Comm_split_type(members, MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL, &node));
    KVB_MPI_CHECK(MPI_Comm_rank(node, &g.local_gpu));
    MPI_Comm_free(&node);
    MPI_Comm_free(&members);
  }
#else
  (void)L;
  KVB_FAIL() << "worker groups without MPI";
#endif
  return g;
}

void broadcast_text(kernels::Communicator& group, std::string* text) {
  uint64_t n = text->size();
  group.broadcast(&n, sizeof(n), 0);
  text->resize(n);
  group.broadcast(text->data(), n, 0);
}

}  // namespace kvb::harness
