// The GPU engine's host-mirror bookkeeping (workers/engine/mirror_sync.h), which runs on the host
// and so is checked here without a GPU: fingerprints notice every way a cache can change between
// two forward passes. And the engine factory's errors.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "common/error.h"
#include "workers/engine/engine_base.h"
#include "workers/engine/forward.h"
#include "workers/engine/mirror_sync.h"

namespace kvb {
namespace {

using engine::CacheFingerprint;

kernels::KvCache filled_cache(int layers, int heads, int hd, int tokens, uint64_t seed) {
  kernels::KvCache c({layers, heads, hd}, tokens);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> k(hd), v(hd);
  for (int t = 0; t < tokens; ++t) {
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < heads; ++h) {
        for (int d = 0; d < hd; ++d) k[d] = u(rng), v[d] = u(rng);
        c.append(l, h, k.data(), v.data(), t);
      }
    }
  }
  c.advance_position(tokens);
  return c;
}

TEST(MirrorSync, FingerprintNoticesEveryChange) {
  kernels::KvCache a = filled_cache(2, 2, 4, 6, 1);
  CacheFingerprint fp;
  EXPECT_FALSE(fp.matches(a));
  fp.capture(a);
  EXPECT_TRUE(fp.matches(a));
  kernels::KvCache copy = a;
  EXPECT_FALSE(fp.matches(copy));  // another object: the device holds `a`
  kernels::KvCache b = a;
  b.keep_slots(1, 1, {0, 1, 2, 3, 4});  // one head shorter
  a = b;
  EXPECT_FALSE(fp.matches(a));
  fp.capture(a);
  a = filled_cache(2, 2, 4, 6, 2);  // same lengths and positions, other contents
  EXPECT_FALSE(fp.matches(a));
  fp.capture(a);
  a.advance_position(1);
  EXPECT_FALSE(fp.matches(a));
  fp.reset();
  a.advance_position(-1);
  EXPECT_FALSE(fp.matches(a));
}

TEST(EngineFactory, DeviceAndDtypeErrors) {
  EXPECT_EQ(engine::parse_device("cpu"), engine::Device::kCpu);
  EXPECT_EQ(engine::parse_device("cuda"), engine::Device::kCuda);
  EXPECT_THROW(engine::parse_device("gpu"), Error);
  EXPECT_THROW(engine::parse_dtype("fp16"), Error);
  EXPECT_EQ(engine::resolve_dtype(engine::Device::kCpu, ""), engine::DType::kF32);
  EXPECT_EQ(engine::resolve_dtype(engine::Device::kCuda, ""), engine::DType::kBf16);
  EXPECT_EQ(engine::resolve_dtype(engine::Device::kCuda, "f32"), engine::DType::kF32);
  try {
    engine::resolve_dtype(engine::Device::kCpu, "bf16");
    FAIL() << "bf16 on the CPU was accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(err.what()).find("--dtype bf16 needs --device cuda"), std::string::npos);
  }
  engine::Model m;
  m.config.num_layers = 1;
  std::unique_ptr<engine::EngineBase> e =
      engine::make_engine(m, engine::Device::kCpu, engine::DType::kF32);
  EXPECT_EQ(e->device_description(), "cpu");
  EXPECT_EQ(e->device_peak_bytes(), 0u);
  // K/V bytes: the CPU engine counts its f32 cache; a bf16 slot of head_dim 64 holds
  // 2 x 64 x 2 bytes of K/V and a 4-byte position, an f32 slot is what KvCache counts.
  EXPECT_EQ(engine::kv_slot_bytes(64, engine::DType::kBf16), 260u);
  kernels::KvCache kv({2, 3, 64}, 5);
  EXPECT_EQ(engine::kv_slot_bytes(64, engine::DType::kF32), kv.bytes_per_slot());
  EXPECT_EQ(e->kv_logical_bytes(kv), kv.logical_bytes());
  EXPECT_EQ(e->kv_physical_bytes(kv), 2u * 3 * 5 * kv.bytes_per_slot());
  EXPECT_NE(dynamic_cast<engine::Engine*>(e.get()), nullptr);
  try {
    engine::make_engine(m, engine::Device::kCpu, engine::DType::kBf16);
    FAIL() << "bf16 on the CPU did not throw";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(err.what()).find("--device cuda"), std::string::npos) << err.what();
  }
#ifndef KVB_WITH_CUDA
  try {
    engine::make_engine(m, engine::Device::kCuda, engine::DType::kBf16);
    FAIL() << "cuda in a build without CUDA did not throw";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("this build has no CUDA"), std::string::npos);
  }
#endif
}

}  // namespace
}  // namespace kvb
