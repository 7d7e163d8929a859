// The sweep's world split into tensor-parallel worker groups (harness/mpi_group.h): consecutive
// groups from rank 1, leftover ranks, the warning that sizes -np, the provenance JSON, and the
// communicator counters every implementation shares (kernels/comm.h).
#include <gtest/gtest.h>

#include <thread>

#include "common/error.h"
#include "harness/mpi_group.h"
#include "kernels/comm_threads.h"

namespace kvb::harness {
namespace {

TEST(WorkerLayout, ConsecutiveGroupsFromRankOne) {
  // -np 4 --gpus-per-worker 2: ranks 1, 2 form group 0; rank 3 is left over.
  const WorkerLayout r0 = plan_worker_layout(4, 0, 2);
  EXPECT_EQ(r0.groups, 1);
  EXPECT_EQ(r0.leftover, 1);
  EXPECT_EQ(r0.group, -1);  // the coordinator
  const WorkerLayout r1 = plan_worker_layout(4, 1, 2), r2 = plan_worker_layout(4, 2, 2);
  EXPECT_EQ(r1.group, 0);
  EXPECT_TRUE(r1.leader);
  EXPECT_EQ(r2.group, 0);
  EXPECT_EQ(r2.tp_rank, 1);
  EXPECT_FALSE(r2.leader);
  EXPECT_EQ(plan_worker_layout(4, 3, 2).group, -1);
  // 17 ranks, 8 per group (scripts/sbatch_tp.sh without the idle rank): leaders 1 and 9.
  const WorkerLayout big = plan_worker_layout(17, 12, 8);
  EXPECT_EQ(big.groups, 2);
  EXPECT_EQ(big.leftover, 0);
  EXPECT_EQ(big.group, 1);
  EXPECT_EQ(big.tp_rank, 3);
  EXPECT_EQ(big.leader_of(1), 9);
  EXPECT_THROW(plan_worker_layout(4, 1, 0), Error);
}

TEST(WorkerLayout, LeftoverWarningNamesNpThatFits) {
  EXPECT_EQ(leftover_warning(4, 2),
            "with --gpus-per-worker 2, 3 worker rank(s) form 1 group(s) and 1 rank(s) stay idle; "
            "size -np as 1 + a multiple of 2 (here -np 5 or -np 3)");
  EXPECT_NE(leftover_warning(3, 4).find("(here -np 5)"), std::string::npos);
}

TEST(WorkerLayout, ProvenanceListsGroups) {
  EXPECT_EQ(
      worker_layout_json(5, 2, "cpu"),
      R"([{"group":0,"ranks":[1,2],"device":"cpu"},{"group":1,"ranks":[3,4],"device":"cpu"}])");
  EXPECT_EQ(worker_layout_json(1, 1, "cpu"), R"([{"group":0,"ranks":[0],"device":"cpu"}])");
}

TEST(Communicator, CountsCallsPayloadAndRingWireBytes) {
  kernels::ThreadGroup group(3);
  std::vector<kernels::CommStats> stats(3);
  std::vector<std::thread> t;
  for (int r = 0; r < 3; ++r) {
    t.emplace_back([&, r] {
      kernels::ThreadComm c(group, r);
      std::vector<float> x(10, 1.0f);
      c.all_reduce_sum(x.data(), x.size());
      EXPECT_EQ(x[9], 3.0f);
      const std::vector<int> all = kernels::all_gather_value(c, r * 10);
      EXPECT_EQ(all, (std::vector<int>{0, 10, 20}));
      const auto vectors = kernels::all_gather_vectors(c, std::vector<int>(r, r));
      EXPECT_EQ(vectors[2], (std::vector<int>{2, 2}));
      EXPECT_TRUE(vectors[0].empty());
      EXPECT_EQ(kernels::all_max(c, 5 - r), 5);
      EXPECT_TRUE(kernels::any_rank(c, r == 2));
      stats[r] = c.stats();
    });
  }
  for (auto& th : t) th.join();
  EXPECT_EQ(stats[0].all_reduce.calls, 1u);
  EXPECT_EQ(stats[0].all_reduce.payload_bytes, 40u);
  // Ring all-gather: (size - 1) x the part per collective; all_gather_vectors makes two calls.
  const uint64_t gathers = 4 + 8 + 2 * 4 + 4 + 1;  // value, sizes, data (2 ints), max, flag
  EXPECT_EQ(stats[0].all_gather.calls, 5u);
  EXPECT_EQ(stats[0].all_gather.payload_bytes, gathers);
  EXPECT_EQ(stats[0].wire_bytes, 2 * (40 + gathers));
}

}  // namespace
}  // namespace kvb::harness
