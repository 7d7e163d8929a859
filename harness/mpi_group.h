// The sweep's world split for tensor-parallel workers (issue "Multi-GPU workers"; DESIGN.md
// "Scheduling"): rank 0 stays the coordinator; worker ranks 1.. form consecutive groups of
// --gpus-per-worker ranks (ranks 1..N, N+1..2N, ...). Each group runs one model split over its
// ranks; its first rank, the leader, talks to the coordinator and broadcasts every bundle to the
// group; results go back from the leader only. Ranks left over after the last full group take no
// part (they wait for the coordinator's stop, warned about at start).
#pragma once

#include <memory>
#include <string>

#include "harness/mpi_comm.h"
#include "kernels/comm.h"

namespace kvb::harness {

struct WorkerLayout {
  int per_group = 1;    // ranks (GPUs) per worker group
  int groups = 0;       // full worker groups
  int leftover = 0;     // worker ranks in no group
  int group = -1;       // this rank's group; -1: the coordinator or a leftover rank
  int tp_rank = 0;      // index in the group
  bool leader = false;  // tp_rank 0 of a group
  int leader_of(int g) const { return 1 + g * per_group; }
};

// Pure arithmetic of the split for `world_size` ranks (>= 2); per_group >= 1 (usage error).
WorkerLayout plan_worker_layout(int world_size, int rank, int per_group);

// The run's provenance of the layout (RunInfo::devices_json): one object per worker group with
// its world ranks and device, e.g. [{"group":0,"ranks":[1,2],"device":"cpu"}].
std::string worker_layout_json(int world_size, int per_group, const std::string& device);

// The warning a leftover rank prints (and the coordinator once): names -np values that fit.
std::string leftover_warning(int world_size, int per_group);

// A group's communicator and where its rank would run.
struct WorkerGroup {
  std::unique_ptr<kernels::Communicator> comm;  // null for the coordinator and leftover ranks
  // Node-local index of this rank among the group ranks on its node: the GPU it binds to once
  // the CUDA engine runs (device = local_gpu); -1 outside a group.
  int local_gpu = -1;
};

// Collective over MPI_COMM_WORLD (every rank calls it, the coordinator included): splits the
// groups (MPI_Comm_split, color = group) and computes local_gpu. A single-rank world gets no
// group. The communicator carries CPU tensors over MPI (MpiTensorComm in mpi_group.cc).
WorkerGroup split_worker_groups(MpiComm& world, const WorkerLayout& layout);

// Leader's `text` (root 0 of the group) to every rank of the group.
void broadcast_text(kernels::Communicator& group, std::string* text);

}  // namespace kvb::harness
