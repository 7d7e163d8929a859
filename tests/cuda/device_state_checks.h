// Shared by the tests of the policies whose state lives on the device (test_cuda_subgen.cc,
// test_cuda_kcenter.cc): a host-rows cache with its device twin, and the fork check (a policy
// forked after its prompt on the GPU engine decodes like the original).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/runtime.h"
#include "kernels/kv_cache.h"
#include "kernels/policies/policy.h"
#include "workers/engine/cuda_engine.h"
#include "workers/engine/generate.h"
#include "workers/engine/model.h"
#include "workers/formats/model_load.h"
#include "parity_util.h"

namespace kvb::parity {

// A host-rows cache (`layers` x lens.size() heads of `dim`) and the same as an index whose rows
// live on the device only. fill(l, h, s, k, v) writes slot s's key and value and returns its
// position; both are bf16-rounded first when the device stores bf16 (so the host holds exactly
// what the device widens).
struct HostAndDeviceRows {
  kernels::KvCache host;
  kernels::KvCache index;
  template <typename Fill>
  HostAndDeviceRows(kernels::cuda::KvDtype dtype, int layers, const std::vector<int>& lens,
                    int dim, Fill fill) {
    const int heads = static_cast<int>(lens.size());
    const int cap = *std::max_element(lens.begin(), lens.end());
    host = kernels::KvCache({layers, heads, dim}, cap);
    index = kernels::KvCache({layers, heads, dim}, cap, /*host_rows=*/false);
    std::vector<float> k(dim), v(dim);
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < heads; ++h) {
        for (int s = 0; s < lens[h]; ++s) {
          const int32_t pos = fill(l, h, s, k.data(), v.data());
          if (dtype == kernels::cuda::KvDtype::kBf16) {
            for (int i = 0; i < dim; ++i) {
              k[i] = bf16_round(k[i]);
              v[i] = bf16_round(v[i]);
            }
          }
          host.append(l, h, k.data(), v.data(), pos);
          index.append(l, h, nullptr, nullptr, pos);
        }
      }
    }
    auto dev = std::make_unique<kernels::cuda::DeviceKvCache>(host.shape(), dtype, cap);
    dev->upload(host);
    index.set_device_rows(std::move(dev));
  }
  kernels::cuda::DeviceKvCache& dev() const {
    return *static_cast<kernels::cuda::DeviceKvCache*>(index.device_rows());
  }
};

// A CUDA policy-ops instance on its own stream, per cache dtype; skips without a GPU.
class CudaOpsTest : public ::testing::TestWithParam<kernels::cuda::KvDtype> {
 protected:
  void SetUp() override {
    if (!kernels::cuda::has_device()) {
      GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
    }
    KVB_CUDA_CHECK(cudaStreamCreate(&stream_));
    ops_ = std::make_unique<kernels::cuda::CudaPolicyOps>(stream_);
  }
  void TearDown() override {
    ops_.reset();
    if (stream_) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<kernels::cuda::CudaPolicyOps> ops_;
};

struct ForkRun {
  kernels::KvCache cache;  // the original's, after the prompt and the forced tokens
  int num_layers = 0;
  int tokens = 0;  // prompt + forced
};

// stories260K on the GPU (f32), a 40-token prompt through `policy` at kv_budget 16, then a fork;
// the fork decodes 4 forced tokens first, then the original the same ones: the logits must be
// the same bits at every step, the fork's decoding must not change the original's state bytes,
// and both end with the same state bytes; neither cache keeps host rows. Returns false (and
// `why`) when it cannot run here (no GPU, no model); the caller skips.
inline bool fork_decodes_as_original(const std::string& policy_name,
                                     const std::map<std::string, std::string>& options,
                                     uint64_t seed, ForkRun* run, std::string* why) {
  if (!kernels::cuda::has_device()) {
    *why = "no CUDA device (cudaGetDeviceCount found none)";
    return false;
  }
  const std::string path = std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin";
  if (!std::ifstream(path).good()) {
    *why = path + " missing";
    return false;
  }
  const std::unique_ptr<engine::Model> m = engine::load_model(path);
  const engine::ModelConfig& c = m->config;
  engine::Engine gpu(*m, engine::cuda_backend(*m, engine::DType::kF32));
  std::vector<int32_t> prompt(40);
  for (int i = 0; i < 40; ++i) prompt[i] = (i * 37 + 5) % c.vocab_size;
  policies::PolicyConfig pc;
  pc.name = policy_name;
  pc.kv_budget = 16;
  pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
  pc.options = policies::PolicyOptions(options);
  pc.seed = seed;
  std::unique_ptr<policies::Policy> policy = policies::make_policy(pc);
  kernels::KvCache cache = gpu.new_cache(0, policy.get());
  std::vector<float> logits;
  engine::prefill_prompt(gpu, cache, prompt, policy.get(), &logits);
  EXPECT_FALSE(cache.host_rows());
  std::unique_ptr<policies::Policy> forked = policy->clone();
  kernels::KvCache fork = cache;
  const std::vector<int32_t> forced = {3, 17, 29, 4};
  auto decode = [&](policies::Policy& p, kernels::KvCache& kv) {
    std::vector<std::vector<float>> out;
    for (int32_t t : forced) {
      gpu.forward({&t, 1}, kv, engine::LogitsMode::kLast, &logits, &p,
                  engine::PolicyHook::kDecode);
      out.push_back(logits);
    }
    return out;
  };
  const size_t bytes_before = policy->state_bytes();
  const std::vector<std::vector<float>> from_fork = decode(*forked, fork);
  EXPECT_EQ(policy->state_bytes(), bytes_before) << "the fork's decoding reached the original";
  const std::vector<std::vector<float>> from_original = decode(*policy, cache);
  EXPECT_EQ(from_fork.size(), from_original.size());
  for (size_t i = 0; i < from_fork.size() && i < from_original.size(); ++i) {
    EXPECT_TRUE(from_fork[i].size() == from_original[i].size() &&
                std::memcmp(from_fork[i].data(), from_original[i].data(),
                            from_fork[i].size() * sizeof(float)) == 0)
        << "step " << i;
  }
  EXPECT_EQ(forked->state_bytes(), policy->state_bytes());
  run->cache = cache;
  run->num_layers = c.num_layers;
  run->tokens = static_cast<int>(prompt.size() + forced.size());
  return true;
}

}  // namespace kvb::parity
