// The GPU engine's host-mirror bookkeeping (workers/engine/mirror_sync.h), which runs on the host
// and so is checked here without a GPU: keep-lists derived from positions before/after a policy
// edit reproduce the edit when applied to the cache as it was; fingerprints notice every way a
// cache can change between two forward passes. And the engine factory's errors.
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
using engine::LayerPositions;

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

void expect_same_layer(kernels::KvCache& a, kernels::KvCache& b, int l) {
  const int hd = a.shape().head_dim;
  kernels::LayerKvView va = a.layer(l), vb = b.layer(l);
  for (int h = 0; h < a.shape().num_kv_heads; ++h) {
    ASSERT_EQ(a.length(l, h), b.length(l, h)) << "head " << h;
    for (int s = 0; s < a.length(l, h); ++s) {
      ASSERT_EQ(va.position(h)[s], vb.position(h)[s]) << "head " << h << " slot " << s;
      ASSERT_EQ(0, std::memcmp(va.key(h, s), vb.key(h, s), hd * sizeof(float)));
      ASSERT_EQ(0, std::memcmp(va.value(h, s), vb.value(h, s), hd * sizeof(float)));
    }
  }
}

TEST(MirrorSync, DerivedKeepListsReproduceTheEdit) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    kernels::KvCache cache = filled_cache(3, 4, 8, 40, trial);
    const int l = trial % 3;
    // A previous eviction made the heads ragged and their positions sparse.
    for (int h = 0; h < 4; ++h) {
      std::vector<int32_t> keep;
      for (int s = 0; s < 40; ++s) {
        if (rng() % 3 != 0) keep.push_back(s);
      }
      cache.keep_slots(l, h, keep);
    }
    kernels::KvCache original = cache;
    LayerPositions before;
    engine::snapshot_positions(cache, l, &before);
    // The "policy": random subsets of some heads; head 1 untouched.
    for (int h = 0; h < 4; ++h) {
      if (h == 1) continue;
      std::vector<int32_t> keep;
      for (int s = 0; s < cache.length(l, h); ++s) {
        if (rng() % 2 == 0) keep.push_back(s);
      }
      cache.keep_slots(l, h, keep);
    }
    std::vector<int32_t> slots, counts;
    int ld = 0;
    ASSERT_TRUE(engine::derive_keep_lists(before, cache, l, &slots, &counts, &ld));
    ASSERT_EQ(counts[1], original.length(l, 1));  // identity list for the untouched head
    for (int h = 0; h < 4; ++h) {
      original.keep_slots(
          l, h, std::vector<int32_t>(slots.begin() + h * ld, slots.begin() + h * ld + counts[h]));
    }
    expect_same_layer(original, cache, l);
  }
}

TEST(MirrorSync, NoChangeAndBadEditsAreReported) {
  kernels::KvCache cache = filled_cache(2, 2, 4, 10, 1);
  LayerPositions before;
  engine::snapshot_positions(cache, 0, &before);
  std::vector<int32_t> slots = {7}, counts = {7};
  int ld = 5;
  EXPECT_FALSE(engine::derive_keep_lists(before, cache, 0, &slots, &counts, &ld));
  EXPECT_EQ(ld, 5);  // outputs untouched
  EXPECT_EQ(slots, std::vector<int32_t>{7});
  // A snapshot whose head 0 lacks position 9 (as if the edit had added it): an error.
  before.pos.erase(before.pos.begin() + 9);
  for (size_t i = 1; i < before.off.size(); ++i) before.off[i] -= 1;
  before.off[0] = 0;
  cache.keep_slots(0, 0, {0, 9});
  EXPECT_THROW(engine::derive_keep_lists(before, cache, 0, &slots, &counts, &ld), Error);
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
