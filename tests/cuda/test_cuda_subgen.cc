// SubGen's device sketches (kernels/cuda/subgen_sketch.h, CudaPolicyOps::subgen_*) against the
// CPU reference (kernels/cpu/subgen_estimator.h) on the same cache rows:
//  - the absorb is the CPU's bit for bit: after random streams (tied keys, so equal distances;
//    zero values, so mu = 0 and p = 1; a small cluster table, so `forced` joins; several heads
//    of one layer at once; two calls per head, so the state carries over; f32 and bf16 rows),
//    every head's M, representatives, samples, counts, mu, absorbed and forced equal the CPU's;
//  - the batched query over the device sketches and rows (GQA group 2, two query rows) is
//    within the single query's parity bounds of cpu::subgen_query;
//  - the ops' state clones deep (a fork absorbs on without touching the original), and
//    read_keys returns the rows (bf16 widened exactly) with one counted copy and sync;
//  - on the GPU engine (stories260K), a policy cloned with its cache after the prompt
//    (Policy::clone, a fork) decodes exactly as the original, which it leaves untouched.
// Skips without a CUDA device (none here: compiled only until a GPU session runs it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <vector>

#include "kernels/cpu/subgen_estimator.h"
#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/subgen_sketch.h"
#include "kernels/kv_cache.h"
#include "kernels/policies/policy.h"
#include "device_state_checks.h"
#include "parity_util.h"
#include "workers/engine/cuda_engine.h"
#include "workers/engine/generate.h"
#include "workers/engine/model.h"

namespace kvb {
namespace {

namespace cu = kernels::cuda;
namespace cpu = kernels::cpu;
using kernels::KvCache;

constexpr int kLayers = 2, kLayer = 1, kHeads = 3, kDim = 12;
constexpr uint64_t kSeed = 11;

cpu::SubgenParams params() {
  cpu::SubgenParams p;
  p.head_dim = kDim;
  p.s = 5;
  p.t = 3;
  p.max_clusters = 6;  // small: most heads fill it and force joins
  return p;
}
// Per head: its radius and its slot count; head 1 joins nothing by radius (delta 0, distinct
// keys mostly), head 2 clusters coarsely.
const double kDelta2[kHeads] = {0.75, 0.0, 4.0};
const int kLen[kHeads] = {41, 57, 36};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A host-rows cache (kLayers x kHeads, slot s of head h at position 3s + h, as in a cache whose
// heads evicted differently) with tied keys (few levels) and some zero values, bf16-rounded when
// the device stores bf16 (so the CPU reads the rows the device widens), plus its device copy.
struct Rows : parity::HostAndDeviceRows {
  explicit Rows(cu::KvDtype dtype)
      : HostAndDeviceRows(dtype, kLayers, {kLen, kLen + kHeads}, kDim,
                          [](int l, int h, int s, float* k, float* v) {
                            const uint64_t row = (l * 100 + h) * 1000 + s;
                            for (int i = 0; i < kDim; ++i) {
                              k[i] = std::floor(parity::uniform(row, i, 0.0f, 3.0f)) * 0.5f;
                              v[i] = s % 7 == 0 || (h == 1 && s < 3) ? 0.0f
                                                                     : parity::uniform(row + 7, i);
                            }
                            return 3 * s + h;
                          }) {}
};

// The CPU's sketch of head h after slots [first, end) of layer kLayer.
void cpu_absorb(const KvCache& host, int h, int first, int end, cpu::SubgenSketch& sk) {
  cpu::SubgenParams p = params();
  p.delta2 = kDelta2[h];
  const kernels::LayerKvView v = host.layer(kLayer);
  for (int s = first; s < end; ++s) {
    cpu::subgen_absorb(p, {kSeed, kLayer, static_cast<uint32_t>(10 + h),
                           static_cast<uint64_t>(v.position(h)[s])},
                       v.key(h, s), v.value(h, s), sk);
  }
}

void expect_same_sketch(const cpu::SubgenSketch& got, const cpu::SubgenSketch& want, int h) {
  SCOPED_TRACE("head " + std::to_string(h));
  EXPECT_EQ(got.absorbed, want.absorbed);
  EXPECT_EQ(got.forced, want.forced);
  EXPECT_EQ(std::memcmp(&got.mu, &want.mu, sizeof(double)), 0) << got.mu << " vs " << want.mu;
  EXPECT_EQ(got.counts, want.counts);
  EXPECT_TRUE(same_bits(got.m_keys, want.m_keys)) << "M's keys";
  EXPECT_TRUE(same_bits(got.m_values, want.m_values)) << "M's values";
  EXPECT_TRUE(same_bits(got.reps, want.reps)) << "representatives";
  EXPECT_TRUE(same_bits(got.samples, want.samples)) << "samples";
}

class CudaSubgen : public parity::CudaOpsTest {
 protected:
  // Absorbs [first[h], end[h]) of every head through the ops (fresh: first compression).
  void absorb(policies::SubgenState& st, const Rows& rows, const int* first, const int* end,
              bool fresh) {
    std::vector<policies::SubgenAbsorb> heads;
    for (int h = 0; h < kHeads; ++h) {
      heads.push_back({.head = h, .first = first[h], .end = end[h],
                       .counter_head = static_cast<uint32_t>(10 + h), .fresh = fresh,
                       .delta2 = kDelta2[h]});
    }
    ops_->subgen_absorb(st, kLayer, rows.index, heads, kSeed);
  }
};

TEST_P(CudaSubgen, AbsorbIsTheCpuBitForBit) {
  const Rows rows(GetParam());
  std::unique_ptr<policies::SubgenState> st = ops_->make_subgen_state(params(), kLayers, kHeads);
  const int first[kHeads] = {1, 0, 2}, mid[kHeads] = {17, 30, 2}, end[kHeads] = {40, 57, 35};
  absorb(*st, rows, first, mid, /*fresh=*/true);
  absorb(*st, rows, mid, end, /*fresh=*/false);
  int64_t forced = 0;
  for (int h = 0; h < kHeads; ++h) {
    cpu::SubgenSketch want;
    cpu_absorb(rows.host, h, first[h], end[h], want);
    expect_same_sketch(ops_->read_subgen(*st, kLayer, h), want, h);
    forced += want.forced;
  }
  EXPECT_GT(forced, 0) << "no forced join: the cap's path went untested";
  // The other layer was never asked for: empty, as a fresh CPU sketch.
  EXPECT_EQ(ops_->read_subgen(*st, 0, 0).absorbed, 0);
  // A fresh absorb (a new sequence) forgets the earlier stream.
  const int none[kHeads] = {0, 0, 0}, five[kHeads] = {5, 5, 5};
  absorb(*st, rows, none, five, /*fresh=*/true);
  for (int h = 0; h < kHeads; ++h) {
    cpu::SubgenSketch want;
    cpu_absorb(rows.host, h, 0, 5, want);
    expect_same_sketch(ops_->read_subgen(*st, kLayer, h), want, h);
  }
}

TEST_P(CudaSubgen, BatchedQueryIsTheCpuEstimator) {
  const Rows rows(GetParam());
  std::unique_ptr<policies::SubgenState> st = ops_->make_subgen_state(params(), kLayers, kHeads);
  // Heads 0 and 2 compressed (their first 20 slots absorbed), head 1 exact only.
  const int first[kHeads] = {0, 0, 0}, end[kHeads] = {20, 0, 20};
  absorb(*st, rows, first, end, /*fresh=*/true);
  std::vector<cpu::SubgenSketch> want_sk(kHeads);
  for (int h = 0; h < kHeads; ++h) cpu_absorb(rows.host, h, first[h], end[h], want_sk[h]);
  const int n = 2, num_heads = 2 * kHeads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  const std::vector<float> q = parity::random_vec(static_cast<size_t>(n) * num_heads * kDim, 91);
  cu::DeviceBuffer<float> qd = parity::to_device(q);
  cu::DeviceBuffer<float> outd(q.size());
  const std::vector<uint8_t> compressed = {1, 0, 1};
  ops_->subgen_query(st.get(),
                     {.layer = kLayer, .n = n, .num_heads = num_heads, .head_dim = kDim,
                      .scale = scale, .q = qd.data(), .out = outd.data(),
                      .compressed = compressed},
                     rows.index);
  KVB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<float> want(q.size());
  const kernels::LayerKvView v = rows.host.layer(kLayer);
  cpu::SubgenParams p = params();
  for (int i = 0; i < n; ++i) {
    for (int h = 0; h < num_heads; ++h) {
      const int kvh = h / 2;
      cpu::SubgenQueryArgs a;
      a.q = q.data() + (static_cast<size_t>(i) * num_heads + h) * kDim;
      a.out = want.data() + (static_cast<size_t>(i) * num_heads + h) * kDim;
      a.head_dim = kDim;
      a.scale = scale;
      if (compressed[kvh]) a.sketch = cpu::subgen_view(want_sk[kvh], p);
      a.exact_keys = v.key(kvh, 0);
      a.exact_values = v.value(kvh, 0);
      a.n_exact = kLen[kvh] - n + i + 1;
      cpu::subgen_query(a);
    }
  }
  parity::expect_close(parity::to_host(outd), want, 1e-7, 1e-6, "subgen_query_heads");
}

TEST_P(CudaSubgen, StateClonesDeepAndKeysReadBack) {
  const Rows rows(GetParam());
  policies::SubgenStatePtr st(ops_->make_subgen_state(params(), kLayers, kHeads));
  const int first[kHeads] = {0, 0, 0}, mid[kHeads] = {10, 10, 10}, end[kHeads] = {30, 30, 30};
  absorb(*st, rows, first, mid, /*fresh=*/true);
  policies::SubgenStatePtr fork = st;  // Policy::clone's copy
  absorb(*fork, rows, mid, end, /*fresh=*/false);
  for (int h = 0; h < kHeads; ++h) {
    cpu::SubgenSketch before, after;
    cpu_absorb(rows.host, h, 0, 10, before);
    after = before;
    cpu_absorb(rows.host, h, 10, 30, after);
    expect_same_sketch(ops_->read_subgen(*st, kLayer, h), before, h);
    expect_same_sketch(ops_->read_subgen(*fork, kLayer, h), after, h);
  }
  EXPECT_EQ(st->bytes() > 0, true);
  size_t want_bytes = 0;
  for (int h = 0; h < kHeads; ++h) {
    cpu::SubgenSketch sk;
    cpu_absorb(rows.host, h, 0, 10, sk);
    want_bytes += cpu::subgen_sketch_bytes(sk);
  }
  EXPECT_EQ(st->bytes(), want_bytes);

  const cu::CudaPolicyOps::Transfers t0 = ops_->transfers();
  const std::vector<float> keys = ops_->read_keys(rows.index, kLayer, 2, 4, 9);
  EXPECT_EQ(ops_->transfers().d2h_copies - t0.d2h_copies, 1);
  EXPECT_EQ(ops_->transfers().stream_syncs - t0.stream_syncs, 1);
  const kernels::LayerKvView v = rows.host.layer(kLayer);
  ASSERT_EQ(keys.size(), static_cast<size_t>(9) * kDim);
  EXPECT_EQ(std::memcmp(keys.data(), v.key(2, 4), keys.size() * sizeof(float)), 0);
}

// A fork after the prompt (the clone copies the device sketches, the cache copy its device rows)
// decodes the same tokens to the same logits, bit for bit, as the original does afterwards: the
// two share nothing. The keep-sets follow SubGen's law (sinks and recent window).
TEST(CudaSubgenEngine, ForkedPolicyDecodesAsTheOriginal) {
  parity::ForkRun run;
  std::string why;
  if (!parity::fork_decodes_as_original("subgen", {{"sinks", "1"}, {"recent", "2"}},  // delta auto
                                        9, &run, &why)) {
    GTEST_SKIP() << why;
  }
  const int32_t total = run.tokens;
  for (int l = 0; l < run.num_layers; ++l) {
    const kernels::LayerKvView v = run.cache.layer(l);
    for (int h = 0; h < run.cache.shape().num_kv_heads; ++h) {
      ASSERT_EQ(run.cache.length(l, h), 3) << "layer " << l << " head " << h;
      EXPECT_EQ(std::vector<int32_t>(v.position(h), v.position(h) + 3),
                (std::vector<int32_t>{0, total - 2, total - 1}));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaSubgen,
                         ::testing::Values(cu::KvDtype::kF32, cu::KvDtype::kBf16),
                         [](const auto& info) {
                           return std::string(cu::kv_dtype_name(info.param));
                         });

}  // namespace
}  // namespace kvb
