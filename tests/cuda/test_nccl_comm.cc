// The NCCL communicator (kernels/nccl/nccl_comm.h) against the CPU one: one thread per visible
// GPU (up to 4), bootstrapped by a ThreadComm, must give the same bits as the ThreadComm for
// all_reduce_sum (rank order), all_gather and broadcast. Skips without a GPU; the collectives
// themselves need at least 2 GPUs (a group of 1 copies nothing). Compiles to a skip where the
// build has no NCCL.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "kernels/comm_threads.h"
#ifdef KVB_WITH_NCCL
#include <cuda_runtime.h>

#include "kernels/nccl/nccl_comm.h"
#endif

namespace kvb::kernels {
namespace {

#ifdef KVB_WITH_NCCL
// Rank r's input: values whose f32 sum depends on the order of the additions.
std::vector<float> input(int r, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = (r % 2 ? -1.0f : 1.0f) * 1e7f * static_cast<float>(i % 5 + 1) + 0.37f * (r + 1);
  }
  return v;
}

TEST(NcclComm, CollectivesEqualTheCpuCommunicatorBitForBit) {
  const int gpus = NcclComm::visible_devices();
  if (gpus < 2) GTEST_SKIP() << gpus << " GPU(s) visible; the NCCL collectives need 2 or more";
  const int size = std::min(gpus, 4);
  const size_t n = 4099;
  ThreadGroup boot(size), cpu(size);
  std::vector<std::vector<float>> want(size), got(size), gathered(size), bcast(size);
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        ThreadComm bootstrap(boot, r), reference(cpu, r);
        want[r] = input(r, n);
        reference.all_reduce_sum(want[r].data(), n);
        NcclComm nccl(bootstrap, r);
        float* d = nullptr;
        float* g = nullptr;
        cudaMalloc(&d, n * sizeof(float));
        cudaMalloc(&g, n * size * sizeof(float));
        const std::vector<float> x = input(r, n);
        cudaMemcpy(d, x.data(), n * sizeof(float), cudaMemcpyHostToDevice);
        nccl.all_gather(d, n * sizeof(float), g);
        gathered[r].resize(n * size);
        cudaMemcpy(gathered[r].data(), g, n * size * sizeof(float), cudaMemcpyDeviceToHost);
        nccl.all_reduce_sum(d, n);
        got[r].resize(n);
        cudaMemcpy(got[r].data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
        cudaMemcpy(d, x.data(), n * sizeof(float), cudaMemcpyHostToDevice);
        nccl.broadcast(d, n * sizeof(float), size - 1);
        bcast[r].resize(n);
        cudaMemcpy(bcast[r].data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
        // Host memory is staged: the same result.
        std::vector<float> host = input(r, n);
        nccl.all_reduce_sum(host.data(), n);
        EXPECT_EQ(host, got[r]) << "host all_reduce_sum, rank " << r;
        cudaFree(d);
        cudaFree(g);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(got[r], want[r]) << "rank " << r;
    for (int q = 0; q < size; ++q) {
      EXPECT_EQ(std::vector<float>(gathered[r].begin() + q * n, gathered[r].begin() + (q + 1) * n),
                input(q, n));
    }
    EXPECT_EQ(bcast[r], input(size - 1, n)) << "rank " << r;
  }
}
#else
TEST(NcclComm, CollectivesEqualTheCpuCommunicatorBitForBit) {
  GTEST_SKIP() << "built without NCCL (KVB_HAVE_NCCL off)";
}
#endif

}  // namespace
}  // namespace kvb::kernels
