// The GPU engine's own small kernels (workers/engine/cuda_engine_kernels.h) against host loops:
// split_columns, which puts a stacked projection's output (q|k|v) into the matrices' own
// activations; and the fused forms the engine's bf16 path uses: glu_stacked (gate|up in one
// product) against swiglu / geglu_tanh on the split rows, rmsnorm's and glu_stacked's bf16
// copies against f32_to_bf16 of their f32 outputs (all bit for bit). The engine tests
// (test_cuda_engine.cc) check them again end to end. Device cases skip without a GPU; the
// argument checks run anywhere.
#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/swiglu.h"
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

std::vector<uint16_t> bf16_of(const cu::DeviceBuffer<float>& x, size_t n) {
  cu::DeviceBuffer<__nv_bfloat16> b(std::max<size_t>(n, 1));
  cu::f32_to_bf16(b.data(), x.data(), n);
  std::vector<uint16_t> out(n);
  KVB_CUDA_CHECK(cudaDeviceSynchronize());
  if (n > 0) KVB_CUDA_CHECK(cudaMemcpy(out.data(), b.data(), n * 2, cudaMemcpyDeviceToHost));
  return out;
}
std::vector<uint16_t> bits_of(const cu::DeviceBuffer<__nv_bfloat16>& b, size_t n) {
  std::vector<uint16_t> out(n);
  KVB_CUDA_CHECK(cudaDeviceSynchronize());
  if (n > 0) KVB_CUDA_CHECK(cudaMemcpy(out.data(), b.data(), n * 2, cudaMemcpyDeviceToHost));
  return out;
}

TEST(CudaEngineKernels, StackedGluIsTheSplitGluAndItsBf16Copy) {
  if (!cu::has_device()) GTEST_SKIP() << "no CUDA device visible";
  for (const bool gelu : {false, true}) {
    for (const int n : {1, 5}) {
      SCOPED_TRACE(testing::Message() << (gelu ? "geglu" : "swiglu") << " n " << n);
      const int h = 300;
      const std::vector<float> in = parity::random_vec(static_cast<size_t>(n) * 2 * h, 23, -6, 6);
      std::vector<float> gate(static_cast<size_t>(n) * h), up(gate.size());
      for (int t = 0; t < n; ++t) {
        for (int j = 0; j < h; ++j) {
          gate[static_cast<size_t>(t) * h + j] = in[static_cast<size_t>(t) * 2 * h + j];
          up[static_cast<size_t>(t) * h + j] = in[static_cast<size_t>(t) * 2 * h + h + j];
        }
      }
      cu::DeviceBuffer<float> gd = parity::to_device(gate);
      const cu::DeviceBuffer<float> ud = parity::to_device(up), ind = parity::to_device(in);
      if (gelu) {
        cu::geglu_tanh(gd.data(), ud.data(), gate.size());
      } else {
        cu::swiglu(gd.data(), ud.data(), gate.size());
      }
      cu::DeviceBuffer<float> out(gate.size());
      cu::DeviceBuffer<__nv_bfloat16> out16(gate.size());
      cu::glu_stacked(out.data(), out16.data(), ind.data(), n, h, gelu);
      parity::expect_bits(parity::to_host(out), parity::to_host(gd), "stacked glu");
      EXPECT_EQ(bits_of(out16, gate.size()), bf16_of(out, gate.size()));
    }
  }
}

TEST(CudaEngineKernels, RmsnormBf16CopyIsItsOutputRounded) {
  if (!cu::has_device()) GTEST_SKIP() << "no CUDA device visible";
  const int n = 3, dim = 576;
  const std::vector<float> x = parity::random_vec(static_cast<size_t>(n) * dim, 29, -3, 3);
  const std::vector<float> w = parity::random_vec(dim, 31, 0.5f, 1.5f);
  const cu::DeviceBuffer<float> xd = parity::to_device(x), wd = parity::to_device(w);
  cu::DeviceBuffer<float> plain(x.size()), dual(x.size());
  cu::DeviceBuffer<__nv_bfloat16> y16(x.size());
  cu::rmsnorm(plain.data(), xd.data(), wd.data(), n, dim, 1e-5f);
  cu::rmsnorm(dual.data(), xd.data(), wd.data(), n, dim, 1e-5f, 0, y16.data());
  parity::expect_bits(parity::to_host(dual), parity::to_host(plain), "rmsnorm with a copy");
  EXPECT_EQ(bits_of(y16, x.size()), bf16_of(dual, x.size()));
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
