// The GPU engine's own small kernels (workers/engine/cuda_engine_kernels.h) against host loops:
// split_columns, which puts a stacked projection's output (q|k|v, gate|up) into the matrices'
// own activations. The engine tests (test_cuda_engine.cc) check them again end to end. Device
// cases skip without a GPU; the argument checks run anywhere.
#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"
#include "kernels/cuda/runtime.h"
#include "parity_util.h"
#include "workers/engine/cuda_engine_kernels.h"

namespace kvb {
namespace {

namespace cu = kernels::cuda;
namespace gpu = engine::gpu;

TEST(CudaEngineKernels, SplitColumnsPutsEachBlockOfColumnsInItsPart) {
  if (!cu::has_device()) GTEST_SKIP() << "no CUDA device visible";
  for (const std::vector<int>& widths : std::vector<std::vector<int>>{{6, 2, 2}, {5, 5}, {3}}) {
    for (const int n : {0, 1, 7}) {
      SCOPED_TRACE(testing::Message() << widths.size() << " parts, n " << n);
      int width = 0;
      for (int w : widths) width += w;
      const std::vector<float> src = parity::random_vec(static_cast<size_t>(n) * width, 17);
      const cu::DeviceBuffer<float> srcd = parity::to_device(src);
      std::vector<cu::DeviceBuffer<float>> parts;
      gpu::ColumnSplit split;
      split.parts = static_cast<int>(widths.size());
      for (int p = 0; p < split.parts; ++p) {
        parts.emplace_back(std::max<size_t>(static_cast<size_t>(n) * widths[p], 1));
        split.dst[p] = parts.back().data();
        split.width[p] = widths[p];
      }
      gpu::split_columns(srcd.data(), n, split, 0);
      KVB_CUDA_CHECK(cudaDeviceSynchronize());
      int begin = 0;
      for (int p = 0; p < split.parts; ++p) {
        std::vector<float> want(static_cast<size_t>(n) * widths[p]);
        for (int t = 0; t < n; ++t) {
          for (int j = 0; j < widths[p]; ++j) {
            want[static_cast<size_t>(t) * widths[p] + j] =
                src[static_cast<size_t>(t) * width + begin + j];
          }
        }
        parity::expect_bits(parity::to_host(parts[p].data(), want.size()), want,
                            "part " + std::to_string(p));
        begin += widths[p];
      }
    }
  }
}

TEST(CudaEngineKernels, SplitColumnsRefusesBadParts) {
  gpu::ColumnSplit split;  // no parts
  EXPECT_THROW(gpu::split_columns(nullptr, 1, split, 0), Error);
  float* dummy = reinterpret_cast<float*>(16);
  split.parts = 2;
  split.dst[0] = split.dst[1] = dummy;
  split.width[0] = 4;  // part 1 has width 0
  EXPECT_THROW(gpu::split_columns(nullptr, 1, split, 0), Error);
  split.parts = 4;
  EXPECT_THROW(gpu::split_columns(nullptr, 1, split, 0), Error);
}

}  // namespace
}  // namespace kvb
