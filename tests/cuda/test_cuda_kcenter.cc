// subgen_kcenter on the device (CudaPolicyOps::kcenter_keep, erase; subgen_query_heads with a
// bias) against the CPU instance and formula on the same rows (f32 and bf16 device rows, the
// CPU reading their widened copy):
//  - kcenter_keep: the same keep lists (device lists on the plan, no copy, no sync) and the same
//    log-size bias rows, bit for bit, for heads with ties, a head with more centres than points
//    and a head left alone, in three launches for the layer (bf16 keys widened, every head's
//    k-center, the lists' windows and bias rows; two for f32); heads that choose no centre
//    launch only the last;
//  - erase: the same rows as the CPU instance's, across more than one 256-entry chunk;
//  - the batched query with an empty sketch and a bias row per KV head is cpu::subgen_query
//    with that bias (within the single query's parity bounds);
//  - on the GPU engine (stories260K), weighted subgen_kcenter with `decode: slide`, cloned with
//    its cache after the prompt, decodes as the original, bit for bit: the clone deep-copies
//    the device bias rows.
// Skips without a CUDA device (none here: compiled only until a GPU session runs it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <vector>

#include "kernels/cpu/kcenter.h"
#include "kernels/cpu/subgen_estimator.h"
#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/subgen_sketch.h"
#include "kernels/eviction_plan.h"
#include "kernels/kv_cache.h"
#include "kernels/ops/cpu_policy_ops.h"
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
using kernels::EvictionPlan;
using kernels::KvCache;
using policies::SlotRows;
using policies::SlotType;

constexpr int kLayers = 2, kLayer = 1, kHeads = 4, kDim = 10;
const int kLen[kHeads] = {37, 600, 9, 52};

// Host rows and their device copy (an index whose rows live on the device), keys on a coarse
// grid (ties between distances) and bf16-rounded when the device stores bf16.
struct Rows : parity::HostAndDeviceRows {
  explicit Rows(cu::KvDtype dtype)
      : HostAndDeviceRows(dtype, kLayers, {kLen, kLen + kHeads}, kDim,
                          [](int l, int h, int s, float* k, float* v) {
                            const uint64_t row = (l * 100 + h) * 10000 + s;
                            for (int i = 0; i < kDim; ++i) {
                              k[i] = std::floor(parity::uniform(row, i, 0.0f, 4.0f)) * 0.75f;
                              v[i] = parity::uniform(row + 7, i);
                            }
                            return s;
                          }) {}
};

class CudaKCenter : public parity::CudaOpsTest {
 protected:
  kvb::kernels::ops::CpuPolicyOps cpu_;
};

// Head 0: 6 centres of 30 + a window of 7; head 1: 300 of 580 + 20 (a long head); head 2: more
// centres than points (all kept); head 3 keeps everything (not listed).
const policies::KCenterKeep kHeadsToKeep[] = {{.head = 0, .prefix = 30, .k = 6},
                                              {.head = 1, .prefix = 580, .k = 300},
                                              {.head = 2, .prefix = 4, .k = 8}};

TEST_P(CudaKCenter, KeepListsAndLogSizesAreTheCpuInstance) {
  const Rows rows(GetParam());
  std::unique_ptr<SlotRows> cbias = cpu_.make_rows(SlotType::kF32, kLayers, kHeads);
  std::unique_ptr<SlotRows> gbias = ops_->make_rows(SlotType::kF32, kLayers, kHeads);
  EvictionPlan cplan, gplan;
  cplan.reset(kLayer, kHeads);
  gplan.reset(kLayer, kHeads);
  cpu_.kcenter_keep(rows.host, kHeadsToKeep, cbias.get(), cplan);
  const cu::CudaPolicyOps::Transfers t0 = ops_->transfers();
  const int64_t l0 = ops_->launches();
  ops_->kcenter_keep(rows.index, kHeadsToKeep, gbias.get(), gplan);
  EXPECT_EQ(ops_->transfers().d2h_copies, t0.d2h_copies);
  EXPECT_EQ(ops_->transfers().stream_syncs, t0.stream_syncs);
  // The layer's three listed heads in one k-center launch (and one widen launch for bf16).
  EXPECT_EQ(ops_->launches() - l0, GetParam() == cu::KvDtype::kBf16 ? 3 : 2);
  ASSERT_TRUE(gplan.on_device());
  const std::vector<int32_t> lists =
      parity::to_host(gplan.device_slots(), static_cast<size_t>(kHeads) * gplan.device_ld());
  for (int h = 0; h < kHeads; ++h) {
    SCOPED_TRACE(testing::Message() << "head " << h);
    parity::expect_same_keep_list(gplan, lists, cplan, h, kLen[h]);
    EXPECT_EQ(gbias->length(kLayer, h), cbias->length(kLayer, h));
    const std::vector<float> gb = ops_->read_f32(*gbias, kLayer, h);
    const std::vector<float> cb = cpu_.read_f32(*cbias, kLayer, h);
    ASSERT_EQ(gb.size(), cb.size());
    EXPECT_EQ(std::memcmp(gb.data(), cb.data(), gb.size() * sizeof(float)), 0);
  }
  EXPECT_EQ(gplan.device_counts()[3], kLen[3]);  // not listed: keeps everything
}

// k = 0 and an empty prefix choose no centre: the lists are the windows, the bias rows all 0,
// and only the finishing launch runs.
TEST_P(CudaKCenter, HeadsWithoutCentresLaunchOnlyTheFinish) {
  const Rows rows(GetParam());
  const policies::KCenterKeep none[] = {{.head = 0, .prefix = 30, .k = 0},
                                        {.head = 2, .prefix = 0, .k = 5}};
  std::unique_ptr<SlotRows> cbias = cpu_.make_rows(SlotType::kF32, kLayers, kHeads);
  std::unique_ptr<SlotRows> gbias = ops_->make_rows(SlotType::kF32, kLayers, kHeads);
  EvictionPlan cplan, gplan;
  cplan.reset(kLayer, kHeads);
  gplan.reset(kLayer, kHeads);
  cpu_.kcenter_keep(rows.host, none, cbias.get(), cplan);
  const int64_t l0 = ops_->launches();
  ops_->kcenter_keep(rows.index, none, gbias.get(), gplan);
  EXPECT_EQ(ops_->launches() - l0, 1);
  ASSERT_TRUE(gplan.on_device());
  const std::vector<int32_t> lists =
      parity::to_host(gplan.device_slots(), static_cast<size_t>(kHeads) * gplan.device_ld());
  for (int h = 0; h < kHeads; ++h) {
    SCOPED_TRACE(testing::Message() << "head " << h);
    parity::expect_same_keep_list(gplan, lists, cplan, h, kLen[h]);
    EXPECT_EQ(ops_->read_f32(*gbias, kLayer, h), cpu_.read_f32(*cbias, kLayer, h));
  }
}

TEST_P(CudaKCenter, EraseIsTheCpuInstance) {
  const Rows rows(GetParam());
  std::unique_ptr<SlotRows> cbias = cpu_.make_rows(SlotType::kF32, kLayers, kHeads);
  std::unique_ptr<SlotRows> gbias = ops_->make_rows(SlotType::kF32, kLayers, kHeads);
  EvictionPlan cplan, gplan;
  cplan.reset(kLayer, kHeads);
  gplan.reset(kLayer, kHeads);
  cpu_.kcenter_keep(rows.host, kHeadsToKeep, cbias.get(), cplan);
  ops_->kcenter_keep(rows.index, kHeadsToKeep, gbias.get(), gplan);
  // Head 1's row: 320 entries; erase 10 then 1 of them near its start (the 300 after move
  // down across more than one 256-entry chunk), and one entry of head 0 (a slide's victim).
  for (int round = 0; round < 2; ++round) {
    const policies::RowErase erase[] = {{.head = 0, .first = 6, .count = 1},
                                        {.head = 1, .first = 3, .count = round == 0 ? 10 : 1}};
    cpu_.erase(*cbias, kLayer, erase);
    ops_->erase(*gbias, kLayer, erase);
    for (int h = 0; h < kHeads; ++h) {
      SCOPED_TRACE(testing::Message() << "round " << round << " head " << h);
      EXPECT_EQ(gbias->length(kLayer, h), cbias->length(kLayer, h));
      EXPECT_EQ(ops_->read_f32(*gbias, kLayer, h), cpu_.read_f32(*cbias, kLayer, h));
    }
  }
  // A clone is deep: erasing in it leaves the original.
  std::unique_ptr<SlotRows> fork = gbias->clone();
  const policies::RowErase one[] = {{.head = 0, .first = 0, .count = 2}};
  ops_->erase(*fork, kLayer, one);
  EXPECT_EQ(ops_->read_f32(*gbias, kLayer, 0), cpu_.read_f32(*cbias, kLayer, 0));
  EXPECT_EQ(fork->length(kLayer, 0), cbias->length(kLayer, 0) - 2);
}

TEST_P(CudaKCenter, BiasedQueryWithoutASketchIsTheCpuFormula) {
  const Rows rows(GetParam());
  const int n = 3, num_heads = 2 * kHeads, ld = 640;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  const std::vector<float> q = parity::random_vec(static_cast<size_t>(n) * num_heads * kDim, 51);
  // log-size-like biases: 0 for most slots, up to log 40 for some.
  std::vector<float> bias(static_cast<size_t>(kHeads) * ld, 0.0f);
  for (int h = 0; h < kHeads; ++h) {
    for (int s = 0; s < kLen[h]; s += 3) {
      bias[static_cast<size_t>(h) * ld + s] = std::log(1.0f + (s * 7 + h) % 40);
    }
  }
  cu::DeviceBuffer<float> qd = parity::to_device(q), bd = parity::to_device(bias);
  cu::DeviceBuffer<float> outd(q.size());
  const std::vector<uint8_t> none(kHeads, 0);
  std::vector<int32_t> lengths(kLen, kLen + kHeads);
  cu::SubgenQueryHeadsArgs a;
  a.q = qd.data();
  a.out = outd.data();
  a.n = n;
  a.num_heads = num_heads;
  a.head_dim = kDim;
  a.scale = scale;
  a.kv = static_cast<cu::DeviceKvCache*>(rows.index.device_rows())->layer(kLayer);
  a.compressed = none;
  a.lengths = lengths;
  a.exact_bias = bd.data();
  a.bias_ld = ld;
  cu::subgen_query_heads(a, 0);
  KVB_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> want(q.size());
  const kernels::LayerKvView v = rows.host.layer(kLayer);
  for (int i = 0; i < n; ++i) {
    for (int h = 0; h < num_heads; ++h) {
      const int kvh = h / 2;
      cpu::SubgenQueryArgs c;
      c.q = q.data() + (static_cast<size_t>(i) * num_heads + h) * kDim;
      c.out = want.data() + (static_cast<size_t>(i) * num_heads + h) * kDim;
      c.head_dim = kDim;
      c.scale = scale;
      c.exact_keys = v.key(kvh, 0);
      c.exact_values = v.value(kvh, 0);
      c.exact_bias = bias.data() + static_cast<size_t>(kvh) * ld;
      c.n_exact = kLen[kvh] - n + i + 1;
      cpu::subgen_query(c);
    }
  }
  parity::expect_close(parity::to_host(outd), want, 1e-7, 1e-6, "biased subgen_query_heads");
}

// A fork after the prompt decodes the same tokens to the same logits, bit for bit, as the
// original does afterwards (weighted, `slide`: bias rows resized, erased and queried on both),
// and the host keeps no rows for either.
TEST(CudaKCenterEngine, ForkedWeightedSlideDecodesAsTheOriginal) {
  parity::ForkRun run;
  std::string why;
  if (!parity::fork_decodes_as_original(
          "subgen_kcenter", {{"weight_by_cluster_size", "true"}, {"decode", "slide"}}, 0, &run,
          &why)) {
    GTEST_SKIP() << why;
  }
  for (int l = 0; l < run.num_layers; ++l) {
    for (int h = 0; h < run.cache.shape().num_kv_heads; ++h) {
      EXPECT_EQ(run.cache.length(l, h), 16) << "layer " << l << " head " << h;  // the budget
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaKCenter,
                         ::testing::Values(cu::KvDtype::kF32, cu::KvDtype::kBf16),
                         [](const auto& info) {
                           return std::string(cu::kv_dtype_name(info.param));
                         });

}  // namespace
}  // namespace kvb
