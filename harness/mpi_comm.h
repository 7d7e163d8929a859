// The sweep's control channel: MPI point-to-point text messages between rank 0 and the workers
// (DESIGN.md: MPI carries control messages). Without mpirun (or in a build without MPI) the
// communicator has one rank and the sweep runs in this process.
#pragma once

#include <functional>
#include <string>

namespace kvb::harness {

class MpiComm {
 public:
  // Initialises MPI when this process was started by mpirun/srun (their environment variables
  // are present); otherwise returns a single-rank communicator. A build without MPI started
  // under mpirun is an error that says so.
  static MpiComm init_if_launched();
  MpiComm(MpiComm&& other) noexcept;
  ~MpiComm();  // MPI_Finalize when it initialised MPI

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_size() const { return local_size_; }  // ranks on this node
  // This rank's node-local index among the WORKER ranks of its node (rank 0, the coordinator,
  // does not count where it shares the node): the GPU a `--device cuda` worker binds to.
  int local_worker_index() const { return local_worker_; }
  void send(int dest, const std::string& msg);
  // Polls with a short sleep while nothing has arrived (no busy wait).
  std::string recv(int source);
  // `while_waiting` (optional) runs between polls, about every millisecond; what it throws
  // propagates (the coordinator stops on a termination signal there).
  std::string recv_any(int* source, const std::function<void()>& while_waiting = {});
  [[noreturn]] void abort(int code);

 private:
  MpiComm() = default;
  bool initialized_ = false;
  int rank_ = 0, size_ = 1, local_size_ = 1, local_worker_ = 0;
};

}  // namespace kvb::harness
