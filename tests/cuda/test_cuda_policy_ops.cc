// The policy ops table's two instances (kernels/ops/policy_ops.h): CudaPolicyOps against
// CpuPolicyOps, the reference, on the same inputs. Every op's contract is the CPU's exact bits
// (accumulate keeps reduce_gqa's order; selection is a total order; bits are integers), so the
// comparisons are exact. Keep lists: the CPU writes a victim or a list per head, the device every
// head's list; both must keep the same slots, and the state rows compacted with them must
// match. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/bf16.h"
#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/runtime.h"
#include "kernels/ops/cpu_policy_ops.h"
#include "kernels/policies/policy.h"
#include "kernels/policies/snapkv_family.h"
#include "kernels/policies/snapkv_scores.h"
#include "parity_util.h"
#include "policy_ops_fixture.h"
#include "registry_options.h"

namespace kvb {
namespace {

namespace cu = kernels::cuda;
using kernels::EvictionPlan;
using kernels::KvCache;
using policies::GqaReduce;
using policies::KeepTop;
using policies::SlotRows;
using policies::SlotType;
using policies::WindowReduce;
using PoolKind = kernels::cpu::PoolKind;

class CudaPolicyOpsParity : public parity::PolicyOpsFixture {
 protected:
  // Policy pc's prefill hook for layer 0, once on the CPU's cache with statistics `host` and once
  // on the device's with `dev` (the same statistics where the device ops read them), into cplan
  // and gplan. The caches are make_caches'.
  void prefill_on_both(const policies::PolicyConfig& pc, policies::LayerStats host,
                       policies::LayerStats dev, EvictionPlan* cplan, EvictionPlan* gplan) {
    std::unique_ptr<policies::Policy> cp = policies::make_policy(pc);
    std::unique_ptr<policies::Policy> gp = policies::make_policy(pc);
    const int heads = host_.shape().num_kv_heads;
    host.ops = &cpu_;
    dev.ops = gpu_.get();
    cplan->reset(0, heads);
    gplan->reset(0, heads);
    cp->on_prefill_layer(host, host_, *cplan);
    gp->on_prefill_layer(dev, index_, *gplan);
  }

  // One layer of `heads` KV heads x `len` slots (query heads `group` per KV head): policy `pc`
  // decides once on the CPU's cache and once on the device's, from the same column sums (and,
  // with w > 0, the last w queries' probabilities), into cplan and gplan.
  void decide_on_both(const policies::PolicyConfig& pc, int heads, int group, int len, int w,
                      EvictionPlan* cplan, EvictionPlan* gplan) {
    make_caches(std::vector<int>(heads, len), 2);
    ASSERT_TRUE(policies::make_policy(pc)->decides_with_ops());
    const std::vector<float> col =
        parity::tied_vec(static_cast<size_t>(heads) * group * len, 61, 7);
    const cu::DeviceBuffer<float> dcol = parity::to_device(col);
    const std::vector<float> probs =
        parity::tied_vec(static_cast<size_t>(heads) * group * std::max(w, 1) * len, 83, 6);
    const cu::DeviceBuffer<float> dprobs = parity::to_device(probs);
    policies::LayerStats st;
    st.layer = 0;
    st.n_new = len;
    st.num_heads = heads * group;
    st.stride = len;
    st.col_sums = col.data();
    st.last_w = w;
    st.last_probs = w > 0 ? probs.data() : nullptr;
    policies::LayerStats dev = st;
    dev.col_sums = dcol.data();
    dev.last_probs = w > 0 ? dprobs.data() : nullptr;
    prefill_on_both(pc, st, dev, cplan, gplan);
  }
};

std::vector<float> reduce_rows(const std::vector<float>& src, int head, size_t head_stride,
                               size_t row_stride, int group, int len, GqaReduce how) {
  std::vector<float> out(len);
  policies::reduce_gqa(src.data() + head * head_stride, row_stride, group, len, how, out.data());
  return out;
}

TEST_F(CudaPolicyOpsParity, ResizeAndAccumulateAreTheCpuBits) {
  for (const GqaReduce how : {GqaReduce::kMean, GqaReduce::kMax}) {
    for (const int group : {1, 4}) {
      SCOPED_TRACE(testing::Message() << "group " << group << " max " << (how == GqaReduce::kMax));
      const int heads = 4, stride = 70;
      // Growing, then growing and keeping, then shrinking and growing (resize's truncation).
      const std::vector<std::vector<int32_t>> rounds = {
          {37, 0, 64, 5}, {40, 3, 70, 5}, {12, 9, 70, 1}};
      std::unique_ptr<SlotRows> c = cpu_.make_rows(SlotType::kF32, 2, heads);
      std::unique_ptr<SlotRows> g = gpu_->make_rows(SlotType::kF32, 2, heads);
      // resize_and_accumulate: the device's one launch against the CPU's two ops.
      std::unique_ptr<SlotRows> cf = cpu_.make_rows(SlotType::kF32, 2, heads);
      std::unique_ptr<SlotRows> gf = gpu_->make_rows(SlotType::kF32, 2, heads);
      std::vector<std::vector<float>> want(heads);
      for (int round = 0; round < static_cast<int>(rounds.size()); ++round) {
        const std::vector<int32_t>& lens = rounds[round];
        const std::vector<float> src =
            parity::random_vec(static_cast<size_t>(heads) * group * stride, 11 + round, 0, 1);
        cpu_.resize(*c, 1, lens);
        gpu_->resize(*g, 1, lens);
        const cu::DeviceBuffer<float> d = parity::to_device(src);
        cpu_.accumulate(*c, 1, src.data(), static_cast<size_t>(group) * stride, stride, group, how);
        gpu_->accumulate(*g, 1, d.data(), static_cast<size_t>(group) * stride, stride, group, how);
        cpu_.resize_and_accumulate(*cf, 1, lens, src.data(), static_cast<size_t>(group) * stride,
                                   stride, group, how);
        const int64_t l0 = gpu_->launches();
        gpu_->resize_and_accumulate(*gf, 1, lens, d.data(), static_cast<size_t>(group) * stride,
                                    stride, group, how);
        EXPECT_EQ(gpu_->launches() - l0, 1) << "resize_and_accumulate is one launch";
        for (int h = 0; h < heads; ++h) {
          want[h].resize(lens[h], 0.0f);
          const std::vector<float> add =
              reduce_rows(src, h, static_cast<size_t>(group) * stride, stride, group, lens[h], how);
          for (int s = 0; s < lens[h]; ++s) want[h][s] += add[s];
          EXPECT_EQ(c->length(1, h), lens[h]);
          EXPECT_EQ(g->length(1, h), lens[h]);
          parity::expect_bits(gpu_->read_f32(*g, 1, h), want[h], "device row");
          parity::expect_bits(cpu_.read_f32(*c, 1, h), want[h], "host row");
          EXPECT_EQ(gf->length(1, h), lens[h]);
          parity::expect_bits(gpu_->read_f32(*gf, 1, h), want[h], "device row, fused");
          parity::expect_bits(cpu_.read_f32(*cf, 1, h), want[h], "host row, fused");
        }
        EXPECT_EQ(c->bytes(), g->bytes());
        EXPECT_EQ(cf->bytes(), gf->bytes());
      }
    }
  }
}

// One victim from rows longer than the keep kernel's block (512 threads: several slots per
// thread, every warp holding candidates), with the lowest score tied many times (3 levels: the
// total order picks the earliest of the tied slots) or rarely (1000 levels), with and without a
// window after the prefix; the state row compacted with the list.
TEST_F(CudaPolicyOpsParity, OneVictimOfALongRowIsTheCpuVictim) {
  const std::vector<int> lens = {1500, 700, 2049};
  const int heads = static_cast<int>(lens.size());
  make_caches(lens, 2);
  const std::vector<int32_t> lens32(lens.begin(), lens.end());
  const int stride = 2049;
  for (const int levels : {3, 1000}) {
    SCOPED_TRACE(testing::Message() << "levels " << levels);
    std::unique_ptr<SlotRows> cs = cpu_.make_rows(SlotType::kF32, 1, heads);
    std::unique_ptr<SlotRows> gs = gpu_->make_rows(SlotType::kF32, 1, heads);
    std::unique_ptr<SlotRows> cf = cpu_.make_rows(SlotType::kF32, 1, heads);
    std::unique_ptr<SlotRows> gf = gpu_->make_rows(SlotType::kF32, 1, heads);
    const std::vector<float> tied =
        parity::tied_vec(static_cast<size_t>(heads) * stride, 40 + levels, levels);
    const std::vector<float> state = parity::random_vec(static_cast<size_t>(heads) * stride, 41);
    const cu::DeviceBuffer<float> dt = parity::to_device(tied), ds = parity::to_device(state);
    cpu_.resize(*cs, 0, lens32);
    cpu_.resize(*cf, 0, lens32);
    gpu_->resize(*gs, 0, lens32);
    gpu_->resize(*gf, 0, lens32);
    cpu_.accumulate(*cs, 0, tied.data(), stride, stride, 1, GqaReduce::kMean);
    gpu_->accumulate(*gs, 0, dt.data(), stride, stride, 1, GqaReduce::kMean);
    cpu_.accumulate(*cf, 0, state.data(), stride, stride, 1, GqaReduce::kMean);
    gpu_->accumulate(*gf, 0, ds.data(), stride, stride, 1, GqaReduce::kMean);
    const std::vector<KeepTop> tops = {
        {.head = 0, .score_head = 0, .len = 1500, .prefix = 1500, .k = 1499},
        {.head = 1, .score_head = 1, .len = 700, .prefix = 650, .k = 649},
        {.head = 2, .score_head = 2, .len = 2049, .prefix = 2040, .k = 2039},
    };
    EvictionPlan cplan, gplan;
    cplan.reset(0, heads);
    gplan.reset(0, heads);
    SlotRows* cstate[] = {cf.get()};
    SlotRows* gstate[] = {gf.get()};
    cpu_.keep_top(*cs, 0, host_, tops, cstate, cplan);
    gpu_->keep_top(*gs, 0, index_, tops, gstate, gplan);
    ASSERT_TRUE(gplan.on_device());
    const std::vector<int32_t> lists =
        parity::to_host(gplan.device_slots(), static_cast<size_t>(heads) * gplan.device_ld());
    std::vector<int32_t> want;
    for (int h = 0; h < heads; ++h) {
      SCOPED_TRACE(testing::Message() << "head " << h);
      EXPECT_EQ(cplan.kind(h), EvictionPlan::Kind::kVictim);
      cplan.keep_list(h, lens[h], &want);
      ASSERT_EQ(static_cast<int>(want.size()), lens[h] - 1);
      ASSERT_EQ(gplan.device_counts()[h], lens[h] - 1);
      const std::vector<int32_t> got(
          lists.begin() + static_cast<size_t>(h) * gplan.device_ld(),
          lists.begin() + static_cast<size_t>(h) * gplan.device_ld() + want.size());
      EXPECT_EQ(got, want);
      std::vector<float> kept;
      for (int32_t s : want) kept.push_back(state[static_cast<size_t>(h) * stride + s]);
      parity::expect_bits(gpu_->read_f32(*gf, 0, h), kept, "compacted f32 state");
    }
  }
}

// Scores with many ties, every kind of head decision (none, k = 0, one victim, a list, the
// whole prefix but one), and two state rows compacted with the lists.
TEST_F(CudaPolicyOpsParity, KeepTopKeepsTheCpuSlotsAndCompactsTheState) {
  const std::vector<int> lens = {30, 12, 0, 50, 9, 64};
  const int heads = static_cast<int>(lens.size());
  make_caches(lens, 4);
  const std::vector<int32_t> lens32(lens.begin(), lens.end());
  std::unique_ptr<SlotRows> cs = cpu_.make_rows(SlotType::kF32, 1, heads);
  std::unique_ptr<SlotRows> gs = gpu_->make_rows(SlotType::kF32, 1, heads);
  std::unique_ptr<SlotRows> cf = cpu_.make_rows(SlotType::kF32, 1, heads);
  std::unique_ptr<SlotRows> gf = gpu_->make_rows(SlotType::kF32, 1, heads);
  std::unique_ptr<SlotRows> cb = cpu_.make_rows(SlotType::kU64, 1, heads);
  std::unique_ptr<SlotRows> gb = gpu_->make_rows(SlotType::kU64, 1, heads);
  // A third state row: past the two the keep kernel compacts itself, its own launch.
  std::unique_ptr<SlotRows> c3 = cpu_.make_rows(SlotType::kF32, 1, heads);
  std::unique_ptr<SlotRows> g3 = gpu_->make_rows(SlotType::kF32, 1, heads);
  const int stride = 64;
  const std::vector<float> tied = parity::tied_vec(static_cast<size_t>(heads) * stride, 5, 4);
  const std::vector<float> state = parity::random_vec(static_cast<size_t>(heads) * stride, 6);
  const cu::DeviceBuffer<float> dt = parity::to_device(tied), ds = parity::to_device(state);
  for (SlotRows* r : {cs.get(), cf.get()}) cpu_.resize(*r, 0, lens32);
  for (SlotRows* r : {gs.get(), gf.get()}) gpu_->resize(*r, 0, lens32);
  cpu_.resize(*cb, 0, lens32);
  gpu_->resize(*gb, 0, lens32);
  cpu_.accumulate(*cs, 0, tied.data(), stride, stride, 1, GqaReduce::kMean);
  gpu_->accumulate(*gs, 0, dt.data(), stride, stride, 1, GqaReduce::kMean);
  cpu_.accumulate(*cf, 0, state.data(), stride, stride, 1, GqaReduce::kMean);
  gpu_->accumulate(*gf, 0, ds.data(), stride, stride, 1, GqaReduce::kMean);
  cpu_.resize_and_accumulate(*c3, 0, lens32, tied.data(), stride, stride, 1, GqaReduce::kMean);
  gpu_->resize_and_accumulate(*g3, 0, lens32, dt.data(), stride, stride, 1, GqaReduce::kMean);
  const std::vector<KeepTop> tops = {
      {.head = 0, .score_head = 0, .len = 30, .prefix = 20, .k = 7},   // a list + a window
      {.head = 1, .score_head = 1, .len = 12, .prefix = 12, .k = 11},  // one victim
      {.head = 3, .score_head = 3, .len = 50, .prefix = 45, .k = 0},   // only the window
      {.head = 4, .score_head = 4, .len = 9, .prefix = 1, .k = 0},     // slot 0 goes
      {.head = 5, .score_head = 0, .len = 64, .prefix = 30, .k = 29},  // another head's scores
  };
  EvictionPlan cplan, gplan;
  cplan.reset(0, heads);
  gplan.reset(0, heads);
  SlotRows* cstate[] = {cf.get(), cb.get(), c3.get()};
  SlotRows* gstate[] = {gf.get(), gb.get(), g3.get()};
  cpu_.keep_top(*cs, 0, host_, tops, cstate, cplan);
  const int64_t l0 = gpu_->launches();
  gpu_->keep_top(*gs, 0, index_, tops, gstate, gplan);
  EXPECT_EQ(gpu_->launches() - l0, 2) << "two states in the keep kernel, the third apart";
  ASSERT_TRUE(gplan.on_device());
  ASSERT_FALSE(cplan.on_device());
  EXPECT_EQ(cplan.kind(1), EvictionPlan::Kind::kVictim);
  const std::vector<int32_t> lists =
      parity::to_host(gplan.device_slots(), static_cast<size_t>(heads) * gplan.device_ld());
  std::vector<int32_t> want;
  for (int h = 0; h < heads; ++h) {
    SCOPED_TRACE(testing::Message() << "head " << h);
    want = parity::expect_same_keep_list(gplan, lists, cplan, h, lens[h]);
    ASSERT_EQ(gplan.device_counts()[h], static_cast<int>(want.size()));
    EXPECT_EQ(gplan.length_after(h, lens[h]), cplan.length_after(h, lens[h]));
    // The state rows follow the lists: entry j is the old entry want[j].
    std::vector<float> kept;
    for (int32_t s : want) kept.push_back(state[static_cast<size_t>(h) * stride + s]);
    parity::expect_bits(gpu_->read_f32(*gf, 0, h), kept, "compacted f32 state");
    parity::expect_bits(cpu_.read_f32(*cf, 0, h), kept, "compacted f32 state (cpu)");
    EXPECT_EQ(gpu_->read_u64(*gb, 0, h), cpu_.read_u64(*cb, 0, h));
    EXPECT_EQ(gf->length(0, h), cf->length(0, h));
    EXPECT_EQ(gb->length(0, h), cb->length(0, h));
    std::vector<float> kept3;
    for (int32_t s : want) kept3.push_back(tied[static_cast<size_t>(h) * stride + s]);
    parity::expect_bits(gpu_->read_f32(*g3, 0, h), kept3, "third state, its own launch");
    parity::expect_bits(cpu_.read_f32(*c3, 0, h), kept3, "third state (cpu)");
  }
  // Applied to the index and the device rows, the engine's way: the same positions as the host
  // cache under the CPU plan.
  host_.apply(cplan);
  index_.apply(gplan);
  auto* rows = dynamic_cast<cu::DeviceKvCache*>(index_.device_rows());
  ASSERT_NE(rows, nullptr);
  rows->keep_slots(0, gplan.device_slots(), gplan.device_ld(), gplan.device_counts().data(),
                   stream_, /*validated=*/true);
  EXPECT_TRUE(index_.positions_stale(0));
  for (int h = 0; h < heads; ++h) {
    ASSERT_EQ(index_.length(0, h), host_.length(0, h));
    const int32_t* a = index_.layer(0).position(h);  // read back from the device once
    const int32_t* b = host_.layer(0).position(h);
    EXPECT_EQ(std::vector<int32_t>(a, a + host_.length(0, h)),
              std::vector<int32_t>(b, b + host_.length(0, h)));
  }
  EXPECT_EQ(index_.position_reads(), 1);
  EXPECT_FALSE(index_.positions_stale(0));
}

// H2O's call: the state is the score rows themselves. Where every deciding head reads its own
// row, the keep kernel compacts each row after its block's decision; where a head reads another
// head's row, the compaction waits for its own launch after every decision. Both: the CPU's
// slots and rows.
TEST_F(CudaPolicyOpsParity, KeepTopCompactsTheScoreRowsItDecidesBy) {
  const std::vector<int> lens = {30, 12, 50, 1025};
  const int heads = static_cast<int>(lens.size());
  const std::vector<int32_t> lens32(lens.begin(), lens.end());
  const int stride = 1025;
  const std::vector<float> tied = parity::tied_vec(static_cast<size_t>(heads) * stride, 7, 5);
  const cu::DeviceBuffer<float> dt = parity::to_device(tied);
  for (const bool own : {true, false}) {
    SCOPED_TRACE(testing::Message() << "own rows " << own);
    make_caches(lens, 2);
    std::unique_ptr<SlotRows> cs = cpu_.make_rows(SlotType::kF32, 1, heads);
    std::unique_ptr<SlotRows> gs = gpu_->make_rows(SlotType::kF32, 1, heads);
    cpu_.resize_and_accumulate(*cs, 0, lens32, tied.data(), stride, stride, 1, GqaReduce::kMean);
    gpu_->resize_and_accumulate(*gs, 0, lens32, dt.data(), stride, stride, 1, GqaReduce::kMean);
    const std::vector<KeepTop> tops = {
        {.head = 0, .score_head = 0, .len = 30, .prefix = 20, .k = 7},  // a list + a window
        {.head = 1, .score_head = own ? 1 : 3, .len = 12, .prefix = 12, .k = 11},  // one victim
        {.head = 3, .score_head = 3, .len = 1025, .prefix = 1000, .k = 999},       // one victim
    };
    EvictionPlan cplan, gplan;
    cplan.reset(0, heads);
    gplan.reset(0, heads);
    SlotRows* cstate[] = {cs.get()};
    SlotRows* gstate[] = {gs.get()};
    cpu_.keep_top(*cs, 0, host_, tops, cstate, cplan);
    const int64_t l0 = gpu_->launches();
    gpu_->keep_top(*gs, 0, index_, tops, gstate, gplan);
    EXPECT_EQ(gpu_->launches() - l0, own ? 1 : 2) << "the keep kernel compacts its own rows";
    ASSERT_TRUE(gplan.on_device());
    const std::vector<int32_t> lists =
        parity::to_host(gplan.device_slots(), static_cast<size_t>(heads) * gplan.device_ld());
    std::vector<int32_t> want;
    for (int h = 0; h < heads; ++h) {
      SCOPED_TRACE(testing::Message() << "head " << h);
      want = parity::expect_same_keep_list(gplan, lists, cplan, h, lens[h]);
      ASSERT_EQ(gplan.device_counts()[h], static_cast<int>(want.size()));
      EXPECT_EQ(gs->length(0, h), cs->length(0, h));
      std::vector<float> kept;
      for (int32_t s : want) kept.push_back(tied[static_cast<size_t>(h) * stride + s]);
      parity::expect_bits(gpu_->read_f32(*gs, 0, h), kept, "compacted scores");
      parity::expect_bits(cpu_.read_f32(*cs, 0, h), kept, "compacted scores (cpu)");
    }
  }
}

TEST_F(CudaPolicyOpsParity, HistoryBitsAndCountersAreTheCpuBits) {
  for (const bool inv_position : {false, true}) {
    SCOPED_TRACE(testing::Message() << "inv_position " << inv_position);
    const int heads = 2, num_heads = 8, history = 5;
    // A prompt block of 40 (3 recorded queries), then one decode step.
    make_caches({40, 40}, 2);
    std::unique_ptr<SlotRows> cb = cpu_.make_rows(SlotType::kU64, 1, heads);
    std::unique_ptr<SlotRows> gb = gpu_->make_rows(SlotType::kU64, 1, heads);
    for (int step = 0; step < 2; ++step) {
      policies::LayerStats st;
      st.layer = 0;
      st.num_heads = num_heads;
      st.n_new = step == 0 ? 40 : 1;
      st.last_w = step == 0 ? 3 : 1;
      st.stride = host_.length(0, 0);
      // Probabilities around the threshold, 1 / visible or 1 / (position + 1) (positions are
      // about 3 per slot here), so both sides of every threshold occur. (Drawn around
      // 1 / visible for both, the inv_position case set no bit on an H200: its threshold is
      // three times lower.)
      const float around = inv_position ? 1.0f / (3.0f * st.stride) : 1.0f / st.stride;
      const std::vector<float> probs = parity::random_vec(
          static_cast<size_t>(num_heads) * st.last_w * st.stride, 21 + step, 0.0f, 2.0f * around);
      const cu::DeviceBuffer<float> dp = parity::to_device(probs);
      st.last_probs = probs.data();
      cpu_.history_bits(*cb, st, host_, history, inv_position);
      st.last_probs = dp.data();
      gpu_->history_bits(*gb, st, index_, history, inv_position);
      for (int h = 0; h < heads; ++h) ASSERT_EQ(gb->length(0, h), cb->length(0, h));
      std::unique_ptr<SlotRows> cn = cpu_.make_rows(SlotType::kF32, 1, heads);
      std::unique_ptr<SlotRows> gn = gpu_->make_rows(SlotType::kF32, 1, heads);
      negated_popcount(cpu_, *cb, 0, *cn, 0);
      negated_popcount(*gpu_, *gb, 0, *gn, 0);
      for (int h = 0; h < heads; ++h) {
        const std::vector<uint64_t> bits = gpu_->read_u64(*gb, 0, h);
        EXPECT_EQ(bits, cpu_.read_u64(*cb, 0, h));
        std::vector<float> want(bits.size());
        int set = 0;
        for (size_t s = 0; s < bits.size(); ++s) {
          EXPECT_LT(bits[s], uint64_t{1} << history);
          want[s] = -static_cast<float>(__builtin_popcountll(bits[s]));
          set += bits[s] != 0;
        }
        EXPECT_GT(set, 0);  // the thresholds bite
        parity::expect_bits(gpu_->read_f32(*gn, 0, h), want, "negated popcount");
        parity::expect_bits(cpu_.read_f32(*cn, 0, h), want, "negated popcount (cpu)");
      }
      if (step == 0) {  // the decode step's token
        std::vector<float> k(8, 0.5f);
        for (int h = 0; h < heads; ++h) {
          host_.append(0, h, k.data(), k.data(), 200 + h);
        }
        // Device: the same token, head by head (positions 200 + h).
        auto* rows = dynamic_cast<cu::DeviceKvCache*>(index_.device_rows());
        const cu::DeviceBuffer<float> dk = parity::to_device(std::vector<float>(8, 0.5f));
        for (int h = 0; h < heads; ++h) {
          rows->append(0, h, dk.data(), dk.data(), 200 + h);
          index_.append(0, h, nullptr, nullptr, 200 + h);
        }
        KVB_CUDA_CHECK(cudaDeviceSynchronize());
      }
    }
    EXPECT_EQ(cb->bytes(), size_t(2 * 41 * 8));
    EXPECT_EQ(gb->bytes(), cb->bytes());
  }
}

// Knorm's state: the negated norms of the block's pre-RoPE keys appended per cache head, with
// GQA expansion (4 cache heads reading 2 model heads); a prompt block, then one decode token.
TEST_F(CudaPolicyOpsParity, KeyNormsMatchTheCpuWithinAnUlp) {
  const int model_kv = 2, heads = 4, d = 64;
  std::unique_ptr<SlotRows> c = cpu_.make_rows(SlotType::kF32, 1, heads);
  std::unique_ptr<SlotRows> g = gpu_->make_rows(SlotType::kF32, 1, heads);
  // Index-only caches: the norms read only lengths and the keys' width.
  host_ = KvCache({1, heads, d}, 40, /*host_rows=*/false);
  index_ = KvCache({1, heads, d}, 40, /*host_rows=*/false);
  for (int step = 0; step < 2; ++step) {
    const int n = step == 0 ? 30 : 1;
    for (int h = 0; h < heads; ++h) {
      for (int t = 0; t < n; ++t) {
        host_.append(0, h, nullptr, nullptr, t);
        index_.append(0, h, nullptr, nullptr, t);
      }
    }
    const std::vector<float> keys =
        parity::random_vec(static_cast<size_t>(n) * model_kv * d, 31 + step);
    const cu::DeviceBuffer<float> dk = parity::to_device(keys);
    policies::LayerStats st;
    st.layer = 0;
    st.n_new = n;
    st.pre_rope_keys = keys.data();
    append_negated_key_norms(cpu_, *c, st, host_, model_kv, heads / model_kv);
    st.pre_rope_keys = dk.data();
    append_negated_key_norms(*gpu_, *g, st, index_, model_kv, heads / model_kv);
    for (int h = 0; h < heads; ++h) {
      ASSERT_EQ(g->length(0, h), c->length(0, h));
      parity::expect_close(gpu_->read_f32(*g, 0, h), cpu_.read_f32(*c, 0, h), 0, 1.2e-7,
                           "negated key norms");
    }
  }
  // Expanded heads 0 and 1 read model head 0: the same norms.
  EXPECT_EQ(gpu_->read_f32(*g, 0, 0), gpu_->read_f32(*g, 0, 1));
}

// The SnapKV family's window scores over ragged heads (prefixes 0, 1, < w, long), every option
// combination: window sum/mean, GQA mean/max, pool max/avg, kernels 1 and 7, groups 1 and 4,
// w 1 and 32; the same rows written twice (a longer prefix after a shorter one grows them).
TEST_F(CudaPolicyOpsParity, WindowScoresAreTheCpuBits) {
  const std::vector<int> lens = {100, 33, 5, 0, 64, 1};
  const int heads = static_cast<int>(lens.size()), stride = 100;
  make_caches(lens, 2);
  for (const int group : {1, 4}) {
    for (const int w : {1, 32}) {
      const int num_heads = heads * group;
      // Probabilities in [0, 1) (the attention's), and a tied set (few levels: pooling ties).
      const std::vector<float> probs =
          parity::random_vec(static_cast<size_t>(num_heads) * w * stride, 50 + w + group, 0, 1);
      const cu::DeviceBuffer<float> dp = parity::to_device(probs);
      policies::LayerStats st;
      st.layer = 0;
      st.num_heads = num_heads;
      st.stride = stride;
      st.last_w = w;
      st.n_new = w;
      for (const WindowReduce wr : {WindowReduce::kMean, WindowReduce::kSum}) {
        for (const GqaReduce gr : {GqaReduce::kMean, GqaReduce::kMax}) {
          for (const int kernel : {1, 7}) {
            for (const PoolKind kind : {PoolKind::kMax, PoolKind::kAvg}) {
              SCOPED_TRACE(testing::Message()
                           << "group " << group << " w " << w << " sum "
                           << (wr == WindowReduce::kSum) << " gqa max " << (gr == GqaReduce::kMax)
                           << " kernel " << kernel << " avg " << (kind == PoolKind::kAvg));
              policies::SnapKvScoreOptions o;
              o.window_reduce = wr;
              o.gqa_reduce = gr;
              o.pool_kernel = kernel;
              o.pooling = kind;
              std::unique_ptr<SlotRows> c = cpu_.make_rows(SlotType::kF32, 2, heads);
              std::unique_ptr<SlotRows> g = gpu_->make_rows(SlotType::kF32, 2, heads);
              st.last_probs = probs.data();
              window_scores(cpu_, *c, 1, st, host_, o);
              st.last_probs = dp.data();
              window_scores(*gpu_, *g, 1, st, index_, o);
              for (int h = 0; h < heads; ++h) {
                ASSERT_EQ(c->length(1, h), std::max(0, lens[h] - w));
                ASSERT_EQ(g->length(1, h), c->length(1, h));
                parity::expect_bits(gpu_->read_f32(*g, 1, h), cpu_.read_f32(*c, 1, h),
                                    "window scores");
              }
            }
          }
        }
      }
    }
  }
  // Rows that held a short prefix grow to a longer one (w 32, then w 1).
  std::unique_ptr<SlotRows> c = cpu_.make_rows(SlotType::kF32, 1, heads);
  std::unique_ptr<SlotRows> g = gpu_->make_rows(SlotType::kF32, 1, heads);
  for (const int w : {32, 1}) {
    const std::vector<float> probs =
        parity::tied_vec(static_cast<size_t>(heads) * w * stride, 60 + w, 3);
    const cu::DeviceBuffer<float> dp = parity::to_device(probs);
    policies::LayerStats st;
    st.num_heads = heads;
    st.stride = stride;
    st.last_w = w;
    st.last_probs = probs.data();
    window_scores(cpu_, *c, 0, st, host_, {});
    st.last_probs = dp.data();
    window_scores(*gpu_, *g, 0, st, index_, {});
    for (int h = 0; h < heads; ++h) {
      parity::expect_bits(gpu_->read_f32(*g, 0, h), cpu_.read_f32(*c, 0, h), "regrown rows");
    }
  }
}

// The vocabulary ops window_scores is made of, each on its own: ragged lengths, groups of 1, 2
// and 4 rows, the three window reductions (Finch's weighted mean among them), mean and max,
// pooling kernels 1, 3 and 7 of both kinds, on tied values (so max and ties are exercised); one
// launch each, none for rows that are all empty; window_scores is the
// three (3 launches).
TEST_F(CudaPolicyOpsParity, VocabularyOpsAreTheCpuBits) {
  make_caches({40, 3, 0, 17}, 1);  // window_scores' composition below reads these lengths
  const int stride = 48;
  for (const int group : {1, 2, 4}) {
    const int kv = 4, q = kv * group;
    for (const int w : {1, 5}) {
      const std::vector<float> probs =
          parity::tied_vec(static_cast<size_t>(q) * w * stride, 90 + w + group, 5);
      const cu::DeviceBuffer<float> dp = parity::to_device(probs);
      policies::LayerStats st;
      st.num_heads = q;
      st.stride = stride;
      st.last_w = w;
      st.n_new = w;
      std::vector<int32_t> lengths(q);
      for (int h = 0; h < q; ++h) lengths[h] = std::vector<int32_t>{40, 3, 0, 17}[h / group];
      for (const WindowReduce wr :
           {WindowReduce::kMean, WindowReduce::kSum, WindowReduce::kWeightedMean}) {
        SCOPED_TRACE(testing::Message() << "group " << group << " w " << w << " reduce "
                                        << static_cast<int>(wr));
        std::unique_ptr<SlotRows> c = cpu_.make_rows(SlotType::kF32, 1, q);
        std::unique_ptr<SlotRows> g = gpu_->make_rows(SlotType::kF32, 1, q);
        st.last_probs = probs.data();
        cpu_.window_sum(*c, 0, st, lengths, wr);
        st.last_probs = dp.data();
        int64_t l0 = gpu_->launches();
        gpu_->window_sum(*g, 0, st, lengths, wr);
        EXPECT_EQ(gpu_->launches() - l0, 1);
        for (int h = 0; h < q; ++h) {
          ASSERT_EQ(g->length(0, h), lengths[h]);
          parity::expect_bits(gpu_->read_f32(*g, 0, h), cpu_.read_f32(*c, 0, h), "window sums");
        }
        if (w > 1) {  // the window's first w - 1 rows alone (Finch's question before the tail)
          std::unique_ptr<SlotRows> cf = cpu_.make_rows(SlotType::kF32, 1, q);
          std::unique_ptr<SlotRows> gf = gpu_->make_rows(SlotType::kF32, 1, q);
          st.last_probs = probs.data();
          cpu_.window_sum(*cf, 0, st, lengths, wr, w - 1);
          st.last_probs = dp.data();
          gpu_->window_sum(*gf, 0, st, lengths, wr, w - 1);
          for (int h = 0; h < q; ++h) {
            parity::expect_bits(gpu_->read_f32(*gf, 0, h), cpu_.read_f32(*cf, 0, h),
                                "window sums of the first rows");
          }
        }
        for (const GqaReduce gr : {GqaReduce::kMean, GqaReduce::kMax}) {
          std::unique_ptr<SlotRows> cr = cpu_.make_rows(SlotType::kF32, 1, kv);
          std::unique_ptr<SlotRows> gr_rows = gpu_->make_rows(SlotType::kF32, 1, kv);
          cpu_.reduce_heads(*c, 0, group, gr, *cr, 0);
          l0 = gpu_->launches();
          gpu_->reduce_heads(*g, 0, group, gr, *gr_rows, 0);
          EXPECT_EQ(gpu_->launches() - l0, 1);
          for (int h = 0; h < kv; ++h) {
            parity::expect_bits(gpu_->read_f32(*gr_rows, 0, h), cpu_.read_f32(*cr, 0, h),
                                "reduced rows");
          }
          for (const int kernel : {1, 3, 7}) {
            for (const PoolKind kind : {PoolKind::kMax, PoolKind::kAvg}) {
              std::unique_ptr<SlotRows> cp = cpu_.make_rows(SlotType::kF32, 1, kv);
              std::unique_ptr<SlotRows> gp = gpu_->make_rows(SlotType::kF32, 1, kv);
              cpu_.pool(*cr, 0, *cp, 0, kernel, kind);
              gpu_->pool(*gr_rows, 0, *gp, 0, kernel, kind);
              for (int h = 0; h < kv; ++h) {
                parity::expect_bits(gpu_->read_f32(*gp, 0, h), cpu_.read_f32(*cp, 0, h),
                                    "pooled rows");
              }
            }
          }
        }
      }
      if (group == 2 && w == 5) {  // the composition: three launches, the CPU's bits
        std::unique_ptr<SlotRows> c = cpu_.make_rows(SlotType::kF32, 1, kv);
        std::unique_ptr<SlotRows> g = gpu_->make_rows(SlotType::kF32, 1, kv);
        policies::WindowScratch scratch;
        st.last_probs = probs.data();
        window_scores(cpu_, *c, 0, st, host_, {});
        st.last_probs = dp.data();
        const int64_t l0 = gpu_->launches();
        window_scores(*gpu_, *g, 0, scratch, st, index_, {});
        EXPECT_EQ(gpu_->launches() - l0, 3);
        for (int h = 0; h < kv; ++h) {
          parity::expect_bits(gpu_->read_f32(*g, 0, h), cpu_.read_f32(*c, 0, h), "composed");
        }
      }
    }
  }
  // Rows that are all empty launch nothing.
  policies::LayerStats st;
  const cu::DeviceBuffer<float> dp = parity::to_device(std::vector<float>(4, 1.0f));
  st.num_heads = 2;
  st.stride = 2;
  st.last_w = 1;
  st.last_probs = dp.data();
  std::unique_ptr<SlotRows> g = gpu_->make_rows(SlotType::kF32, 1, 2);
  std::unique_ptr<SlotRows> r = gpu_->make_rows(SlotType::kF32, 1, 1);
  std::unique_ptr<SlotRows> p = gpu_->make_rows(SlotType::kF32, 1, 1);
  const int64_t l0 = gpu_->launches();
  gpu_->window_sum(*g, 0, st, std::vector<int32_t>{0, 0}, WindowReduce::kSum);
  gpu_->reduce_heads(*g, 0, 2, GqaReduce::kMean, *r, 0);
  gpu_->pool(*r, 0, *p, 0, 7, PoolKind::kMax);
  EXPECT_EQ(gpu_->launches(), l0);
  EXPECT_EQ(p->length(0, 0), 0);
}

// Ada-KV's budgets from the same score rows on both instances (tied scores, so the position and
// head tie-breaks decide), for several bases and alphas; one D2H copy and one sync per call, and
// none when no head has a prefix.
TEST_F(CudaPolicyOpsParity, AdaHeadBudgetsAreTheCpuBudgets) {
  const std::vector<int> lens = {100, 33, 5, 0, 64, 1, 100, 80};
  const int heads = static_cast<int>(lens.size()), stride = 100;
  make_caches(lens, 2);
  for (const int group : {1, 4}) {
    for (const int w : {1, 32}) {
      const int num_heads = heads * group;
      const std::vector<float> probs =
          parity::tied_vec(static_cast<size_t>(num_heads) * w * stride, 70 + w + group, 4);
      const cu::DeviceBuffer<float> dp = parity::to_device(probs);
      policies::LayerStats st;
      st.num_heads = num_heads;
      st.stride = stride;
      st.last_w = w;
      policies::SnapKvScoreOptions o;  // defaults: mean, mean, max pool of 7
      std::unique_ptr<SlotRows> c = cpu_.make_rows(SlotType::kF32, 1, heads);
      std::unique_ptr<SlotRows> g = gpu_->make_rows(SlotType::kF32, 1, heads);
      st.last_probs = probs.data();
      window_scores(cpu_, *c, 0, st, host_, o);
      st.last_probs = dp.data();
      window_scores(*gpu_, *g, 0, st, index_, o);
      for (const int base : {0, 1, 7, 30, 1000}) {
        for (const double alpha : {0.0, 0.5}) {
          SCOPED_TRACE(testing::Message() << "group " << group << " w " << w << " base " << base
                                          << " alpha " << alpha);
          const cu::CudaPolicyOps::Transfers t0 = gpu_->transfers();
          const std::vector<int32_t> got = ada_head_budgets(*gpu_, *g, 0, index_, 0, base, alpha);
          const cu::CudaPolicyOps::Transfers t1 = gpu_->transfers();
          EXPECT_EQ(got, ada_head_budgets(cpu_, *c, 0, host_, 0, base, alpha));
          EXPECT_EQ(t1.d2h_copies - t0.d2h_copies, 1);
          EXPECT_EQ(t1.stream_syncs - t0.stream_syncs, 1);
          EXPECT_EQ(t1.d2h_bytes - t0.d2h_bytes, heads * sizeof(int32_t));
        }
      }
    }
  }
  std::unique_ptr<SlotRows> empty = gpu_->make_rows(SlotType::kF32, 1, heads);
  const cu::CudaPolicyOps::Transfers t0 = gpu_->transfers();
  EXPECT_EQ(ada_head_budgets(*gpu_, *empty, 0, index_, 0, 5, 0.5), std::vector<int32_t>(heads, 0));
  EXPECT_EQ(gpu_->transfers().d2h_copies, t0.d2h_copies);
}

// Every SnapKV-family member deciding one layer through each instance: the same head budgets
// and the same kept slots (the CPU's host lists against the device's lists), GQA group 4.
TEST_F(CudaPolicyOpsParity, SnapKvFamilyDecidesAsOnTheCpu) {
  const int heads = 4, group = 4, len = 120, layers = 2;
  const std::vector<std::pair<std::string, std::map<std::string, std::string>>> cases = {
      {"snapkv", {}},
      {"pyramidkv", {}},
      {"ada_snapkv", {}},
      {"ada_pyramidkv", {}},
      {"pyramidkv", {{"formula", "kvpress"}, {"beta", "2"}}},  // kvpress's per-layer budgets
  };
  for (const auto& [name, options] : cases) {
    SCOPED_TRACE(name + (options.empty() ? "" : " formula=kvpress"));
    make_caches(std::vector<int>(heads, len), 2);
    policies::PolicyConfig pc;
    pc.name = name;
    pc.kv_budget = 40;
    pc.budget_fraction = options.empty() ? 0 : 0.3125;  // 37.5 of 120: round() to 38
    pc.options = policies::PolicyOptions(options);
    pc.shape = {layers, heads * group, heads, 8, 256};
    std::unique_ptr<policies::Policy> cp = policies::make_policy(pc);
    std::unique_ptr<policies::Policy> gp = policies::make_policy(pc);
    auto* cf = dynamic_cast<policies::SnapKvFamily*>(cp.get());
    auto* gf = dynamic_cast<policies::SnapKvFamily*>(gp.get());
    ASSERT_TRUE(cf && gf && gp->decides_with_ops());
    const int w = cf->window();
    const std::vector<float> probs = parity::tied_vec(static_cast<size_t>(heads) * group * w * len,
                                                      80 + static_cast<int>(pc.name.size()), 6);
    const cu::DeviceBuffer<float> dp = parity::to_device(probs);
    policies::LayerStats st;
    st.layer = 0;  // the caches have one layer; the policy's layer 0 of 2
    st.n_new = len;
    st.num_heads = heads * group;
    st.stride = len;
    st.last_w = w;
    st.last_probs = probs.data();
    st.ops = &cpu_;
    EvictionPlan cplan, gplan;
    cplan.reset(0, heads);
    gplan.reset(0, heads);
    cp->on_prefill_layer(st, host_, cplan);
    st.last_probs = dp.data();
    st.ops = gpu_.get();
    gp->on_prefill_layer(st, index_, gplan);
    EXPECT_EQ(gf->head_budgets(0), cf->head_budgets(0));
    ASSERT_TRUE(gplan.on_device());
    const std::vector<int32_t> lists =
        parity::to_host(gplan.device_slots(), static_cast<size_t>(heads) * gplan.device_ld());
    std::vector<int32_t> want;
    for (int h = 0; h < heads; ++h) {
      SCOPED_TRACE(testing::Message() << "head " << h);
      cplan.keep_list(h, len, &want);
      EXPECT_EQ(static_cast<int>(want.size()), cf->head_budgets(0)[h] + w);
      ASSERT_EQ(gplan.device_counts()[h], static_cast<int>(want.size()));
      const std::vector<int32_t> got(
          lists.begin() + static_cast<size_t>(h) * gplan.device_ld(),
          lists.begin() + static_cast<size_t>(h) * gplan.device_ld() + want.size());
      EXPECT_EQ(got, want);
    }
  }
}

// kvpress's scorer ops (cuda_policy_ops_scorers.cu): divide_by_query_counts in one launch and
// cosine_to_mean (keys and values, ragged heads, an empty one; one anchor per head, and one per
// run of 7 slots: ChunkPress) in three, the CPU's bits.
TEST_F(CudaPolicyOpsParity, KvpressScorerOpsAreTheCpuBits) {
  const std::vector<int> lens = {40, 3, 0, 17};
  make_caches(lens, 1);
  const int heads = static_cast<int>(lens.size());
  for (const int chunk : {0, 7})
  for (const policies::CacheRows which :
       {policies::CacheRows::kKeys, policies::CacheRows::kValues}) {
    SCOPED_TRACE(testing::Message() << "chunk " << chunk);
    std::unique_ptr<SlotRows> c = cpu_.make_rows(SlotType::kF32, 2, heads);
    std::unique_ptr<SlotRows> g = gpu_->make_rows(SlotType::kF32, 2, heads);
    cpu_.cosine_to_mean(*c, 1, host_, 0, which, chunk);
    const int64_t l0 = gpu_->launches();
    gpu_->cosine_to_mean(*g, 1, index_, 0, which, chunk);
    EXPECT_EQ(gpu_->launches() - l0, 3);
    for (int h = 0; h < heads; ++h) {
      ASSERT_EQ(g->length(1, h), lens[h]);
      parity::expect_bits(gpu_->read_f32(*g, 1, h), cpu_.read_f32(*c, 1, h), "cosines");
    }
  }
  const int stride = 48, n = 20;
  const std::vector<float> col = parity::random_vec(static_cast<size_t>(heads) * stride, 17);
  const cu::DeviceBuffer<float> dcol = parity::to_device(col);
  std::unique_ptr<SlotRows> c = cpu_.make_rows(SlotType::kF32, 1, heads);
  std::unique_ptr<SlotRows> g = gpu_->make_rows(SlotType::kF32, 1, heads);
  const std::vector<int32_t> len = {40, 3, 0, 17}, before = {20, 0, 0, 5};
  cpu_.resize_and_accumulate(*c, 0, len, col.data(), stride, stride, 1, GqaReduce::kMean);
  gpu_->resize_and_accumulate(*g, 0, len, dcol.data(), stride, stride, 1, GqaReduce::kMean);
  cpu_.divide_by_query_counts(*c, 0, before, n);
  const int64_t l0 = gpu_->launches();
  gpu_->divide_by_query_counts(*g, 0, before, n);
  EXPECT_EQ(gpu_->launches() - l0, 1);
  for (int h = 0; h < heads; ++h) {
    parity::expect_bits(gpu_->read_f32(*g, 0, h), cpu_.read_f32(*c, 0, h), "divided rows");
  }
}

// keydiff, observed_attention, cur and lagkv decide on the device as on the CPU (GQA group 2),
// alone and with Ada-KV's allocation (fill_top, count_top_across_heads: per-head counts that sum
// to the layer's budget).
TEST_F(CudaPolicyOpsParity, KvpressScorersDecideAsOnTheCpu) {
  const int heads = 4, group = 2, len = 90;
  const std::vector<std::pair<std::string, std::map<std::string, std::string>>> cases = {
      {"keydiff", {}},
      {"observed_attention", {}},
      {"cur", {}},
      {"lagkv", {{"lag", "16"}}},  // 5 partitions of 16
      {"keydiff", {{"ada", "true"}}},
      {"observed_attention", {{"ada", "true"}, {"alpha_safeguard", "0.5"}}},
      {"cur", {{"ada", "true"}}},
  };
  for (const auto& [name, options] : cases) {
    SCOPED_TRACE(name + (options.count("ada") ? " ada" : ""));
    const bool ada = options.count("ada") > 0;
    policies::PolicyConfig pc;
    pc.name = name;
    pc.kv_budget = 30;
    pc.shape = {1, heads * group, heads, 8, 256};
    pc.options = policies::PolicyOptions(options);
    EvictionPlan cplan, gplan;
    decide_on_both(pc, heads, group, len, 0, &cplan, &gplan);
    ASSERT_TRUE(gplan.on_device());
    const std::vector<int32_t> lists =
        parity::to_host(gplan.device_slots(), static_cast<size_t>(heads) * gplan.device_ld());
    for (int h = 0; h < heads; ++h) {
      const std::vector<int32_t> want = parity::expect_same_keep_list(gplan, lists, cplan, h, len);
      if (!ada) EXPECT_EQ(static_cast<int>(want.size()), pc.kv_budget) << "head " << h;
    }
  }
}

// chunkkv and threshold (kvpress ChunkKVPress and DMSPress) decide on the host from the score
// rows read back: the GPU's plan holds the CPU's host keep lists, head by head.
TEST_F(CudaPolicyOpsParity, ChunkKvAndThresholdDecideAsOnTheCpu) {
  const int heads = 4, group = 2, len = 90;
  const std::vector<std::pair<std::string, std::map<std::string, std::string>>> cases = {
      {"keydiff", {{"chunkkv", "7"}}},
      {"observed_attention", {{"chunkkv", "5"}}},
      {"cur", {{"chunkkv", "8"}}},
      {"keydiff", {{"threshold", "0"}, {"threshold_window", "20"}}},
      {"observed_attention", {{"threshold", "0.01"}, {"threshold_window", "10"}}},
      {"cur", {{"threshold", "0.01"}, {"threshold_window", "16"}}},
      {"snapkv", {{"chunkkv", "6"}, {"window", "8"}}},  // its window padded by the maximum + 1
      {"keydiff", {{"chunk", "16"}}},                    // ChunkPress: runs of 16 scored alone
      {"keydiff", {{"block", "16"}}},  // BlockPress: the rows read to the host, scored there
      {"cur", {{"block", "20"}}},
      {"cur", {{"chunk", "32"}}},  // ChunkPress: each run scored as its own cache on the host
  };
  const int w = 8;
  for (const auto& [name, options] : cases) {
    SCOPED_TRACE(name + " " + options.begin()->first);
    policies::PolicyConfig pc;
    pc.name = name;
    pc.kv_budget = 30;
    pc.shape = {1, heads * group, heads, 8, 256};
    pc.options = policies::PolicyOptions(options);
    EvictionPlan cplan, gplan;
    decide_on_both(pc, heads, group, len, w, &cplan, &gplan);
    ASSERT_FALSE(gplan.on_device());
    EXPECT_TRUE(cplan.changes_any());
    for (int h = 0; h < heads; ++h) {
      std::vector<int32_t> want, got;
      cplan.keep_list(h, len, &want);
      gplan.keep_list(h, len, &got);
      EXPECT_EQ(got, want) << "head " << h;
    }
  }
}

// CUR's ops: the cached rows' (squared) norms, chunk normalisation (chunks of 1, 16 and the
// whole row), combine (product and sum) and fill_prefix, one launch each, the CPU's bits.
TEST_F(CudaPolicyOpsParity, LeverageOpsAreTheCpuBits) {
  const std::vector<int> lens = {40, 3, 0, 17};
  make_caches(lens, 1);
  const int heads = static_cast<int>(lens.size());
  std::unique_ptr<SlotRows> c = cpu_.make_rows(SlotType::kF32, 2, heads);
  std::unique_ptr<SlotRows> g = gpu_->make_rows(SlotType::kF32, 2, heads);
  auto expect_rows = [&](int layer, const char* what) {
    for (int h = 0; h < heads; ++h) {
      ASSERT_EQ(g->length(layer, h), lens[h]);
      parity::expect_bits(gpu_->read_f32(*g, layer, h), cpu_.read_f32(*c, layer, h), what);
    }
  };
  for (const bool squared : {false, true}) {
    cpu_.cache_norms(*c, 0, host_, 0, policies::CacheRows::kKeys, squared);
    int64_t l0 = gpu_->launches();
    gpu_->cache_norms(*g, 0, index_, 0, policies::CacheRows::kKeys, squared);
    EXPECT_EQ(gpu_->launches() - l0, 1);
    expect_rows(0, "key norms");
  }
  cpu_.cache_norms(*c, 1, host_, 0, policies::CacheRows::kValues, true);
  gpu_->cache_norms(*g, 1, index_, 0, policies::CacheRows::kValues, true);
  expect_rows(1, "value norms");
  for (const int chunk : {16, 1, 0}) {
    cpu_.normalize_chunks(*c, 1, chunk);
    const int64_t l0 = gpu_->launches();
    gpu_->normalize_chunks(*g, 1, chunk);
    EXPECT_EQ(gpu_->launches() - l0, 1);
    expect_rows(1, "normalised chunks");
  }
  for (const policies::Combine how : {policies::Combine::kMul, policies::Combine::kAdd}) {
    cpu_.combine(*c, 0, *c, 1, how);
    gpu_->combine(*g, 0, *g, 1, how);
    expect_rows(0, "combined rows");
  }
  cpu_.fill_prefix(*c, 0, 5, 1.0f);
  gpu_->fill_prefix(*g, 0, 5, 1.0f);
  expect_rows(0, "filled rows");
}

// fill_top: keep_top's selection then one scatter, the CPU's rows (ragged heads, an empty one,
// tied entries, k past a row).
TEST_F(CudaPolicyOpsParity, FillTopIsTheCpusRows) {
  const std::vector<int32_t> lens = {40, 3, 0, 17};
  const int heads = static_cast<int>(lens.size()), stride = 48;
  const std::vector<float> src = parity::tied_vec(static_cast<size_t>(heads) * stride, 71, 5);
  const cu::DeviceBuffer<float> dsrc = parity::to_device(src);
  for (const int k : {1, 5, 20}) {
    SCOPED_TRACE(k);
    std::unique_ptr<SlotRows> c = cpu_.make_rows(SlotType::kF32, 1, heads);
    std::unique_ptr<SlotRows> g = gpu_->make_rows(SlotType::kF32, 1, heads);
    cpu_.resize_and_accumulate(*c, 0, lens, src.data(), stride, stride, 1, GqaReduce::kMean);
    gpu_->resize_and_accumulate(*g, 0, lens, dsrc.data(), stride, stride, 1, GqaReduce::kMean);
    // Every head k, then head 0 alone by head-by-head counts (k 0 for the others).
    const std::vector<int32_t> ks(heads, k), first = {k, 0};
    cpu_.fill_top(*c, 0, ks, 100.0f, nullptr, 0);
    const int64_t l0 = gpu_->launches();
    gpu_->fill_top(*g, 0, ks, 100.0f, nullptr, 0);
    EXPECT_EQ(gpu_->launches() - l0, 2);
    for (int h = 0; h < heads; ++h) {
      parity::expect_bits(gpu_->read_f32(*g, 0, h), cpu_.read_f32(*c, 0, h), "filled rows");
    }
    // By other rows: layer 0's rows of a second set, as ordered by the first.
    std::unique_ptr<SlotRows> c2 = cpu_.make_rows(SlotType::kF32, 1, heads);
    std::unique_ptr<SlotRows> g2 = gpu_->make_rows(SlotType::kF32, 1, heads);
    cpu_.resize(*c2, 0, lens);
    gpu_->resize(*g2, 0, lens);
    cpu_.fill_top(*c2, 0, first, -3.0f, c.get(), 0);
    gpu_->fill_top(*g2, 0, first, -3.0f, g.get(), 0);
    for (int h = 0; h < heads; ++h) {
      parity::expect_bits(gpu_->read_f32(*g2, 0, h), cpu_.read_f32(*c2, 0, h), "filled by");
    }
  }
}

// CriticalKV's projected_value_norms (GQA group 2, ragged heads, an empty one): one launch, the
// CPU's bits with f32 weights, and with bf16 weights against the CPU on their f32 widening.
TEST_F(CudaPolicyOpsParity, ProjectedValueNormsAreTheCpuBits) {
  const std::vector<int> lens = {40, 3, 0, 17};
  make_caches(lens, 1);
  const int kv = static_cast<int>(lens.size()), group = 2, heads = kv * group, d = 8, dim = 24;
  std::vector<float> w = parity::random_vec(static_cast<size_t>(dim) * heads * d, 83);
  std::vector<uint16_t> w16(w.size());
  for (size_t i = 0; i < w.size(); ++i) w16[i] = kernels::cpu::bf16_from_f32(w[i]);
  std::vector<float> widened(w.size());
  for (size_t i = 0; i < w.size(); ++i) widened[i] = kernels::cpu::f32_from_bf16(w16[i]);
  const cu::DeviceBuffer<float> dw = parity::to_device(w);
  const cu::DeviceBuffer<uint16_t> dw16 = parity::to_device(w16);
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    std::unique_ptr<SlotRows> c = cpu_.make_rows(SlotType::kF32, 1, heads);
    std::unique_ptr<SlotRows> g = gpu_->make_rows(SlotType::kF32, 1, heads);
    cpu_.projected_value_norms(*c, 0, host_, 0, bf16 ? widened.data() : w.data(), false, dim,
                               group);
    const int64_t l0 = gpu_->launches();
    gpu_->projected_value_norms(*g, 0, index_, 0,
                                bf16 ? static_cast<const void*>(dw16.data()) : dw.data(), bf16, dim,
                                group);
    EXPECT_EQ(gpu_->launches() - l0, 1);
    for (int q = 0; q < heads; ++q) {
      ASSERT_EQ(g->length(0, q), lens[q / group]);
      parity::expect_bits(gpu_->read_f32(*g, 0, q), cpu_.read_f32(*c, 0, q), "norms");
    }
  }
}

// The wrappers decide on the device as on the CPU: critical, critical with ada, over keydiff and
// expected_attention (GQA group 2).
TEST_F(CudaPolicyOpsParity, CriticalScorersDecideAsOnTheCpu) {
  const int kv = 4, group = 2, len = 90, d = 8, dim = 24;
  const std::vector<float> w = parity::random_vec(static_cast<size_t>(dim) * kv * group * d, 89);
  const cu::DeviceBuffer<float> dw = parity::to_device(w);
  const std::vector<float> q = parity::random_vec(static_cast<size_t>(len) * kv * group * d, 97);
  const cu::DeviceBuffer<float> dq = parity::to_device(q);
  kernels::cpu::RopeParams rope;
  rope.style = kernels::cpu::RopeStyle::kNeox;
  rope.rot_dim = d;
  for (const char* name : {"keydiff", "expected_attention"}) {
    for (const bool ada : {false, true}) {
      SCOPED_TRACE(testing::Message() << name << (ada ? " ada" : ""));
      make_caches(std::vector<int>(kv, len), 2);
      policies::PolicyConfig pc;
      pc.name = name;
      pc.kv_budget = 30;
      pc.shape = {1, kv * group, kv, d, 256};
      std::map<std::string, std::string> o = {{"critical", "true"}};
      if (ada) o["ada"] = "true";
      pc.options = policies::PolicyOptions(o);
      policies::LayerStats st;
      st.layer = 0;
      st.n_new = len;
      st.num_heads = kv * group;
      st.rope = &rope;
      st.block_end = len;
      st.wo_dim = dim;
      st.pre_rope_queries = q.data();
      st.wo = w.data();
      policies::LayerStats dev = st;
      dev.pre_rope_queries = dq.data();
      dev.wo = dw.data();
      EvictionPlan cplan, gplan;
      prefill_on_both(pc, st, dev, &cplan, &gplan);
      ASSERT_TRUE(gplan.on_device());
      const std::vector<int32_t> lists =
          parity::to_host(gplan.device_slots(), static_cast<size_t>(kv) * gplan.device_ld());
      int total = 0;
      for (int h = 0; h < kv; ++h) {
        const std::vector<int32_t> want =
            parity::expect_same_keep_list(gplan, lists, cplan, h, len);
        total += static_cast<int>(want.size());
      }
      EXPECT_EQ(total, kv * pc.kv_budget);
    }
  }
}

// simlayerkv decides on the device as on the CPU: the last queries' mean attention per KV head
// read back (a copy and a sync per head), the layer lazy or not by the same sums, the same plan.
TEST_F(CudaPolicyOpsParity, SimLayerKvDecidesAsOnTheCpu) {
  const int kv = 4, group = 2, len = 90, w = 2;
  const std::vector<float> probs =
      parity::random_vec(static_cast<size_t>(kv) * group * w * len, 101, 0.0f, 1.0f / 45);
  const cu::DeviceBuffer<float> dprobs = parity::to_device(probs);
  for (const char* threshold : {"0", "0.99"}) {
    SCOPED_TRACE(threshold);
    make_caches(std::vector<int>(kv, len), 2);
    policies::PolicyConfig pc;
    pc.name = "simlayerkv";
    pc.kv_budget = 30;
    pc.shape = {1, kv * group, kv, 8, 256};
    pc.options = policies::PolicyOptions(
        std::map<std::string, std::string>{{"lazy_threshold", threshold}, {"n_last", "2"}});
    policies::LayerStats st;
    st.layer = 0;
    st.n_new = len;
    st.num_heads = kv * group;
    st.stride = len;
    st.last_w = w;
    st.last_probs = probs.data();
    policies::LayerStats dev = st;
    dev.last_probs = dprobs.data();
    EvictionPlan cplan, gplan;
    prefill_on_both(pc, st, dev, &cplan, &gplan);
    std::vector<int32_t> want, got;
    for (int h = 0; h < kv; ++h) {
      cplan.keep_list(h, len, &want);
      gplan.keep_list(h, len, &got);
      EXPECT_EQ(got, want) << "head " << h;
      EXPECT_EQ(static_cast<int>(want.size()), std::string(threshold) == "0" ? 30 : len);
    }
  }
}

// LagKV's scores: ragged heads (partitions scored, a short head's ramp, an empty head), lag 16
// and 5, the CPU's ranks (the device's exp may differ in the last bit; these random rows have
// no such near-tie).
TEST_F(CudaPolicyOpsParity, LagScoresAreTheCpuRanks) {
  const std::vector<int> lens = {90, 20, 0, 57};
  make_caches(lens, 1);
  const int heads = static_cast<int>(lens.size());
  for (const int lag : {16, 5}) {
    std::unique_ptr<SlotRows> c = cpu_.make_rows(SlotType::kF32, 1, heads);
    std::unique_ptr<SlotRows> g = gpu_->make_rows(SlotType::kF32, 1, heads);
    cpu_.lag_scores(*c, 0, host_, 0, 4, lag);
    const int64_t l0 = gpu_->launches();
    gpu_->lag_scores(*g, 0, index_, 0, 4, lag);
    EXPECT_EQ(gpu_->launches() - l0, 2);
    for (int h = 0; h < heads; ++h) {
      ASSERT_EQ(g->length(0, h), lens[h]);
      parity::expect_bits(gpu_->read_f32(*g, 0, h), cpu_.read_f32(*c, 0, h), "lag scores");
    }
  }
}

// ExpectedAttentionPress's ops: query_moments (mean and covariance, both pairings, a partial
// rotation) in two launches, quadratic_scores (GQA group 2, with and without the covariance),
// softmax from an entry and add_scalar in one each: the CPU's bits (softmax's exp may differ in
// the last bit; these random rows have no such case).
TEST_F(CudaPolicyOpsParity, ExpectedAttentionOpsAreTheCpuBits) {
  const std::vector<int> lens = {40, 3, 0, 17};
  make_caches(lens, 1);
  const int kv = static_cast<int>(lens.size()), group = 2, heads = kv * group, d = 8, n = 37;
  const std::vector<float> q = parity::random_vec(static_cast<size_t>(n) * heads * d, 29);
  const cu::DeviceBuffer<float> dq = parity::to_device(q);
  policies::LayerStats st;
  st.n_new = n;
  st.num_heads = heads;
  const kernels::ops::PairRotation adjacent{.adjacent = true,
                                            .rot_dim = 8,
                                            .cos = {0.9f, 0.5f, -0.2f, 0.7f},
                                            .sin = {0.1f, -0.6f, 0.8f, 0.3f}};
  const kernels::ops::PairRotation half{
      .adjacent = false, .rot_dim = 4, .cos = {0.4f, -0.9f}, .sin = {0.6f, 0.2f}};
  std::unique_ptr<SlotRows> cm = cpu_.make_rows(SlotType::kF32, 1, heads);
  std::unique_ptr<SlotRows> gm = gpu_->make_rows(SlotType::kF32, 1, heads);
  std::unique_ptr<SlotRows> cs = cpu_.make_rows(SlotType::kF32, 1, heads);
  std::unique_ptr<SlotRows> gs = gpu_->make_rows(SlotType::kF32, 1, heads);
  for (const auto* rot : {&adjacent, &half}) {
    for (const bool cov : {true, false}) {
      SCOPED_TRACE(testing::Message() << "adjacent " << rot->adjacent << ", covariance " << cov);
      st.pre_rope_queries = q.data();
      cpu_.query_moments(*cm, 0, st, d, 4, *rot, cov);
      st.pre_rope_queries = dq.data();
      int64_t l0 = gpu_->launches();
      gpu_->query_moments(*gm, 0, st, d, 4, *rot, cov);
      EXPECT_EQ(gpu_->launches() - l0, cov ? 2 : 1);
      for (int h = 0; h < heads; ++h) {
        ASSERT_EQ(gm->length(0, h), cov ? d + d * d : d);
        parity::expect_bits(gpu_->read_f32(*gm, 0, h), cpu_.read_f32(*cm, 0, h), "moments");
      }
      const double b = cov ? 1.0 / 16 : 0.0;
      cpu_.quadratic_scores(*cs, 0, host_, 0, *cm, 0, group, 0.35, b);
      l0 = gpu_->launches();
      gpu_->quadratic_scores(*gs, 0, index_, 0, *gm, 0, group, 0.35, b);
      EXPECT_EQ(gpu_->launches() - l0, 1);
      for (int h = 0; h < heads; ++h) {
        ASSERT_EQ(gs->length(0, h), lens[h / group]);
        parity::expect_bits(gpu_->read_f32(*gs, 0, h), cpu_.read_f32(*cs, 0, h), "logits");
      }
      cpu_.softmax(*cs, 0, 2);
      gpu_->softmax(*gs, 0, 2);
      cpu_.add_scalar(*cs, 0, 0.25f);
      gpu_->add_scalar(*gs, 0, 0.25f);
      for (int h = 0; h < heads; ++h) {
        parity::expect_bits(gpu_->read_f32(*gs, 0, h), cpu_.read_f32(*cs, 0, h), "softmax");
      }
    }
  }
}

// expected_attention decides on the device as on the CPU (GQA group 2, rotate_half RoPE).
TEST_F(CudaPolicyOpsParity, ExpectedAttentionDecidesAsOnTheCpu) {
  const int kv = 4, group = 2, len = 90, d = 8;
  make_caches(std::vector<int>(kv, len), 2);
  policies::PolicyConfig pc;
  pc.name = "expected_attention";
  pc.kv_budget = 30;
  pc.shape = {1, kv * group, kv, d, 256};
  for (const char* vnorm : {"true", "false"}) {
    SCOPED_TRACE(vnorm);
    pc.options = policies::PolicyOptions(
        std::map<std::string, std::string>{{"use_vnorm", vnorm}, {"epsilon", "0.01"}});
    const std::vector<float> q = parity::random_vec(static_cast<size_t>(len) * kv * group * d, 43);
    const cu::DeviceBuffer<float> dq = parity::to_device(q);
    kernels::cpu::RopeParams rope;
    rope.style = kernels::cpu::RopeStyle::kNeox;
    rope.rot_dim = d;
    policies::LayerStats st;
    st.layer = 0;
    st.n_new = len;
    st.num_heads = kv * group;
    st.rope = &rope;
    st.block_end = 3 * len;
    st.pre_rope_queries = q.data();
    policies::LayerStats dev = st;
    dev.pre_rope_queries = dq.data();
    EvictionPlan cplan, gplan;
    prefill_on_both(pc, st, dev, &cplan, &gplan);
    ASSERT_TRUE(gplan.on_device());
    const std::vector<int32_t> lists =
        parity::to_host(gplan.device_slots(), static_cast<size_t>(kv) * gplan.device_ld());
    for (int h = 0; h < kv; ++h) {
      const std::vector<int32_t> want = parity::expect_same_keep_list(gplan, lists, cplan, h, len);
      EXPECT_EQ(static_cast<int>(want.size()), pc.kv_budget) << "head " << h;
    }
  }
}

// NonCausalAttnPress's ops. chunk_attention_sums (GQA group 2, rotate_half RoPE, chunks of 16
// with a padded last chunk of 5, and of 64: one padded chunk): four launches (positions, RoPE,
// each query's maximum and sum, each key's column sum) and one counted upload (RoPE's
// frequencies); the CPU's rows within the last bits of the device's expf. standardize over rows
// of 300, 5, 0 and 600 entries (runs of 256 across heads), equal inputs on both: the CPU's bits.
// KVzip's replay_attention_max: 3 KV heads of 2 query heads each, a 61-slot cache whose last 17
// slots are the pass's keys, the chunk [4, 40) with 4 sinks and [0, 44) with none; the
// queries' one upload, two launches, nothing copied back.
TEST_F(CudaPolicyOpsParity, ReplayAttentionMaxIsTheCpus) {
  const int kv = 3, group = 2, heads = kv * group, d = 8, len = 61, m = 17;
  make_caches(std::vector<int>(kv, len), 1);
  const std::vector<float> q = parity::random_vec(static_cast<size_t>(m) * heads * d, 71);
  policies::LayerStats st;
  st.n_new = m;
  st.n_queries = m;
  st.num_heads = heads;
  st.last_queries = q.data();
  std::unique_ptr<SlotRows> cr = cpu_.make_rows(SlotType::kF32, 1, kv);
  std::unique_ptr<SlotRows> gr = gpu_->make_rows(SlotType::kF32, 1, kv);
  for (const auto& [sinks, first, count] :
       std::vector<std::array<int, 3>>{{4, 4, 36}, {0, 0, 44}, {2, 30, 1}}) {
    SCOPED_TRACE(testing::Message() << sinks << " " << first << " " << count);
    cpu_.replay_attention_max(*cr, 0, host_, 0, st, sinks, first, count);
    const int64_t l0 = gpu_->launches();
    const int64_t u0 = gpu_->transfers().h2d_copies, d0 = gpu_->transfers().d2h_copies;
    gpu_->replay_attention_max(*gr, 0, index_, 0, st, sinks, first, count);
    EXPECT_EQ(gpu_->launches() - l0, 2);
    EXPECT_EQ(gpu_->transfers().h2d_copies - u0, 1);
    EXPECT_EQ(gpu_->transfers().d2h_copies - d0, 0);
    for (int h = 0; h < kv; ++h) {
      ASSERT_EQ(gr->length(0, h), count);
      parity::expect_close(gpu_->read_f32(*gr, 0, h), cpu_.read_f32(*cr, 0, h), 1e-6, 1e-6,
                           "replay maxima");
    }
  }
}

// window_attention: 3 KV heads of 2 query heads each holding 61, 40 and 0 slots (positions 3s +
// head), 9 recorded queries, windows of 1, 5 and 9 queries ending before some of the slots
// (block_end 100: the heads see a prefix each) and after all of them (400): the queries' one
// upload and one launch, nothing copied back; the CPU's rows within the last bits of the
// device's f64 exp. Then use_window and window_scores on each instance's rows: the SnapKV
// family's scores over a cache, on the device end to end, the CPU's within the same bound.
TEST_F(CudaPolicyOpsParity, WindowAttentionIsTheCpus) {
  const int kv = 3, group = 2, heads = kv * group, d = 8, nq = 9;
  make_caches({61, 40, 0}, 1);
  const std::vector<float> q = parity::random_vec(static_cast<size_t>(nq) * heads * d, 73, -2, 2);
  policies::LayerStats st;
  st.num_heads = heads;
  st.n_new = nq;
  st.n_queries = nq;
  st.last_queries = q.data();
  std::unique_ptr<policies::WindowProbs> cp = cpu_.make_window_probs();
  std::unique_ptr<policies::WindowProbs> gp = gpu_->make_window_probs();
  for (const int block_end : {100, 400}) {
    for (const int w : {1, 5, 9}) {
      SCOPED_TRACE(testing::Message() << "block_end " << block_end << " w " << w);
      st.block_end = block_end;
      cpu_.window_attention(*cp, host_, 0, st, w);
      const int64_t l0 = gpu_->launches();
      const int64_t u0 = gpu_->transfers().h2d_copies, d0 = gpu_->transfers().d2h_copies;
      gpu_->window_attention(*gp, index_, 0, st, w);
      EXPECT_EQ(gpu_->launches() - l0, 1);
      EXPECT_EQ(gpu_->transfers().h2d_copies - u0, 1);
      EXPECT_EQ(gpu_->transfers().d2h_copies - d0, 0);
      ASSERT_EQ(gp->heads(), heads);
      ASSERT_EQ(gp->w(), w);
      ASSERT_EQ(gp->stride(), 61);
      ASSERT_EQ(cp->stride(), 61);
      const size_t n = static_cast<size_t>(heads) * w * 61;
      const std::vector<float> want(cp->data(), cp->data() + n);
      parity::expect_close(parity::to_host(gp->data(), n), want, 1e-7, 1e-6, "window probs");
      policies::LayerStats cw = st, gw = st;
      policies::use_window(*cp, &cw);
      policies::use_window(*gp, &gw);
      std::unique_ptr<SlotRows> c = cpu_.make_rows(SlotType::kF32, 1, kv);
      std::unique_ptr<SlotRows> g = gpu_->make_rows(SlotType::kF32, 1, kv);
      policies::SnapKvScoreOptions o;
      o.pool_kernel = 3;
      window_scores(cpu_, *c, 0, cw, host_, o);
      window_scores(*gpu_, *g, 0, gw, index_, o);
      for (int h = 0; h < kv; ++h) {
        ASSERT_EQ(g->length(0, h), c->length(0, h));
        parity::expect_close(gpu_->read_f32(*g, 0, h), cpu_.read_f32(*c, 0, h), 1e-7, 1e-6,
                             "window scores over the window's probabilities");
      }
    }
  }
}

// cumsum over rows of 300, 1, 0 and 1000 entries (values of mixed magnitude, so the order
// shows in the bits): one launch, the CPU's bits. gather of each head's own list (repeats,
// reversals, an empty list): the indices' one upload, one launch, the CPU's entries.
TEST_F(CudaPolicyOpsParity, CumsumAndGatherAreTheCpuBits) {
  const std::vector<int32_t> lens = {300, 1, 0, 1000};
  const int heads = static_cast<int>(lens.size()), ld = 1000;
  std::vector<float> values = parity::random_vec(static_cast<size_t>(heads) * ld, 91, -1, 1);
  for (size_t i = 0; i < values.size(); i += 7) values[i] *= 4096.0f;
  std::unique_ptr<SlotRows> c = cpu_.make_rows(SlotType::kF32, 1, heads);
  std::unique_ptr<SlotRows> g = gpu_->make_rows(SlotType::kF32, 1, heads);
  for (SlotRows* r : {c.get(), g.get()}) {
    policies::PolicyOps& ops = r == c.get() ? static_cast<policies::PolicyOps&>(cpu_) : *gpu_;
    ops.write_rows(*r, 0, values, ld);
    ops.resize(*r, 0, lens);
  }
  cpu_.cumsum(*c, 0);
  int64_t l0 = gpu_->launches();
  gpu_->cumsum(*g, 0);
  EXPECT_EQ(gpu_->launches() - l0, 1);
  for (int h = 0; h < heads; ++h) {
    parity::expect_bits(gpu_->read_f32(*g, 0, h), cpu_.read_f32(*c, 0, h), "cumsum");
  }
  std::vector<int32_t> indices;
  const std::vector<int32_t> counts = {5, 3, 0, 999};
  for (int t : {299, 0, 0, 150, 299}) indices.push_back(t);
  for (int t = 0; t < 3; ++t) indices.push_back(0);
  for (int t = 998; t >= 0; --t) indices.push_back(t);
  std::unique_ptr<SlotRows> co = cpu_.make_rows(SlotType::kF32, 1, heads);
  std::unique_ptr<SlotRows> go = gpu_->make_rows(SlotType::kF32, 1, heads);
  cpu_.gather(*c, 0, indices, counts, *co, 0);
  l0 = gpu_->launches();
  const int64_t u0 = gpu_->transfers().h2d_copies, d0 = gpu_->transfers().d2h_copies;
  gpu_->gather(*g, 0, indices, counts, *go, 0);
  EXPECT_EQ(gpu_->launches() - l0, 1);
  EXPECT_EQ(gpu_->transfers().h2d_copies - u0, 1);
  EXPECT_EQ(gpu_->transfers().d2h_copies - d0, 0);
  for (int h = 0; h < heads; ++h) {
    ASSERT_EQ(go->length(0, h), counts[h]);
    parity::expect_bits(gpu_->read_f32(*go, 0, h), cpu_.read_f32(*co, 0, h), "gather");
  }
}

TEST_F(CudaPolicyOpsParity, ChunkAttentionSumsAndStandardizeAreTheCpuRows) {
  const int kv = 3, group = 2, heads = kv * group, d = 8, n = 37;
  make_caches(std::vector<int>(kv, n), 1);
  const std::vector<float> q = parity::random_vec(static_cast<size_t>(n) * heads * d, 61);
  const cu::DeviceBuffer<float> dq = parity::to_device(q);
  kernels::cpu::RopeParams rope;
  rope.style = kernels::cpu::RopeStyle::kNeox;
  rope.rot_dim = d;
  policies::LayerStats st;
  st.n_new = n;
  st.num_heads = heads;
  st.rope = &rope;
  st.block_end = n;
  std::unique_ptr<SlotRows> cr = cpu_.make_rows(SlotType::kF32, 1, heads);
  std::unique_ptr<SlotRows> gr = gpu_->make_rows(SlotType::kF32, 1, heads);
  // Chunks of 16 and 64 over the block, and of 16 over tokens [3, 35) (Compactor's middle).
  for (const auto& [chunk, first, count] : std::vector<std::array<int, 3>>{
           {16, 0, n}, {64, 0, n}, {16, 3, 32}}) {
    SCOPED_TRACE(testing::Message() << chunk << " " << first << " " << count);
    st.pre_rope_queries = q.data();
    cpu_.chunk_attention_sums(*cr, 0, host_, 0, st, first, count, chunk);
    st.pre_rope_queries = dq.data();
    const int64_t l0 = gpu_->launches();
    const int64_t u0 = gpu_->transfers().h2d_copies, d0 = gpu_->transfers().d2h_copies;
    gpu_->chunk_attention_sums(*gr, 0, index_, 0, st, first, count, chunk);
    EXPECT_EQ(gpu_->launches() - l0, 4);
    EXPECT_EQ(gpu_->transfers().h2d_copies - u0, 1);
    EXPECT_EQ(gpu_->transfers().d2h_copies - d0, 0);
    for (int h = 0; h < heads; ++h) {
      ASSERT_EQ(gr->length(0, h), count);
      parity::expect_close(gpu_->read_f32(*gr, 0, h), cpu_.read_f32(*cr, 0, h), 1e-6, 1e-5,
                           "column sums");
    }
  }
  // standardize: the same rows on both (accumulated from one host source).
  const std::vector<int32_t> lens = {300, 5, 0, 600};
  const int rows = static_cast<int>(lens.size());
  const size_t cap = 600;
  const std::vector<float> src = parity::random_vec(rows * cap, 67, -3.0f, 5.0f);
  const cu::DeviceBuffer<float> dsrc = parity::to_device(src);
  std::unique_ptr<SlotRows> cz = cpu_.make_rows(SlotType::kF32, 1, rows);
  std::unique_ptr<SlotRows> gz = gpu_->make_rows(SlotType::kF32, 1, rows);
  cpu_.resize(*cz, 0, lens);
  gpu_->resize(*gz, 0, lens);
  cpu_.accumulate(*cz, 0, src.data(), cap, cap, 1, kernels::ops::GqaReduce::kMean);
  gpu_->accumulate(*gz, 0, dsrc.data(), cap, cap, 1, kernels::ops::GqaReduce::kMean);
  cpu_.standardize(*cz, 0);
  const int64_t l0 = gpu_->launches();
  gpu_->standardize(*gz, 0);
  EXPECT_EQ(gpu_->launches() - l0, 1);
  for (int h = 0; h < rows; ++h) {
    parity::expect_bits(gpu_->read_f32(*gz, 0, h), cpu_.read_f32(*cz, 0, h), "z-scores");
  }
}

// noncausal_attn decides on the device as on the CPU (GQA group 2, rotate_half RoPE, chunks of 32
// over 90 slots: a padded last chunk of 26), alone and with a threshold on its z-scores.
TEST_F(CudaPolicyOpsParity, NonCausalAttnDecidesAsOnTheCpu) {
  const int kv = 4, group = 2, len = 90, d = 8;
  make_caches(std::vector<int>(kv, len), 2);
  policies::PolicyConfig pc;
  pc.name = "noncausal_attn";
  pc.kv_budget = 30;
  pc.shape = {1, kv * group, kv, d, 256};
  const std::vector<float> q = parity::random_vec(static_cast<size_t>(len) * kv * group * d, 71);
  const cu::DeviceBuffer<float> dq = parity::to_device(q);
  kernels::cpu::RopeParams rope;
  rope.style = kernels::cpu::RopeStyle::kNeox;
  rope.rot_dim = d;
  policies::LayerStats st;
  st.layer = 0;
  st.n_new = len;
  st.num_heads = kv * group;
  st.rope = &rope;
  st.block_end = len;
  st.pre_rope_queries = q.data();
  policies::LayerStats dev = st;
  dev.pre_rope_queries = dq.data();
  for (const bool threshold : {false, true}) {
    SCOPED_TRACE(threshold);
    std::map<std::string, std::string> o = {{"chunk_size", "32"}};
    if (threshold) {
      o["threshold"] = "0.2";
      o["threshold_window"] = "8";
    }
    pc.options = policies::PolicyOptions(o);
    EvictionPlan cplan, gplan;
    prefill_on_both(pc, st, dev, &cplan, &gplan);
    if (!threshold) {
      ASSERT_TRUE(gplan.on_device());
      const std::vector<int32_t> lists =
          parity::to_host(gplan.device_slots(), static_cast<size_t>(kv) * gplan.device_ld());
      for (int h = 0; h < kv; ++h) {
        const std::vector<int32_t> want =
            parity::expect_same_keep_list(gplan, lists, cplan, h, len);
        EXPECT_EQ(static_cast<int>(want.size()), pc.kv_budget) << "head " << h;
      }
    } else {
      // The threshold reads the scores on the host: host keep lists on both.
      ASSERT_FALSE(gplan.on_device());
      EXPECT_TRUE(cplan.changes_any());
      for (int h = 0; h < kv; ++h) {
        std::vector<int32_t> want, got;
        cplan.keep_list(h, len, &want);
        gplan.keep_list(h, len, &got);
        EXPECT_EQ(got, want) << "head " << h;
      }
    }
  }
}

// LeverageScorePress's op: five launches and one counted upload (the sketch), the CPU's bits
// (every step is an f64 fused multiply-add chain in the CPU's order; the Cholesky factor and the
// solve are one header on both). Three heads of 8 dimensions, tokens [3, 40) of 45, sketches of 5
// and 20 columns (the jitter makes the second's rank-8 Gram matrix definite).
TEST_F(CudaPolicyOpsParity, LeverageScoresAreTheCpuBits) {
  const int kv = 3, d = 8, n = 45;
  const std::vector<float> keys = parity::random_vec(static_cast<size_t>(n) * kv * d, 73);
  const cu::DeviceBuffer<float> dkeys = parity::to_device(keys);
  policies::LayerStats st;
  st.n_new = n;
  std::unique_ptr<SlotRows> cr = cpu_.make_rows(SlotType::kF32, 1, kv);
  std::unique_ptr<SlotRows> gr = gpu_->make_rows(SlotType::kF32, 1, kv);
  for (const int k : {5, 20}) {
    SCOPED_TRACE(k);
    const std::vector<float> sketch = parity::random_vec(static_cast<size_t>(kv) * d * k, 79);
    st.pre_rope_keys = keys.data();
    cpu_.leverage_scores(*cr, 0, st, kv, d, 3, 37, sketch.data(), k);
    st.pre_rope_keys = dkeys.data();
    const int64_t l0 = gpu_->launches(), u0 = gpu_->transfers().h2d_copies;
    gpu_->leverage_scores(*gr, 0, st, kv, d, 3, 37, sketch.data(), k);
    EXPECT_EQ(gpu_->launches() - l0, 5);
    EXPECT_EQ(gpu_->transfers().h2d_copies - u0, 1);
    for (int h = 0; h < kv; ++h) {
      ASSERT_EQ(gr->length(0, h), 37);
      parity::expect_bits(gpu_->read_f32(*gr, 0, h), cpu_.read_f32(*cr, 0, h), "leverage");
    }
  }
}

// leverage decides on the device as on the CPU (the device reads the engine's pre-RoPE keys where
// they are; the sketch goes up with the call).
TEST_F(CudaPolicyOpsParity, LeverageDecidesAsOnTheCpu) {
  const int kv = 4, len = 90, d = 8;
  make_caches(std::vector<int>(kv, len), 2);
  policies::PolicyConfig pc;
  pc.name = "leverage";
  pc.kv_budget = 30;
  pc.shape = {1, kv, kv, d, 256};
  pc.options =
      policies::PolicyOptions(std::map<std::string, std::string>{{"sketch_dimension", "6"}});
  const std::vector<float> keys = parity::random_vec(static_cast<size_t>(len) * kv * d, 83);
  const cu::DeviceBuffer<float> dkeys = parity::to_device(keys);
  policies::LayerStats st;
  st.layer = 0;
  st.n_new = len;
  st.num_heads = kv;
  st.pre_rope_keys = keys.data();
  policies::LayerStats dev = st;
  dev.pre_rope_keys = dkeys.data();
  EvictionPlan cplan, gplan;
  prefill_on_both(pc, st, dev, &cplan, &gplan);
  ASSERT_TRUE(gplan.on_device());
  const std::vector<int32_t> lists =
      parity::to_host(gplan.device_slots(), static_cast<size_t>(kv) * gplan.device_ld());
  for (int h = 0; h < kv; ++h) {
    const std::vector<int32_t> want = parity::expect_same_keep_list(gplan, lists, cplan, h, len);
    EXPECT_EQ(static_cast<int>(want.size()), pc.kv_budget) << "head " << h;
  }
}

// compactor decides on the device as on the CPU: leverage_scores and chunk_attention_sums over
// the middle, slice (the values' norms of the middle) and pad_with_max (the protected ends), on
// top of the ops above (GQA group 2, 90 slots, chunks of 32: the middle's last chunk padded).
TEST_F(CudaPolicyOpsParity, CompactorDecidesAsOnTheCpu) {
  const int kv = 4, group = 2, len = 90, d = 8;
  make_caches(std::vector<int>(kv, len), 2);
  policies::PolicyConfig pc;
  pc.name = "compactor";
  pc.kv_budget = 30;
  pc.shape = {1, kv * group, kv, d, 256};
  pc.options = policies::PolicyOptions(std::map<std::string, std::string>{
      {"chunk_size", "32"}, {"sketch_dimension", "6"}, {"blending", "0.4"}});
  const std::vector<float> q = parity::random_vec(static_cast<size_t>(len) * kv * group * d, 89);
  const std::vector<float> keys = parity::random_vec(static_cast<size_t>(len) * kv * d, 97);
  const cu::DeviceBuffer<float> dq = parity::to_device(q), dkeys = parity::to_device(keys);
  kernels::cpu::RopeParams rope;
  rope.style = kernels::cpu::RopeStyle::kNeox;
  rope.rot_dim = d;
  policies::LayerStats st;
  st.layer = 0;
  st.n_new = len;
  st.num_heads = kv * group;
  st.rope = &rope;
  st.block_end = len;
  st.pre_rope_queries = q.data();
  st.pre_rope_keys = keys.data();
  policies::LayerStats dev = st;
  dev.pre_rope_queries = dq.data();
  dev.pre_rope_keys = dkeys.data();
  EvictionPlan cplan, gplan;
  prefill_on_both(pc, st, dev, &cplan, &gplan);
  ASSERT_TRUE(gplan.on_device());
  const std::vector<int32_t> lists =
      parity::to_host(gplan.device_slots(), static_cast<size_t>(kv) * gplan.device_ld());
  for (int h = 0; h < kv; ++h) {
    const std::vector<int32_t> want = parity::expect_same_keep_list(gplan, lists, cplan, h, len);
    EXPECT_EQ(static_cast<int>(want.size()), pc.kv_budget) << "head " << h;
  }
}


// ThinK's key energy (channel_square_means) is the CPU's bits on the device rows (one launch, one
// copy, one sync), and a policy's channel decision from it is the CPU's: `think` and `snapkv`
// with `think` (GQA group 2, heads of different lengths, the window's queries on the host).
TEST_F(CudaPolicyOpsParity, ChannelSquareMeansAndThinkAreTheCpus) {
  const int kv = 4, group = 2, d = 8;
  make_caches({40, 33, 0, 57}, 2);
  for (const auto which : {kernels::ops::CacheRows::kKeys, kernels::ops::CacheRows::kValues}) {
    std::vector<double> want, got;
    cpu_.channel_square_means(host_, 0, which, &want);
    const int64_t l0 = gpu_->launches(), c0 = gpu_->transfers().d2h_copies;
    gpu_->channel_square_means(index_, 0, which, &got);
    EXPECT_EQ(gpu_->launches() - l0, 1);
    EXPECT_EQ(gpu_->transfers().d2h_copies - c0, 1);
    ASSERT_EQ(got.size(), static_cast<size_t>(kv) * d);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(double)));
    EXPECT_EQ(want[2 * d], 0.0);  // the empty head
  }
  const std::vector<float> q = parity::random_vec(static_cast<size_t>(5) * kv * group * d, 101);
  policies::LayerStats st;
  st.layer = 0;
  st.n_new = 60;
  st.num_heads = kv * group;
  st.last_queries = q.data();
  st.n_queries = 5;
  st.block_end = 1000;
  for (const auto& [name, opts] :
       std::vector<std::pair<std::string, std::map<std::string, std::string>>>{
           {"think", {{"key_channel_compression_ratio", "0.5"}, {"window_size", "3"}}},
           {"snapkv", {{"think", "0.3"}}}}) {
    SCOPED_TRACE(name);
    policies::PolicyConfig pc;
    pc.name = name;
    pc.kv_budget = 16;
    pc.shape = {1, kv * group, kv, d, 256};
    pc.options = policies::PolicyOptions(opts);
    const std::unique_ptr<policies::Policy> p = policies::make_policy(pc);
    EvictionPlan cplan, gplan;
    cplan.reset(0, kv);
    gplan.reset(0, kv);
    policies::LayerStats host = st, dev = st;
    host.ops = &cpu_;
    dev.ops = gpu_.get();
    p->on_prefill_channels(host, host_, cplan);
    p->on_prefill_channels(dev, index_, gplan);
    ASSERT_TRUE(cplan.prunes_channels());
    EXPECT_EQ(cplan.channel_heads(), gplan.channel_heads());
    for (int h = 0; h < kv; ++h) EXPECT_EQ(cplan.key_channels(h), gplan.key_channels(h));
  }
}

// The device cache zeroes a plan's key channels as the host cache does (slots whose position is
// below the bound only), with one upload (the channel mask) and the index counting them.
TEST_F(CudaPolicyOpsParity, ZeroKeyChannelsIsTheHostCachesZeroing) {
  make_caches({40, 33, 0, 57}, 2);  // head h, slot s: position 3s + h
  EvictionPlan plan;
  plan.reset(0, 4);
  plan.zero_key_channels(0, {0, 5}, 1000);
  plan.zero_key_channels(3, {7}, 60);  // the slots of position < 60: s < 20
  plan.zero_key_channels(2, {1}, 1000);
  host_.apply(plan);
  auto& dev = static_cast<cu::DeviceKvCache&>(*index_.device_rows());
  const int64_t c0 = dev.h2d_copies();
  index_.apply(plan);
  dev.zero_key_channels(plan);
  EXPECT_EQ(dev.h2d_copies() - c0, 1);
  const kernels::KvCache back = dev.download();
  for (int h = 0; h < 4; ++h) {
    SCOPED_TRACE(h);
    ASSERT_EQ(back.length(0, h), host_.length(0, h));
    const kernels::LayerKvView a = back.layer(0), b = host_.layer(0);
    for (int s = 0; s < host_.length(0, h); ++s) {
      EXPECT_EQ(0, std::memcmp(a.key(h, s), b.key(h, s), 8 * sizeof(float))) << "slot " << s;
    }
    EXPECT_EQ(index_.channel_pruned_slots(0, h), host_.channel_pruned_slots(0, h));
  }
  EXPECT_EQ(host_.channel_pruned_slots(0, 3), 20);
  EXPECT_EQ(index_.pruned_key_elements(), host_.pruned_key_elements());
  EXPECT_EQ(host_.pruned_key_elements(), 40u * 2 + 20u);
}


// The device cache re-rotates its kept keys as cpu::rope does on the host (each slot by RoPE's
// angle for slot - position, no attention factor; adjacent pairs and halves; a frequency factor
// and a linear scale), to an ulp or two (the host may fuse a product), and renumbers the
// positions; one upload, no wait.
TEST_F(CudaPolicyOpsParity, RerotateKeysIsTheHostsRotation) {
  for (const auto style : {kernels::cpu::RopeStyle::kNorm, kernels::cpu::RopeStyle::kNeox}) {
    make_caches({40, 33, 0, 57}, 2);  // head h, slot s: position 3s + h
    kernels::cpu::RopeParams rope;
    rope.style = style;
    rope.rot_dim = 6;  // of head_dim 8: the last two dims stay
    rope.theta = 500.0f;
    rope.linear_scale = 2.0f;
    rope.freq_factors = {1.0f, 1.5f, 4.0f};
    rope.attn_factor = 1.25f;  // not applied: a rotation
    kernels::cpu::RopeParams pure = rope;
    pure.attn_factor = 1.0f;
    kernels::KvCache want = host_;
    const kernels::LayerKvView w = want.layer(0);
    for (int h = 0; h < 4; ++h) {
      std::vector<int32_t> delta(want.length(0, h));
      for (int s = 0; s < want.length(0, h); ++s) delta[s] = s - w.position(h)[s];
      if (!delta.empty()) {
        kernels::cpu::rope(w.key(h, 0), delta.data(), static_cast<int>(delta.size()), 1, 8, pure);
      }
    }
    auto& dev = static_cast<cu::DeviceKvCache&>(*index_.device_rows());
    const int64_t c0 = dev.h2d_copies();
    dev.rerotate_keys(0, rope);
    EXPECT_EQ(dev.h2d_copies() - c0, 1);
    const kernels::KvCache back = dev.download();
    const kernels::LayerKvView a = back.layer(0);
    for (int h = 0; h < 4; ++h) {
      for (int s = 0; s < want.length(0, h); ++s) {
        EXPECT_EQ(a.position(h)[s], s);
        for (int i = 0; i < 8; ++i) {
          EXPECT_NEAR(a.key(h, s)[i], w.key(h, s)[i], 1e-6f * (1 + std::fabs(w.key(h, s)[i])))
              << "head " << h << " slot " << s << " dim " << i;
        }
        EXPECT_EQ(0, std::memcmp(a.value(h, s), w.value(h, s), 8 * sizeof(float)));
      }
    }
  }
}


// write_rows uploads a policy's vectors (one counted copy), and qfilter decides on the device as
// on the CPU: its filters written to rows, quadratic_scores with them as the mean (a = -1, b =
// 0), keep_top (adjacent rows: the filters read permuted; GQA group 2; Ada-KV too).
TEST_F(CudaPolicyOpsParity, QFilterDecidesAsOnTheCpu) {
  const int kv = 4, len = 70, d = 8;
  std::unique_ptr<SlotRows> g = gpu_->make_rows(SlotType::kF32, 1, kv);
  const std::vector<float> v = parity::random_vec(static_cast<size_t>(kv) * d, 131);
  const int64_t c0 = gpu_->transfers().h2d_copies;
  gpu_->write_rows(*g, 0, v, d);
  EXPECT_EQ(gpu_->transfers().h2d_copies - c0, 1);
  for (int h = 0; h < kv; ++h) {
    parity::expect_bits(gpu_->read_f32(*g, 0, h),
                        std::vector<float>(v.begin() + h * d, v.begin() + (h + 1) * d),
                        "write_rows");
  }
  const std::string filters = testing_registry::qfilter_filters(1, kv, d);
  for (const bool ada : {false, true}) {
    SCOPED_TRACE(ada);
    make_caches(std::vector<int>(kv, len), 2);
    policies::PolicyConfig pc;
    pc.name = "qfilter";
    pc.kv_budget = 25;
    pc.shape = {1, kv * 2, kv, d, 256};
    std::map<std::string, std::string> o = {{"filters", filters}};
    if (ada) o["ada"] = "true";
    pc.options = policies::PolicyOptions(o);
    kernels::cpu::RopeParams rope;
    rope.style = kernels::cpu::RopeStyle::kNorm;
    rope.rot_dim = d;
    policies::LayerStats st;
    st.layer = 0;
    st.n_new = len;
    st.num_heads = kv * 2;
    st.rope = &rope;
    EvictionPlan cplan, gplan;
    prefill_on_both(pc, st, st, &cplan, &gplan);
    ASSERT_TRUE(gplan.on_device());
    const std::vector<int32_t> lists =
        parity::to_host(gplan.device_slots(), static_cast<size_t>(kv) * gplan.device_ld());
    for (int h = 0; h < kv; ++h) parity::expect_same_keep_list(gplan, lists, cplan, h, len);
  }
}

}  // namespace
}  // namespace kvb
