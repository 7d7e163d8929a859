// Hand-computed cases for the basic CPU kernels: RMSNorm, RoPE, SwiGLU, causal GQA attention,
// and the KvCache's compaction and byte accounting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/f16.h"
#include "kernels/kv_cache.h"

namespace kvb::kernels {
namespace {

TEST(RmsNorm, HandComputed) {
  // x = (3, 4): mean square = 12.5, 1/sqrt(12.5 + 0) = 0.28284271
  float x[2] = {3, 4}, w[2] = {1, 2}, y[2];
  cpu::rmsnorm(y, x, w, 1, 2, 0.0f);
  EXPECT_NEAR(y[0], 3 * 0.28284271f, 1e-6);
  EXPECT_NEAR(y[1], 2 * 4 * 0.28284271f, 1e-6);
}

// swiglu takes its exponentials a chunk at a time (exp_floats): the bits of the one-line
// definition g / (1 + std::exp(-g)) * up for every element, over sizes around the chunk and the
// parallel threshold, values from -100 to 100 (both signs of -g, both fallbacks) and specials.
TEST(SwiGlu, EqualsTheDefinitionBitForBit) {
  for (size_t n : {size_t(1), size_t(255), size_t(256), size_t(257), size_t(70001)}) {
    std::vector<float> g(n), u(n);
    uint32_t state = 12345;
    for (size_t i = 0; i < n; ++i) {
      state = state * 1664525u + 1013904223u;
      g[i] = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 200.0f;
      u[i] = static_cast<float>(i % 7) - 3.0f;
    }
    if (n > 5) {
      g[0] = 0.0f;
      g[1] = -0.0f;
      g[2] = 88.5f;
      g[3] = -88.5f;
      g[4] = 1e-40f;
    }
    std::vector<float> got = g;
    cpu::swiglu(got.data(), u.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const float want = g[i] / (1.0f + std::exp(-g[i])) * u[i];
      ASSERT_EQ(std::memcmp(&got[i], &want, 4), 0) << n << " " << i << " g=" << g[i];
    }
  }
}

TEST(Rope, NormAndNeoxPairings) {
  // head_dim 4, theta 100: inv_freq = (1, 100^(-1/2) = 0.1). Position 2: angles (2, 0.2).
  cpu::RopeParams p;
  p.rot_dim = 4;
  p.theta = 100.0f;
  int32_t pos = 2;
  float x[4] = {1, 0, 0, 1};
  p.style = cpu::RopeStyle::kNorm;  // pairs (0,1) with angle 2, (2,3) with angle 0.2
  cpu::rope(x, &pos, 1, 1, 4, p);
  EXPECT_NEAR(x[0], std::cos(2.0), 1e-6);
  EXPECT_NEAR(x[1], std::sin(2.0), 1e-6);
  EXPECT_NEAR(x[2], -std::sin(0.2), 1e-6);
  EXPECT_NEAR(x[3], std::cos(0.2), 1e-6);
  float y[4] = {1, 0, 0, 1};
  p.style = cpu::RopeStyle::kNeox;  // pairs (0,2) with angle 2, (1,3) with angle 0.2
  cpu::rope(y, &pos, 1, 1, 4, p);
  EXPECT_NEAR(y[0], std::cos(2.0), 1e-6);
  EXPECT_NEAR(y[2], std::sin(2.0), 1e-6);
  EXPECT_NEAR(y[1], -std::sin(0.2), 1e-6);
  EXPECT_NEAR(y[3], std::cos(0.2), 1e-6);
  // Position 0 is the identity.
  float z[4] = {0.5f, -1, 2, 3};
  int32_t zero = 0;
  cpu::rope(z, &zero, 1, 1, 4, p);
  EXPECT_FLOAT_EQ(z[0], 0.5f);
  EXPECT_FLOAT_EQ(z[3], 3.0f);
}

TEST(SwiGlu, HandComputed) {
  float g[3] = {0, 1, -2}, u[3] = {5, 2, 3};
  cpu::swiglu(g, u, 3);
  EXPECT_FLOAT_EQ(g[0], 0.0f);
  EXPECT_NEAR(g[1], 1 / (1 + std::exp(-1.0)) * 2, 1e-6);
  EXPECT_NEAR(g[2], -2 / (1 + std::exp(2.0)) * 3, 1e-6);
}

TEST(GegluTanh, HandComputed) {
  // gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), evaluated in double here.
  float g[4] = {0, 1, -2, 3}, u[4] = {5, 2, 3, -1};
  const double x[4] = {0, 1, -2, 3};
  cpu::geglu_tanh(g, u, 4);
  for (int i = 0; i < 4; ++i) {
    const double inner = std::sqrt(2.0 / M_PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i]);
    const double want = 0.5 * x[i] * (1 + std::tanh(inner)) * u[i];
    EXPECT_NEAR(g[i], want, 1e-6) << i;
  }
  // The tanh form, not the erf form: at x = 1 they differ by 1.6e-4 (0.841192 vs 0.841345).
  float one = 1, unit = 1;
  cpu::geglu_tanh(&one, &unit, 1);
  EXPECT_NEAR(one, 0.8411920, 1e-6);
}

// geglu_sigmoid (--dtype native's GELU): gelu_tanh as x / (1 + exp(-2u)), within 1e-6 relative
// of that function in double at the kernel's f32 u (1e-37 absolute: f32 underflows), over 600 values from -12 to 12 (the
// far tails, where the gate goes to 0 and to x, included) and a run of 1,000 (several chunks);
// and on every SIMD path the bits of the scalar transcription with std::exp.
TEST(GegluSigmoid, IsGeluTanhWithinAFewUlpAndTheScalarBits) {
  const size_t n = 1000;
  std::vector<float> g(n), u(n), want(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = -12.0f + 24.0f * static_cast<float>(i % 600) / 599.0f;
    u[i] = i % 3 == 0 ? -1.5f : 0.75f;
    const float e = std::exp(-2.0f * (0.7978845608028654f * (g[i] + 0.044715f * g[i] * g[i] * g[i])));
    want[i] = g[i] / (1.0f + e) * u[i];
  }
  std::vector<float> out = g;
  cpu::geglu_sigmoid(out.data(), u.data(), n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t a, b;
    std::memcpy(&a, &out[i], 4);
    std::memcpy(&b, &want[i], 4);
    ASSERT_EQ(a, b) << i << ": " << out[i] << " vs " << want[i];
    // The function in double at the kernel's own f32 argument (an f32 rounding of u moves
    // exp(-2u) by |2u| x 2^-24 relative, 6e-6 at the tail's u = -30: the input's conditioning,
    // not the kernel's error). 0.5 (1 + tanh(u)) as 1 / (1 + exp(-2u)): the same number,
    // without the double tanh form's cancellation to 0 in the negative tail.
    const float u32 = 0.7978845608028654f * (g[i] + 0.044715f * g[i] * g[i] * g[i]);
    const double ref = g[i] / (1 + std::exp(-2.0 * u32)) * u[i];
    EXPECT_NEAR(out[i], ref, 1e-6 * std::fabs(ref) + 1e-37) << "x " << g[i];  // f32 underflows
  }
}

TEST(Attention, CausalGqaHandComputed) {
  // 2 query heads sharing 1 KV head (head_dim 2); 2 cached tokens + 1 new token (n = 1).
  KvCache cache({1, 1, 2}, 4);
  const float k0[2] = {1, 0}, v0[2] = {1, 2};
  const float k1[2] = {0, 1}, v1[2] = {3, 4};
  const float k2[2] = {0, 0}, v2[2] = {5, 6};
  cache.append(0, 0, k0, v0, 0);
  cache.append(0, 0, k1, v1, 1);
  cache.append(0, 0, k2, v2, 2);
  // Head 0 query (ln 2, 0) at scale 1: scores (ln2, 0, 0) -> probs (1/2, 1/4, 1/4).
  // Head 1 query (0, 0): uniform 1/3 each.
  float q[4] = {std::log(2.0f), 0, 0, 0};
  float out[4];
  cpu::AttentionArgs a{out, q, cache.layer(0), 1, 2, 1.0f};
  cpu::attention(a);
  EXPECT_NEAR(out[0], 0.5 * 1 + 0.25 * 3 + 0.25 * 5, 1e-6);
  EXPECT_NEAR(out[1], 0.5 * 2 + 0.25 * 4 + 0.25 * 6, 1e-6);
  EXPECT_NEAR(out[2], 3.0, 1e-6);
  EXPECT_NEAR(out[3], 4.0, 1e-6);
}

TEST(Attention, PrefillBlockIsCausal) {
  // n = 2 new tokens on an empty cache: query 0 sees only slot 0.
  KvCache cache({1, 1, 1}, 2);
  const float k[2] = {1, 1}, v[2] = {10, 20};
  cache.append(0, 0, &k[0], &v[0], 0);
  cache.append(0, 0, &k[1], &v[1], 1);
  float q[2] = {0, 0}, out[2];
  cpu::AttentionArgs a{out, q, cache.layer(0), 2, 1, 1.0f};
  cpu::attention(a);
  EXPECT_FLOAT_EQ(out[0], 10.0f);
  EXPECT_FLOAT_EQ(out[1], 15.0f);
}

TEST(KvCache, KeepSlotsCompactsAndAccounts) {
  KvCache cache({2, 2, 3}, 2);
  for (int t = 0; t < 5; ++t) {
    cache.reserve_extra(1);  // grows past the initial capacity, keeping contents
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) {
        float kv[3] = {float(t), float(l), float(h)};
        cache.append(l, h, kv, kv, t);
      }
    }
  }
  cache.keep_slots(1, 0, {0, 3, 4});
  EXPECT_EQ(cache.length(1, 0), 3);
  EXPECT_EQ(cache.length(1, 1), 5);
  LayerKvView v = cache.layer(1);
  EXPECT_EQ(v.position(0)[1], 3);
  EXPECT_FLOAT_EQ(v.key(0, 1)[0], 3.0f);
  EXPECT_FLOAT_EQ(v.value(0, 2)[0], 4.0f);
  const size_t slot = 2 * 3 * sizeof(float) + sizeof(int32_t);
  EXPECT_EQ(cache.bytes_per_slot(), slot);
  EXPECT_EQ(cache.total_slots(), 5 + 5 + 3 + 5);
  EXPECT_EQ(cache.logical_bytes(), size_t(18) * slot);
  EXPECT_EQ(cache.logical_bytes(1, 0), 3 * slot);
  EXPECT_EQ(cache.physical_bytes(), size_t(2 * 2) * cache.capacity() * slot);
  EXPECT_GE(cache.capacity(), 5);
  EXPECT_THROW(cache.keep_slots(0, 0, {2, 1}), Error);  // not increasing
  EXPECT_THROW(cache.keep_slots(0, 0, {7}), Error);     // out of range
}

// Two tokens in every head of a 2 x 2 f16 cache of head_dim 4, token t's rows all t + 0.5.
KvCache filled_f16(bool f32_keys = false) {
  KvCache cache({2, 2, 4, true, f32_keys}, 2);
  for (int t = 0; t < 2; ++t) {
    const float r[4] = {t + 0.5f, t + 0.5f, t + 0.5f, t + 0.5f};
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) cache.append(l, h, r, r, t);
    }
  }
  cache.advance_position(2);
  return cache;
}

// f16 rows (--dtype native's cache): appends round to nearest even, the raw view gives the f16
// rows and null f32 pointers, rows_f32 gives them converted (and converts again after a change),
// compaction, growth, forks and prefixes move the f16 rows, and a slot costs 2 bytes an element
// (keys f32 under f32_keys: 4 + 2).
TEST(KvCache, F16RowsRoundOnAppendAndReadBackAsF32) {
  const float third = 1.0f / 3.0f;  // f16: 0x3555 (0.333251953125)
  KvCache cache({2, 2, 4, /*f16=*/true}, 2);
  for (int t = 0; t < 5; ++t) {
    cache.reserve_extra(1);
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) {
        const float k[4] = {float(t) + third, float(l), float(h), 65520.0f};
        const float v[4] = {-float(t), third, 1e-8f, 2.0f};
        cache.append(l, h, k, v, t);
      }
    }
  }
  LayerKvView raw = cache.layer(1);
  EXPECT_EQ(raw.keys, nullptr);
  EXPECT_EQ(raw.values, nullptr);
  ASSERT_NE(raw.keys16, nullptr);
  EXPECT_EQ(raw.key16(0, 0)[0], 0x3555);
  EXPECT_EQ(raw.key16(1, 2)[0], 0x40AB);  // 2 + 1/3: 2 x (1 + 171/1024) = 2.333984375
  EXPECT_EQ(raw.key16(0, 0)[3], 0x7C00);  // 65520 rounds to infinity
  EXPECT_EQ(raw.value16(0, 0)[2], 0x0000);  // 1e-8 < 2^-25: zero
  LayerKvView f = cache.rows_f32(1);
  EXPECT_EQ(f.keys16, nullptr);
  EXPECT_EQ(f.key(1, 2)[0], 2.333984375f);
  EXPECT_EQ(f.value(0, 4)[0], -4.0f);
  EXPECT_EQ(f.value(1, 3)[1], 0.333251953125f);
  EXPECT_EQ(f.position(1)[3], 3);
  cache.keep_slots(1, 0, {0, 3, 4});  // a change: converted again
  f = cache.rows_f32(1);
  EXPECT_EQ(f.key(0, 1)[0], f16_to_f32(f32_to_f16(3.0f + third)));
  EXPECT_EQ(f.value(0, 2)[0], -4.0f);
  EXPECT_EQ(f.position(0)[1], 3);
  const size_t slot = 2 * 4 * 2 + sizeof(int32_t);
  EXPECT_EQ(cache.bytes_per_slot(), slot);
  EXPECT_EQ(cache.logical_bytes(), size_t(5 + 5 + 3 + 5) * slot);
  EXPECT_EQ(cache.physical_bytes(), size_t(2 * 2) * cache.capacity() * slot);
  const KvCache forked = cache.fork(1);
  EXPECT_EQ(forked.rows_f32(1).key(0, 2)[0], f16_to_f32(f32_to_f16(4.0f + third)));
  KvCache prefix({2, 2, 4, true}, 5);
  prefix.assign_prefix(filled_f16(), 2);
  EXPECT_EQ(prefix.layer(0).key16(1, 1)[0], f32_to_f16(1.5f));
  EXPECT_THROW(prefix.assign_prefix(filled_f16(true), 2), Error);  // f32 keys: another shape
  KvCache rolling({1, 1, 4, true, /*f32_keys=*/true}, 1);
  const float k[4] = {third, 0, 0, 0};
  rolling.append(0, 0, k, k, 0);
  EXPECT_EQ(rolling.layer(0).key(0, 0)[0], third);  // f32 keys, exactly
  EXPECT_EQ(rolling.layer(0).value16(0, 0)[0], 0x3555);
  EXPECT_EQ(rolling.bytes_per_slot(), size_t(4 * 4 + 4 * 2 + 4));
  EXPECT_THROW(KvCache({1, 1, 3, true}, 1), Error);  // an odd head_dim
}

// A cache of `len` tokens per head whose slot s holds key/value (s, l, h) at position 10 + s.
KvCache filled(int layers, int heads, int len) {
  KvCache cache({layers, heads, 3}, len);
  for (int t = 0; t < len; ++t) {
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < heads; ++h) {
        float kv[3] = {float(t), float(l), float(h)};
        cache.append(l, h, kv, kv, 10 + t);
      }
    }
  }
  return cache;
}

std::vector<int32_t> positions(const KvCache& cache, int l, int h) {
  const LayerKvView v = cache.layer(l);
  return {v.position(h), v.position(h) + cache.length(l, h)};
}

TEST(EvictionPlan, ApplyKeepsListsDropsVictimsLeavesTheRest) {
  KvCache cache = filled(2, 3, 5);
  EvictionPlan plan;
  plan.reset(1, 3);
  EXPECT_FALSE(plan.changes_any());
  plan.keep(0, {0, 2, 4});
  plan.evict(2, 1);
  EXPECT_TRUE(plan.changes_any());
  EXPECT_EQ(plan.length_after(0, 5), 3);
  EXPECT_EQ(plan.length_after(1, 5), 5);
  EXPECT_EQ(plan.length_after(2, 5), 4);
  std::vector<int32_t> list;
  plan.keep_list(2, 5, &list);
  EXPECT_EQ(list, (std::vector<int32_t>{0, 2, 3, 4}));
  plan.keep_list(1, 5, &list);
  EXPECT_EQ(list, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  cache.apply(plan);
  EXPECT_EQ(positions(cache, 1, 0), (std::vector<int32_t>{10, 12, 14}));
  EXPECT_EQ(positions(cache, 1, 1), (std::vector<int32_t>{10, 11, 12, 13, 14}));
  EXPECT_EQ(positions(cache, 1, 2), (std::vector<int32_t>{10, 12, 13, 14}));
  for (int h = 0; h < 3; ++h) EXPECT_EQ(cache.length(0, h), 5) << "layer 0 is not the plan's";
  // The victim's later rows moved down with their keys and values.
  const LayerKvView v = cache.layer(1);
  EXPECT_FLOAT_EQ(v.key(2, 1)[0], 2.0f);
  EXPECT_FLOAT_EQ(v.value(2, 3)[0], 4.0f);
  EXPECT_FLOAT_EQ(v.key(2, 3)[2], 2.0f);
}

TEST(EvictionPlan, EvictSlotEqualsKeepingEveryOtherSlot) {
  for (int victim : {0, 3, 6}) {
    KvCache a = filled(1, 2, 7), b = filled(1, 2, 7);
    a.evict_slot(0, 1, victim);
    std::vector<int32_t> keep;
    for (int s = 0; s < 7; ++s) {
      if (s != victim) keep.push_back(s);
    }
    b.keep_slots(0, 1, keep);
    ASSERT_EQ(a.length(0, 1), 6);
    EXPECT_EQ(positions(a, 0, 1), positions(b, 0, 1)) << "victim " << victim;
    const LayerKvView va = a.layer(0), vb = b.layer(0);
    for (int s = 0; s < 6; ++s) {
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(va.key(1, s)[i], vb.key(1, s)[i]);
        EXPECT_EQ(va.value(1, s)[i], vb.value(1, s)[i]);
      }
    }
    EXPECT_EQ(a.length(0, 0), 7);
  }
}

// drop(head, first, count, len): nothing for 0, a victim for 1, otherwise the keep list of
// every slot outside [first, first + count); a run past the head is refused.
TEST(EvictionPlan, DropIsAVictimForOneSlotAndAKeepListOtherwise) {
  EvictionPlan plan;
  plan.reset(0, 4);
  plan.drop(0, 2, 0, 5);
  plan.drop(1, 3, 1, 5);
  plan.drop(2, 0, 3, 5);
  plan.drop(3, 1, 2, 5);
  EXPECT_EQ(plan.kind(0), EvictionPlan::Kind::kKeepAll);
  EXPECT_EQ(plan.kind(1), EvictionPlan::Kind::kVictim);
  EXPECT_EQ(plan.victim(1), 3);
  EXPECT_EQ(plan.kind(2), EvictionPlan::Kind::kKeep);
  EXPECT_EQ(plan.kept(2), (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(plan.kept(3), (std::vector<int32_t>{0, 3, 4}));
  EvictionPlan bad;
  bad.reset(0, 1);
  EXPECT_THROW(bad.drop(0, 4, 2, 5), Error);
  EXPECT_THROW(bad.drop(0, -1, 1, 5), Error);
  EXPECT_EQ(bad.kind(0), EvictionPlan::Kind::kKeepAll);
}

// Device rows that count how often they are copied (the host cannot see real ones).
struct CountingRows final : DeviceRows {
  explicit CountingRows(int* clones) : clones(clones) {}
  std::unique_ptr<DeviceRows> clone() const override {
    ++*clones;
    return std::make_unique<CountingRows>(clones);
  }
  void read_positions(int, int, int32_t*) const override {}
  int* clones;
};

TEST(KvCache, IndexOnlyCacheKeepsPositionsAndClonesItsDeviceRows) {
  KvCache index({2, 2, 64}, 4, /*host_rows=*/false);
  EXPECT_FALSE(index.host_rows());
  for (int t = 0; t < 6; ++t) {
    index.reserve_extra(1);
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) index.append(l, h, nullptr, nullptr, 100 + t);
    }
  }
  index.advance_position(6);
  EXPECT_EQ(index.layer(0).keys, nullptr);
  EXPECT_EQ(index.layer(0).values, nullptr);
  EvictionPlan plan;
  plan.reset(1, 2);
  plan.keep(0, {1, 4, 5});
  plan.evict(1, 0);
  index.apply(plan);
  EXPECT_EQ(positions(index, 1, 0), (std::vector<int32_t>{101, 104, 105}));
  EXPECT_EQ(positions(index, 1, 1), (std::vector<int32_t>{101, 102, 103, 104, 105}));
  EXPECT_EQ(positions(index, 0, 1), (std::vector<int32_t>{100, 101, 102, 103, 104, 105}));
  // The host holds 4 bytes per slot of capacity, not head_dim-wide rows; logical bytes still
  // count what the cache stores (the rows live elsewhere).
  EXPECT_EQ(index.physical_bytes(), size_t(2 * 2) * index.capacity() * sizeof(int32_t));
  EXPECT_EQ(index.logical_bytes(), size_t(6 + 6 + 3 + 5) * index.bytes_per_slot());
  int clones = 0;
  index.set_device_rows(std::make_unique<CountingRows>(&clones));
  KvCache fork = index;  // a fork copies the rows where they live
  EXPECT_EQ(clones, 1);
  ASSERT_NE(fork.device_rows(), nullptr);
  EXPECT_NE(fork.device_rows(), index.device_rows());
  EXPECT_EQ(fork.next_position(), 6);
  EXPECT_FALSE(fork.host_rows());
  KvCache moved = std::move(fork);
  EXPECT_EQ(clones, 1);  // moves do not copy
  fork = moved;
  EXPECT_EQ(clones, 2);
  moved.clear();
  EXPECT_EQ(moved.device_rows(), nullptr);  // the next sequence starts on fresh rows
  EXPECT_EQ(moved.total_slots(), 0);
  // A host-rows cache never had device rows to copy.
  KvCache host = filled(1, 1, 2);
  KvCache host_copy = host;
  EXPECT_EQ(host_copy.device_rows(), nullptr);
  EXPECT_EQ(clones, 2);
}

// A host-rows cache whose rows went up to a device (a CPU cache handed to the GPU engine) drops
// them: what stays is the index (lengths, positions, next position; 4 bytes per slot), and a
// cache without device rows refuses (its rows would be nowhere).
TEST(KvCache, DroppingHostRowsLeavesTheIndex) {
  KvCache cache = filled(2, 2, 3);
  const size_t logical = cache.logical_bytes();
  const std::vector<int32_t> pos = positions(cache, 1, 1);
  EXPECT_THROW(cache.drop_host_rows(), Error);
  EXPECT_TRUE(cache.host_rows());
  int clones = 0;
  cache.set_device_rows(std::make_unique<CountingRows>(&clones));
  cache.drop_host_rows();
  EXPECT_FALSE(cache.host_rows());
  EXPECT_EQ(cache.layer(1).keys, nullptr);
  EXPECT_EQ(cache.layer(1).values, nullptr);
  EXPECT_EQ(positions(cache, 1, 1), pos);
  EXPECT_EQ(cache.logical_bytes(), logical);
  EXPECT_EQ(cache.physical_bytes(), size_t(2 * 2) * cache.capacity() * sizeof(int32_t));
  cache.reserve_extra(1);
  cache.append(0, 0, nullptr, nullptr, 77);  // appends positions alone, as a device's index
  EXPECT_EQ(positions(cache, 0, 0).back(), 77);
}

// Device rows that record the fork they were asked for.
struct ForkingRows final : DeviceRows {
  explicit ForkingRows(int* extra) : extra(extra) {}
  std::unique_ptr<DeviceRows> clone() const override { return nullptr; }
  std::unique_ptr<DeviceRows> fork(int e) const override {
    *extra = e;
    return std::make_unique<ForkingRows>(extra);
  }
  void read_positions(int, int, int32_t*) const override {}
  int* extra;
};

// KvCache::fork (a choice's branch): the same lengths, positions and rows as a full copy, read
// through layer views, but capacity max_length() + extra instead of the parent's, and it grows
// like any cache. Device rows are forked with the same extra.
TEST(KvCache, ForkCopiesOnlyTheLiveRows) {
  KvCache parent = filled(2, 3, 5);
  parent.reserve_extra(40);  // spare capacity, as a prompt's cache has for generation
  EvictionPlan plan;
  plan.reset(0, 3);
  plan.keep(1, {0, 3});
  parent.apply(plan);  // heads of different lengths: 5, 2, 5
  parent.advance_position(5);
  const KvCache copy = parent;
  const KvCache fork = parent.fork(3);
  EXPECT_EQ(copy.capacity(), parent.capacity());
  EXPECT_EQ(fork.capacity(), 5 + 3);
  EXPECT_LT(fork.physical_bytes(), copy.physical_bytes());
  EXPECT_EQ(fork.logical_bytes(), copy.logical_bytes());
  EXPECT_EQ(fork.next_position(), copy.next_position());
  for (int l = 0; l < 2; ++l) {
    const LayerKvView a = copy.layer(l), b = fork.layer(l);
    for (int h = 0; h < 3; ++h) {
      ASSERT_EQ(fork.length(l, h), copy.length(l, h));
      EXPECT_EQ(positions(fork, l, h), positions(copy, l, h));
      for (int s = 0; s < copy.length(l, h); ++s) {
        for (int i = 0; i < 3; ++i) {
          EXPECT_EQ(a.key(h, s)[i], b.key(h, s)[i]);
          EXPECT_EQ(a.value(h, s)[i], b.value(h, s)[i]);
        }
      }
    }
  }
  KvCache grows = parent.fork(0);
  grows.reserve_extra(1);
  float kv[3] = {7, 7, 7};
  grows.append(0, 1, kv, kv, 99);
  EXPECT_EQ(positions(grows, 0, 1), (std::vector<int32_t>{10, 13, 99}));
  EXPECT_EQ(positions(parent, 0, 1), (std::vector<int32_t>{10, 13}));  // the parent is its own
  EXPECT_THROW(parent.fork(-1), Error);
  int extra = -1;
  parent.set_device_rows(std::make_unique<ForkingRows>(&extra));
  const KvCache on_device = parent.fork(4);
  EXPECT_EQ(extra, 4);
  EXPECT_NE(on_device.device_rows(), nullptr);
}

// KvCache::assign_prefix (prefix reuse): an empty cache takes the first p slots of a prompt's
// cache (positions 0..p-1 in every head), rows and positions as they are, next position p, its
// own capacity; refused where the source's heads do not start with those positions (evicted,
// or not a prompt from position 0), where the target holds slots, or beyond its capacity.
TEST(KvCache, AssignPrefixCopiesAPromptsFirstSlots) {
  KvCache src({2, 3, 3}, 6);
  for (int t = 0; t < 6; ++t) {
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 3; ++h) {
        float k[3] = {float(t), float(l), float(h)}, v[3] = {-float(t), 0.5f, float(h)};
        src.append(l, h, k, v, t);
      }
    }
  }
  src.advance_position(6);
  KvCache dst({2, 3, 3}, 9);
  dst.assign_prefix(src, 4);
  EXPECT_EQ(dst.capacity(), 9);
  EXPECT_EQ(dst.next_position(), 4);
  for (int l = 0; l < 2; ++l) {
    const LayerKvView v = dst.layer(l);
    for (int h = 0; h < 3; ++h) {
      ASSERT_EQ(dst.length(l, h), 4);
      EXPECT_EQ(positions(dst, l, h), (std::vector<int32_t>{0, 1, 2, 3}));
      for (int t = 0; t < 4; ++t) {
        EXPECT_EQ(v.key(h, t)[0], float(t));
        EXPECT_EQ(v.key(h, t)[1], float(l));
        EXPECT_EQ(v.value(h, t)[0], -float(t));
        EXPECT_EQ(v.value(h, t)[1], 0.5f);
        EXPECT_EQ(v.value(h, t)[2], float(h));
      }
    }
  }
  EXPECT_THROW(dst.assign_prefix(src, 2), Error);  // dst holds slots already
  KvCache small({2, 3, 3}, 3);
  EXPECT_THROW(small.assign_prefix(src, 4), Error);  // beyond its capacity
  KvCache evicted = src;
  EvictionPlan plan;
  plan.reset(1, 3);
  plan.keep(2, {0, 2, 3, 4, 5});  // head 2 of layer 1 lost position 1
  evicted.apply(plan);
  KvCache none({2, 3, 3}, 9);
  EXPECT_THROW(none.assign_prefix(evicted, 3), Error);
  KvCache ok({2, 3, 3}, 9);
  ok.assign_prefix(evicted, 1);  // position 0 is still every head's first slot
  EXPECT_EQ(ok.length(1, 2), 1);
  KvCache later = filled(2, 3, 5);  // positions 10..14: not a prompt from position 0
  later.advance_position(15);
  KvCache none2({2, 3, 3}, 9);
  EXPECT_THROW(none2.assign_prefix(later, 2), Error);
}

// Every row, position and length of two caches, and their capacity and accounting.
void expect_same_cache(const KvCache& a, const KvCache& b) {
  ASSERT_EQ(a.capacity(), b.capacity());
  EXPECT_EQ(a.physical_bytes(), b.physical_bytes());
  EXPECT_EQ(a.logical_bytes(), b.logical_bytes());
  EXPECT_EQ(a.next_position(), b.next_position());
  const int d = a.shape().head_dim;
  for (int l = 0; l < a.shape().num_layers; ++l) {
    const LayerKvView va = a.layer(l), vb = b.layer(l);
    for (int h = 0; h < a.shape().num_kv_heads; ++h) {
      ASSERT_EQ(a.length(l, h), b.length(l, h)) << "layer " << l << " head " << h;
      EXPECT_EQ(positions(a, l, h), positions(b, l, h));
      for (int s = 0; s < a.length(l, h); ++s) {
        for (int i = 0; i < d; ++i) {
          EXPECT_EQ(va.key(h, s)[i], vb.key(h, s)[i]);
          EXPECT_EQ(va.value(h, s)[i], vb.value(h, s)[i]);
        }
      }
    }
  }
}

// KvCache::empty_copy + fill_layer (a shared prefill's unit): the cache a copy of the source,
// reserve_extra(extra) and apply(plan) per layer give, bit for bit, for every kind of plan: keep
// all, a victim first, inside and last, keep lists with runs, single slots and nothing.
TEST(KvCache, FillLayerGivesTheCopyCompactedByThePlan) {
  for (int extra : {0, 3, 60}) {  // within the source's capacity, and beyond it (a grown copy)
    SCOPED_TRACE("extra " + std::to_string(extra));
    KvCache src = filled(4, 3, 9);
    src.reserve_extra(20);
    src.advance_position(9);
    std::vector<EvictionPlan> plans(4);
    for (int l = 0; l < 4; ++l) plans[l].reset(l, 3);
    plans[1].evict(0, 0);
    plans[1].evict(1, 4);
    plans[1].evict(2, 8);
    plans[2].keep(0, {0, 1, 2, 5, 7, 8});
    plans[2].keep(1, {3});
    plans[2].keep(2, {});
    plans[3].keep(1, {1, 2, 3, 4, 5, 6, 7, 8});  // layer 3's heads 0 and 2 kept whole
    KvCache copied = src;
    copied.reserve_extra(extra);
    for (const EvictionPlan& p : plans) copied.apply(p);
    KvCache filled_cache = src.empty_copy(extra);
    EXPECT_EQ(filled_cache.total_slots(), 0);
    for (const EvictionPlan& p : plans) filled_cache.fill_layer(src, p);
    expect_same_cache(filled_cache, copied);
    // It grows and appends like the copy.
    float kv[3] = {5, 5, 5};
    copied.reserve_extra(1);
    filled_cache.reserve_extra(1);
    copied.append(2, 2, kv, kv, 50);
    filled_cache.append(2, 2, kv, kv, 50);
    expect_same_cache(filled_cache, copied);
  }
}

TEST(KvCache, FillLayerRefusesBadPlansAndTargets) {
  const KvCache src = filled(2, 2, 5);
  KvCache dst = src.empty_copy(0);
  EvictionPlan plan;
  plan.reset(0, 2);
  plan.keep(0, {1, 1});  // not increasing
  EXPECT_THROW(dst.fill_layer(src, plan), Error);
  plan.reset(0, 2);
  plan.keep(1, {0, 5});  // past the source's length
  EXPECT_THROW(dst.fill_layer(src, plan), Error);
  plan.reset(0, 2);
  plan.evict(0, 5);
  EXPECT_THROW(dst.fill_layer(src, plan), Error);
  KvCache fresh = src.empty_copy(0);
  plan.reset(1, 2);
  fresh.fill_layer(src, plan);
  EXPECT_THROW(fresh.fill_layer(src, plan), Error);  // the layer holds its slots already
  plan.reset(0, 3);
  EXPECT_THROW(fresh.fill_layer(src, plan), Error);  // a plan for 3 heads
  const KvCache other = filled(2, 3, 5);
  plan.reset(0, 2);
  EXPECT_THROW(fresh.fill_layer(other, plan), Error);  // another shape
  KvCache index_only({2, 2, 3}, 4, /*host_rows=*/false);
  EXPECT_THROW(index_only.empty_copy(0), Error);
  EXPECT_THROW(src.empty_copy(-1), Error);
}

// The cache's storage reads as zeros where nothing was written, also when its memory was used
// and freed before (calloc semantics), and copies copy.
TEST(KvCache, ZeroedStorageReadsZero) {
  using Rows = std::vector<float, ZeroedAllocator<float>>;
  for (int round = 0; round < 3; ++round) {
    for (size_t n : {size_t(7), size_t(5000), size_t(1) << 20}) {
      Rows dirty(n);
      std::fill(dirty.begin(), dirty.end(), 3.5f);
      dirty = Rows();  // freed: the next allocation may reuse it
      Rows fresh(n);
      ASSERT_EQ(fresh.size(), n);
      EXPECT_EQ(std::count(fresh.begin(), fresh.end(), 0.0f), static_cast<long>(n)) << n;
      fresh[n / 2] = 2.0f;
      const Rows copy = fresh;
      EXPECT_EQ(copy[n / 2], 2.0f);
      EXPECT_EQ(copy[0], 0.0f);
    }
  }
  const KvCache cache({1, 2, 4}, 16);
  const LayerKvView v = cache.layer(0);
  for (int h = 0; h < 2; ++h) {
    for (int s = 0; s < 16; ++s) {
      for (int i = 0; i < 4; ++i) EXPECT_EQ(v.key(h, s)[i], 0.0f);
      EXPECT_EQ(v.position(h)[s], 0);
    }
  }
}

TEST(EvictionPlan, BadPlansAreRefusedNamingTheHead) {
  EvictionPlan plan;
  plan.reset(0, 2);
  plan.evict(1, 0);
  EXPECT_THROW(plan.keep(1, {0}), Error);  // decided twice
  EXPECT_THROW(plan.evict(2, 0), Error);   // no such head
  KvCache cache = filled(1, 2, 3);
  EvictionPlan bad;
  bad.reset(0, 2);
  bad.evict(0, 3);  // past the head's length
  EXPECT_THROW(cache.apply(bad), Error);
  EvictionPlan wrong_layer;
  wrong_layer.reset(1, 2);
  EXPECT_THROW(cache.apply(wrong_layer), Error);
  EvictionPlan decreasing;
  decreasing.reset(0, 2);
  decreasing.keep(1, {2, 1});
  EXPECT_THROW(cache.apply(decreasing), Error);
}

}  // namespace
}  // namespace kvb::kernels
