// MpiComm over MPI_Send/MPI_Recv (two messages: length, then bytes), or a single rank.
#include "harness/mpi_comm.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "common/error.h"
#include "harness/mpi_check.h"

namespace kvb::harness {

namespace {
bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS",
                        "SLURM_STEP_NUM_TASKS_MPI"}) {
    if (std::getenv(v)) return true;
  }
  return false;
}
}  // namespace

MpiComm::MpiComm(MpiComm&& o) noexcept
    : initialized_(o.initialized_),
      rank_(o.rank_),
      size_(o.size_),
      local_size_(o.local_size_),
      local_worker_(o.local_worker_) {
  o.initialized_ = false;
}

MpiComm MpiComm::init_if_launched() {
  MpiComm c;
  if (!launched_by_mpi()) return c;
#ifdef KVB_WITH_MPI
  KVB_MPI_CHECK(MPI_Init(nullptr, nullptr));
  c.initialized_ = true;
  KVB_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &c.rank_));
  KVB_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &c.size_));
  MPI_Comm local;
  KVB_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c.rank_, MPI_INFO_NULL,
                                    &local));
  KVB_MPI_CHECK(MPI_Comm_size(local, &c.local_size_));
  // Ranks of a node are ordered by world rank (the split's key); the coordinator is local rank 0
  // of its node, where workers then start at local rank 1.
  int local_rank = 0, lowest = 0;
  KVB_MPI_CHECK(MPI_Comm_rank(local, &local_rank));
  KVB_MPI_CHECK(MPI_Allreduce(&c.rank_, &lowest, 1, MPI_INT, MPI_MIN, local));
  c.local_worker_ = std::max(0, local_rank - (lowest == 0 ? 1 : 0));
  MPI_Comm_free(&local);
#else
  const char* n = std::getenv("OMPI_COMM_WORLD_SIZE");
  KVB_USAGE_CHECK(!n || std::string(n) == "1")
      << "this kvbench was built without MPI (KVBENCH_MPI=OFF or no MPI found) but was started "
         "under mpirun with several ranks; rebuild with libopenmpi-dev or run without mpirun";
#endif
  return c;
}

MpiComm::~MpiComm() {
#ifdef KVB_WITH_MPI
  if (initialized_) MPI_Finalize();
#endif
}

void MpiComm::send(int dest, const std::string& msg) {
#ifdef KVB_WITH_MPI
  KVB_CHECK(size_ > 1) << "send on a single-rank communicator";
  const unsigned long long n = msg.size();
  KVB_CHECK(n <= static_cast<unsigned long long>(INT_MAX))
      << "a message of " << n << " bytes to rank " << dest << ": more than one MPI send carries";
  KVB_MPI_CHECK(MPI_Send(&n, 1, MPI_UNSIGNED_LONG_LONG, dest, 1, MPI_COMM_WORLD));
  KVB_MPI_CHECK(MPI_Send(msg.data(), static_cast<int>(n), MPI_CHAR, dest, 2, MPI_COMM_WORLD));
#else
  (void)dest;
  (void)msg;
  KVB_FAIL() << "send without MPI";
#endif
}

#ifdef KVB_WITH_MPI
namespace {
// The next message from `source` (MPI_ANY_SOURCE: any rank; *from says which). Waiting ranks
// poll with a short sleep instead of MPI_Recv, whose busy polling would take a core from the
// workers on the node: rank 0 waits most of the time, a worker between bundles and, at the end
// of a sweep, for another worker's bundle (sweep_prefix_share.h: worth_waiting).
std::string receive(int source, int* from, const std::function<void()>& while_waiting) {
  MPI_Status st;
  for (int flag = 0;;) {
    KVB_MPI_CHECK(MPI_Iprobe(source, 1, MPI_COMM_WORLD, &flag, &st));
    if (flag) break;
    if (while_waiting) while_waiting();
    usleep(1000);
  }
  *from = st.MPI_SOURCE;
  unsigned long long n = 0;
  KVB_MPI_CHECK(MPI_Recv(&n, 1, MPI_UNSIGNED_LONG_LONG, *from, 1, MPI_COMM_WORLD, &st));
  KVB_CHECK(n < (1ull << 31))
      << "message of " << n << " bytes from rank " << *from
      << ": above MPI's count limit of 2^31 - 1 (a worker of another kvbench?)";
  std::string msg(n, '\0');
  KVB_MPI_CHECK(MPI_Recv(msg.data(), static_cast<int>(n), MPI_CHAR, *from, 2, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE));
  return msg;
}
}  // namespace
#endif

std::string MpiComm::recv(int source) {
#ifdef KVB_WITH_MPI
  int from = 0;
  return receive(source, &from, {});
#else
  (void)source;
  KVB_FAIL() << "recv without MPI";
#endif
}

std::string MpiComm::recv_any(int* source, const std::function<void()>& while_waiting) {
#ifdef KVB_WITH_MPI
  return receive(MPI_ANY_SOURCE, source, while_waiting);
#else
  (void)source;
  (void)while_waiting;
  KVB_FAIL() << "recv without MPI";
#endif
}

void MpiComm::abort(int code) {
#ifdef KVB_WITH_MPI
  if (initialized_) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::exit(code);
}

}  // namespace kvb::harness
