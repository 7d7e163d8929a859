// The fixture of the policy ops tests that run CpuPolicyOps and CudaPolicyOps on the same inputs
// (test_cuda_policy_ops.cc, test_cuda_policy_guide_example.cc): a stream and the device ops, the
// CPU ops, and one layer's cache twice, with host rows for the CPU and as an index whose rows
// live in a DeviceKvCache for the GPU. Skips without a CUDA device.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/runtime.h"
#include "kernels/kv_cache.h"
#include "kernels/ops/cpu_policy_ops.h"
#include "parity_util.h"

namespace kvb::parity {

class PolicyOpsFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cu::has_device()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
    KVB_CUDA_CHECK(cudaStreamCreate(&stream_));
    gpu_ = std::make_unique<cu::CudaPolicyOps>(stream_);
  }
  void TearDown() override {
    gpu_.reset();
    if (stream_) cudaStreamDestroy(stream_);
  }
  // One layer whose heads hold `lens` slots at positions 3s + head; a host-rows cache for the
  // CPU and an index-only copy whose rows live in a DeviceKvCache for the GPU.
  void make_caches(const std::vector<int>& lens, int extra) {
    const int heads = static_cast<int>(lens.size());
    int cap = extra;
    for (int l : lens) cap = std::max(cap, l + extra);
    host_ = kernels::KvCache({1, heads, 8}, cap);
    index_ = kernels::KvCache({1, heads, 8}, cap, /*host_rows=*/false);
    std::vector<float> k(8), v(8);
    for (int h = 0; h < heads; ++h) {
      for (int s = 0; s < lens[h]; ++s) {
        for (int i = 0; i < 8; ++i) k[i] = v[i] = uniform(h * 1000 + s, i);
        host_.append(0, h, k.data(), v.data(), 3 * s + h);
        index_.append(0, h, nullptr, nullptr, 3 * s + h);
      }
    }
    auto dev = std::make_unique<cu::DeviceKvCache>(host_.shape(), cu::KvDtype::kF32, cap);
    dev->upload(host_);
    index_.set_device_rows(std::move(dev));
  }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cu::CudaPolicyOps> gpu_;
  kvb::kernels::ops::CpuPolicyOps cpu_;
  kernels::KvCache host_, index_;
};

}  // namespace kvb::parity
