// Host-side behaviour of the CUDA twins that needs no GPU, so it runs (and can fail) on every
// machine: each launcher rejects bad arguments with kvb::Error before its first CUDA call, and
// without a device the runtime helpers report 0 devices and CUDA failures as kvb::Error naming
// the failed call.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_decode_mma.h"
#include "kernels/cuda/attention_decode_stream.h"
#include "kernels/cuda/attention_prefill_mma.h"
#include "kernels/cuda/budget.h"
#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/dequant.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/kcenter.h"
#include "kernels/cuda/kernel_ready.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/pool.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/scores.h"
#include "kernels/cuda/select.h"
#include "kernels/cuda/subgen_estimator.h"
#include "kernels/cuda/subgen_sketch.h"
#include "kernels/eviction_plan.h"
#include "kernels/ops/cpu_policy_ops.h"
#include "kernels/policies/policy.h"
#include "kernels/policies/snapkv_scores.h"

namespace kvb::kernels::cuda {
namespace {

// Calls are qualified (cuda::rope): with cpu:: argument types, ADL would also find cpu::rope.

// The message of the kvb::Error that `f` throws ("" and a test failure when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no kvb::Error thrown";
  return "";
}

// kvbench does not link cuBLAS (a CPU run would carry ~217 MB of it): nothing the binary loads
// at start needs libcublas, and the GPU path's loader (cublas_api.h) resolves its entry points
// from the toolkit's library when first asked, driver or not.
TEST(CudaHostChecks, CublasIsLoadedOnFirstUseNotAtStart) {
  const std::string cmd = std::string("ldd ") + KVB_BINARY_DIR + "/kvbench 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string deps;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) deps += buf;
  ASSERT_EQ(pclose(p), 0) << deps;
  EXPECT_NE(deps.find("libcudart"), std::string::npos) << deps;  // the check sees CUDA libraries
  EXPECT_EQ(deps.find("libcublas"), std::string::npos) << deps;
  const CublasApi& api = cublas();
  EXPECT_STREQ(api.GetStatusName(CUBLAS_STATUS_ALLOC_FAILED), "CUBLAS_STATUS_ALLOC_FAILED");
  EXPECT_NE(api.GemmEx, nullptr);
  EXPECT_EQ(&cublas(), &api);  // loaded once
  EXPECT_TRUE(cublas_mapped());
}

TEST(CudaHostChecks, LaunchersRejectBadArguments) {
  float dummy[8] = {};
  EXPECT_NE(error_of([&] { rmsnorm(dummy, dummy, dummy, -1, 4, 1e-5f); }).find("n = -1"),
            std::string::npos);
  RopeParams odd;
  odd.rot_dim = 3;
  EXPECT_NE(error_of([&] { cuda::rope(dummy, nullptr, 1, 1, 4, odd); }).find("rot_dim 3"),
            std::string::npos);
  RopeParams factors;
  factors.rot_dim = 4;
  factors.freq_factors = {1.0f};  // needs rot_dim / 2 = 2
  EXPECT_NE(
      error_of([&] { cuda::rope(dummy, nullptr, 1, 1, 4, factors); }).find("frequency factors"),
      std::string::npos);
  RopeParams scaled;
  scaled.rot_dim = 4;
  scaled.attn_factor = 0.0f;  // YaRN / LongRoPE factors are finite and positive
  EXPECT_NE(error_of([&] { cuda::rope(dummy, nullptr, 1, 1, 4, scaled); }).find("attn_factor = 0"),
            std::string::npos);
  // A RopeTable checks the same before it uploads anything.
  EXPECT_NE(error_of([&] { cuda::RopeTable t(odd, 4); }).find("rot_dim 3"), std::string::npos);
  EXPECT_NE(error_of([&] { cuda::RopeTable t(factors, 4); }).find("frequency factors"),
            std::string::npos);
  EXPECT_NE(error_of([&] { cuda::RopeTable t(scaled, 4); }).find("attn_factor = 0"),
            std::string::npos);
  RopeParams wide;
  wide.rot_dim = 8;
  EXPECT_NE(error_of([&] { cuda::RopeTable t(wide, 4); }).find("rot_dim 8 head_dim 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] { dequantize(16, dummy, dummy, 256); }).find("IQ2_XXS"),
            std::string::npos);
  EXPECT_NE(error_of([&] { dequantize(2, dummy, dummy, 33); }).find("multiple of the block"),
            std::string::npos);
  EXPECT_NE(error_of([&] { matmul(dummy, dummy, dummy, nullptr, 1, -2, 1); }).find("k = -2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { cuda::pool1d(dummy, dummy + 8, 1, 4, 4, PoolKind::kMax); }).find("odd"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { cuda::pool1d(dummy, dummy + 2, 1, 4, 3, PoolKind::kAvg); }).find("overlap"),
      std::string::npos);
  int32_t out[8];
  EXPECT_NE(error_of([&] { select_topk(dummy, -1, 1, out); }).find("n = -1"), std::string::npos);
  EXPECT_NE(error_of([&] { select_topk_range(dummy, 3, 2, 1, out); }).find("[3, 2)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { select_topk_rows(dummy, -1, 4, out, out, out, out); }).find("rows"),
            std::string::npos);
  EXPECT_NE(error_of([&] { select_argmin(dummy, nullptr, -4); }).find("n = -4"), std::string::npos);
  RaggedScores rs{dummy, nullptr, out, -1, 4};
  EXPECT_NE(error_of([&] { cuda::global_topk_counts(rs, 3, out); }).find("num_heads = -1"),
            std::string::npos);
  KCenterArgs kc{dummy, 4, 3, 2, 2};  // ld < dim
  EXPECT_NE(error_of([&] { cuda::kcenter_greedy(kc, out); }).find("ld = 2"), std::string::npos);
  SubgenQueryArgs sq;
  EXPECT_NE(error_of([&] { cuda::subgen_query(sq); }).find("head_dim = 0"), std::string::npos);
  EXPECT_NE(error_of([&] {
              accumulate_scores(dummy, 4, out, dummy, 4, 1, 0, policies::GqaReduce::kMean);
            }).find("group = 0"),
            std::string::npos);
  HistoryBitsArgs hb;
  hb.history = 65;
  hb.kv.num_kv_heads = 1;
  hb.num_heads = 1;
  EXPECT_NE(error_of([&] { scissorhands_update_bits(hb); }).find("history 65"), std::string::npos);
}

// SubGen's device sketches check their arguments before any CUDA call.
TEST(CudaHostChecks, SubgenSketchesRejectBadArguments) {
  cpu::SubgenParams p;
  p.head_dim = 4;
  p.s = 2;
  p.t = 0;  // >= 1
  p.max_clusters = 3;
  EXPECT_NE(error_of([&] { DeviceSubgenSketches bad(p, 1, 2, nullptr); }).find("t 0"),
            std::string::npos);
  p.t = 2;
  float dummy[8] = {};
  const int32_t lengths[2] = {3, 5};
  DeviceLayerKvView kv;
  kv.keys = kv.values = dummy;
  kv.host_lengths = lengths;
  kv.num_kv_heads = 2;
  kv.head_dim = 4;
  SubgenLayerSketches sk;
  sk.m_keys = dummy;
  const SubgenAbsorbHead past{.head = 0, .first = 2, .end = 4};  // head 0 holds 3 slots
  EXPECT_NE(error_of([&] { cuda::subgen_absorb(p, sk, kv, {&past, 1}, 0, 0, true); })
                .find("slots [2, 4)"),
            std::string::npos);
  const SubgenAbsorbHead twice[2] = {{.head = 1, .end = 1}, {.head = 1, .end = 2}};
  EXPECT_NE(error_of([&] { cuda::subgen_absorb(p, sk, kv, twice, 0, 0, true); }).find("twice"),
            std::string::npos);
  SubgenQueryHeadsArgs q;
  q.n = 1;
  q.num_heads = 4;
  q.head_dim = 4;
  q.kv = kv;
  q.s = q.t = q.max_clusters = 1;
  const uint8_t flags[1] = {0};
  q.compressed = flags;  // one flag for two KV heads
  q.lengths = lengths;
  EXPECT_NE(error_of([&] { cuda::subgen_query_heads(q); }).find("1 compressed flags"),
            std::string::npos);
}

// The SnapKV family's ops check their arguments before any CUDA call (rows are allocated lazily,
// so none of this touches a device).
TEST(CudaHostChecks, PolicyOpsRejectBadSnapKvArguments) {
  float dummy[8] = {};
  int32_t out[8] = {};
  RaggedScores rs{dummy, nullptr, out, -1, 4};
  EXPECT_NE(error_of([&] { cuda::global_topk_counts_unchecked(rs, 3, out); }).find("num_heads"),
            std::string::npos);
  CudaPolicyOps ops(nullptr);
  kvb::kernels::ops::CpuPolicyOps cpu;
  KvCache cache({1, 1, 4}, 4, /*host_rows=*/false);
  cache.append(0, 0, nullptr, nullptr, 0);
  policies::LayerStats st;
  st.num_heads = 1;
  st.stride = 1;
  st.last_w = 1;
  st.last_probs = dummy;
  std::unique_ptr<policies::SlotRows> rows = ops.make_rows(policies::SlotType::kF32, 1, 1);
  policies::SnapKvScoreOptions even;
  even.pool_kernel = 4;
  EXPECT_NE(error_of([&] { window_scores(ops, *rows, 0, st, cache, even); }).find("odd"),
            std::string::npos);
  // Rows for 2 heads on a cache of 1.
  std::unique_ptr<policies::SlotRows> two = ops.make_rows(policies::SlotType::kF32, 1, 2);
  EXPECT_NE(error_of([&] { window_scores(ops, *two, 0, st, cache, {}); }).find("window scores"),
            std::string::npos);
  std::unique_ptr<policies::SlotRows> host = cpu.make_rows(policies::SlotType::kF32, 1, 1);
  EXPECT_NE(error_of([&] { window_scores(ops, *host, 0, st, cache, {}); }).find("another ops"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)ada_head_budgets(ops, *rows, 0, cache, 0, 2, 0.5); })
                .find("without device rows"),
            std::string::npos);
  EXPECT_EQ(ops.launches(), 0);
  EXPECT_EQ(ops.transfers().d2h_copies, 0);
}

// subgen_kcenter's ops and the biased batched query check their arguments before any CUDA call.
TEST(CudaHostChecks, KCenterOpsRejectBadArguments) {
  CudaPolicyOps ops(nullptr);
  std::unique_ptr<policies::SlotRows> rows = ops.make_rows(policies::SlotType::kF32, 1, 2);
  const policies::RowErase past[] = {{.head = 1, .first = 0, .count = 1}};  // the row is empty
  EXPECT_NE(
      error_of([&] { ops.erase(*rows, 0, past); }).find("[0, 1) of head 1 of 2, holding 0"),
      std::string::npos);
  KvCache cache({1, 2, 4}, 4, /*host_rows=*/false);
  EvictionPlan plan;
  plan.reset(0, 2);
  const policies::KCenterKeep keep[] = {{.head = 0, .prefix = 0, .k = 1}};
  EXPECT_NE(error_of([&] { ops.kcenter_keep(cache, keep, nullptr, plan); })
                .find("kcenter_keep on a cache without device rows"),
            std::string::npos);
  EvictionPlan three;
  three.reset(0, 3);
  EXPECT_NE(error_of([&] { ops.kcenter_keep(cache, keep, nullptr, three); }).find("3 heads"),
            std::string::npos);
  float dummy[8] = {};
  const int32_t lengths[2] = {3, 5};
  SubgenQueryHeadsArgs q;
  q.n = 1;
  q.num_heads = 2;
  q.head_dim = 4;
  q.kv.keys = q.kv.values = dummy;
  q.kv.host_lengths = lengths;
  q.kv.num_kv_heads = 2;
  q.kv.head_dim = 4;
  const uint8_t one[2] = {1, 0};
  q.compressed = one;  // a compressed head needs s, t, max_clusters >= 1
  q.lengths = lengths;
  EXPECT_NE(error_of([&] { subgen_query_heads(q); }).find("with a compressed head"),
            std::string::npos);
  const uint8_t none[2] = {0, 0};
  q.compressed = none;
  q.exact_bias = dummy;
  q.bias_ld = 4;  // head 1 holds 5 slots
  EXPECT_NE(error_of([&] { subgen_query_heads(q); }).find("bias rows of 4 entries"),
            std::string::npos);
  EXPECT_EQ(ops.launches(), 0);
}

// The batched k-center validates every problem before its first CUDA call: a bad problem after
// a good one is named (index and values) instead of the good one being launched first (which,
// without a device, would fail as a CUDA call); a batch that chooses no centre makes no call.
TEST(CudaHostChecks, KCenterBatchRejectsBadProblems) {
  float dummy[8] = {};
  int32_t out[8] = {};
  KCenterProblem good;
  good.args = {dummy, 2, 3, 4, 2};
  good.centres = out;
  KCenterProblem bad_ld = good;
  bad_ld.args.ld = 2;  // < dim
  KCenterProblem no_centres = good;
  no_centres.centres = nullptr;
  KCenterProblem no_keys = good;
  no_keys.args.keys = nullptr;
  KCenterProblem negative = good;
  negative.args.n = -3;
  // The message of a batch's error (checked with find: it also names the file and line).
  auto batch_error = [](std::span<const KCenterProblem> batch) {
    return error_of([&] { kcenter_greedy_batch(batch); });
  };
  const KCenterProblem b1[] = {good, good, bad_ld};
  EXPECT_NE(batch_error(b1).find("problem 2 of 3: n = 2, dim = 3, ld = 2"), std::string::npos);
  const KCenterProblem b2[] = {good, no_centres};
  EXPECT_NE(batch_error(b2).find("problem 1 of 2 (n = 2, k = 2): null centres"),
            std::string::npos);
  const KCenterProblem b3[] = {no_keys};
  EXPECT_NE(batch_error(b3).find("problem 0 of 1 (n = 2, k = 2): null keys"), std::string::npos);
  const KCenterProblem b4[] = {good, negative};
  EXPECT_NE(batch_error(b4).find("problem 1 of 2: n = -3"), std::string::npos);
  // Null pointers are fine where nothing is chosen (k = 0 or n = 0): skipped, never read.
  KCenterProblem k0 = no_centres;
  k0.args.k = 0;
  KCenterProblem n0 = no_keys;
  n0.args.n = 0;
  const KCenterProblem none[] = {k0, n0};
  EXPECT_EQ(kcenter_greedy_batch(none), 0);
  EXPECT_EQ(kcenter_greedy_batch({}), 0);
  EXPECT_EQ(out[0], 0);
}

TEST(CudaHostChecks, AttentionValidatesAgainstHostLengths) {
  const int32_t lengths[2] = {5, 2};
  DeviceLayerKvView kv;
  kv.num_kv_heads = 2;
  kv.head_dim = 8;
  kv.host_lengths = lengths;
  kv.lengths = lengths;  // never read on the host; any non-null pointer passes the check
  kv.offsets = lengths;
  float buf[64] = {};
  AttentionArgs a;
  a.out = buf;
  a.q = buf;
  a.kv = kv;
  a.kv.keys = buf;
  a.kv.values = buf;
  a.n = 3;  // head 1 holds only 2 slots
  a.num_heads = 4;
  a.scale = 1.0f;
  EXPECT_NE(error_of([&] { attention(a); }).find("head 1 holds 2 slots"), std::string::npos);
  a.n = 1;
  a.num_heads = 3;  // not a multiple of 2
  EXPECT_NE(error_of([&] { attention(a); }).find("num_heads 3"), std::string::npos);
  a.num_heads = 4;
  a.col_sums = buf;
  a.stats_stride = 4;  // < 5
  EXPECT_NE(error_of([&] { attention(a); }).find("stats_stride 4"), std::string::npos);
  a.col_sums = nullptr;
  a.last_probs = buf;
  a.stats_stride = 5;
  a.last_w = 2;  // > n
  EXPECT_NE(error_of([&] { attention(a); }).find("last_w 2"), std::string::npos);
  a.last_probs = nullptr;
  a.kv.head_dim = kMaxHeadDim + 1;
  EXPECT_NE(error_of([&] { attention(a); }).find("head_dim"), std::string::npos);
}

// The decode tuning knobs take 0 (default), decode_rows 1, 2, 4 and decode_blocks up to a grid's
// y extent; anything else is refused before the first CUDA call (n = 0: a valid call that
// touches no device, so the accepted values can be checked here too).
TEST(CudaHostChecks, AttentionRejectsBadDecodeTuning) {
  const int32_t lengths[2] = {5, 2};
  DeviceLayerKvView kv;
  kv.num_kv_heads = 2;
  kv.head_dim = 8;
  kv.host_lengths = lengths;
  kv.lengths = lengths;
  kv.offsets = lengths;
  float buf[64] = {};
  AttentionArgs a;
  a.out = buf;
  a.q = buf;
  a.kv = kv;
  a.kv.keys = buf;
  a.kv.values = buf;
  a.n = 1;
  a.num_heads = 4;
  a.scale = 1.0f;
  a.decode_rows = 3;
  EXPECT_NE(error_of([&] { attention(a); }).find("decode_rows 3"), std::string::npos);
  a.decode_rows = 8;
  EXPECT_NE(error_of([&] { attention(a); }).find("decode_rows 8"), std::string::npos);
  a.decode_rows = -1;
  EXPECT_NE(error_of([&] { attention(a); }).find("decode_rows -1"), std::string::npos);
  a.decode_rows = 4;
  a.decode_blocks = -1;
  EXPECT_NE(error_of([&] { attention(a); }).find("decode_blocks -1"), std::string::npos);
  a.decode_blocks = kMaxDecodeBlocks + 1;
  EXPECT_NE(error_of([&] { attention(a); }).find("decode_blocks 65536"), std::string::npos);
  a.decode_blocks = 0;
  a.decode_kernel = 4;  // one past kDecodeTensorCore (3 until that kernel was added)
  EXPECT_NE(error_of([&] { attention(a); }).find("decode_kernel 4"), std::string::npos);
  a.decode_kernel = -1;
  EXPECT_NE(error_of([&] { attention(a); }).find("decode_kernel -1"), std::string::npos);
  a.n = 0;
  for (int kernel : {kDecodeDefault, kDecodeGrouped, kDecodeStreamed, kDecodeTensorCore}) {
    for (int rows : {0, 1, 2, 4}) {
      for (int blocks : {0, 1, 1056, kMaxDecodeBlocks}) {
        a.decode_kernel = kernel;
        a.decode_rows = rows;
        a.decode_blocks = blocks;
        EXPECT_NO_THROW(attention(a)) << "decode_kernel " << kernel << " decode_rows " << rows
                                      << " decode_blocks " << blocks;
      }
    }
  }
}

// The streamed decode kernel refuses, on the host and before asking the device anything, the
// layers it cannot take (the grouped path runs them): head_dim that is not whole 16-byte
// vectors, vectors per row not a power of two, groups over 8, misaligned rows.
TEST(CudaHostChecks, DecodeStreamTakesOnlyItsShapes) {
  alignas(16) static unsigned char rows[64];
  DeviceLayerKvView kv;
  kv.num_kv_heads = 2;
  kv.keys = rows;
  kv.values = rows;
  kv.dtype = KvDtype::kBf16;
  kv.head_dim = 7;  // 14-byte rows
  EXPECT_EQ(plan_decode_stream(kv, 4, 100, 0).splits, 0);
  kv.head_dim = 96;  // 12 vectors
  EXPECT_EQ(plan_decode_stream(kv, 4, 100, 0).splits, 0);
  kv.head_dim = 128;
  EXPECT_EQ(plan_decode_stream(kv, 9, 100, 0).splits, 0);
  kv.keys = rows + 4;
  EXPECT_EQ(plan_decode_stream(kv, 4, 100, 0).splits, 0);
  kv.dtype = KvDtype::kF32;
  kv.keys = rows;
  kv.head_dim = 6;  // 24-byte rows
  EXPECT_EQ(plan_decode_stream(kv, 2, 100, 0).splits, 0);
}

// The tensor-core decode kernel refuses, on the host and before asking the device anything, the
// layers it cannot take (the default decode kernel runs them): f32 caches, head_dims it has no
// instance for, groups over 16, misaligned rows.
TEST(CudaHostChecks, DecodeMmaTakesOnlyItsShapes) {
  alignas(16) static unsigned char rows[64];
  DeviceLayerKvView kv;
  kv.num_kv_heads = 2;
  kv.keys = rows;
  kv.values = rows;
  kv.dtype = KvDtype::kF32;
  kv.head_dim = 128;
  EXPECT_EQ(plan_decode_mma(kv, 4, 100, 0).splits, 0);
  kv.dtype = KvDtype::kBf16;
  for (int d : {8, 40, 48, 80, 112, 160, 192}) {
    kv.head_dim = d;
    EXPECT_EQ(plan_decode_mma(kv, 4, 100, 0).splits, 0) << "head_dim " << d;
  }
  kv.head_dim = 128;
  EXPECT_EQ(plan_decode_mma(kv, 17, 100, 0).splits, 0);
  EXPECT_EQ(plan_decode_mma(kv, 0, 100, 0).splits, 0);
  EXPECT_EQ(plan_decode_mma(kv, 4, 0, 0).splits, 0);
  kv.values = rows + 8;
  EXPECT_EQ(plan_decode_mma(kv, 4, 100, 0).splits, 0);
}

// A split-K grid (kernel_ready.h) covers the longest head in whole tiles, gives each chunk at
// least min_tiles tiles where the head has them, and asks for about `target` blocks: hand-worked
// cases.
TEST(CudaHostChecks, SplitGridSizes) {
  struct Case {
    int target, heads, max_len, tile, min_tiles;
    int chunk, splits;  // hand-worked
  };
  const Case cases[] = {
      // 4K keys, 8 KV heads, 132 blocks wanted: 16 chunks a head by blocks (rounded down); 128
      // tiles of 32 split into chunks of 8 tiles (256 keys), 16 of them.
      {132, 8, 4096, 32, 4, 256, 16},
      // Five tiles and four at least a chunk: one chunk of all five.
      {1000, 1, 150, 32, 4, 160, 1},
      // The streamed kernel's form (min_tiles 1): one chunk per tile when blocks are plenty; a
      // 1-key head is one tile.
      {1000, 2, 100, 32, 1, 32, 4},
      {0, 3, 1, 32, 1, 32, 1},
      // 32K keys over 8 heads at 264 blocks (2 per multiprocessor on 132): 33 chunks a head by
      // blocks, 1024 tiles: chunks of 32 tiles (1024 keys), 32 of them.
      {264, 8, 32768, 32, 4, 1024, 32},
      // One block per multiprocessor on 132 (the tensor-core kernel's fit), 32K keys over 8
      // heads: 16 chunks of 2048 keys, 128 blocks (rounding up would give 17 of 1952 keys, 136
      // blocks, four of them in a second wave).
      {132, 8, 32768, 32, 4, 2048, 16},
      // Fewer blocks wanted than heads: one chunk a head.
      {5, 8, 4096, 32, 4, 4096, 1},
  };
  for (const Case& c : cases) {
    const SplitGrid g = split_grid(c.target, c.heads, c.max_len, c.tile, c.min_tiles);
    EXPECT_EQ(g.chunk, c.chunk) << c.target << " blocks, " << c.heads << " heads, " << c.max_len;
    EXPECT_EQ(g.splits, c.splits) << c.target << " blocks, " << c.heads << " heads, " << c.max_len;
  }
}

// The tensor-core prefill takes only bf16 caches, its compiled head_dims and 16-byte aligned
// rows, decided on the host before the device is asked for its compute capability.
TEST(CudaHostChecks, PrefillMmaTakesOnlyItsShapes) {
  alignas(16) static unsigned char rows[64];
  DeviceLayerKvView kv;
  kv.num_kv_heads = 1;
  kv.head_dim = 128;
  kv.keys = rows;
  kv.values = rows;
  kv.dtype = KvDtype::kF32;
  EXPECT_FALSE(prefill_mma_supported(kv));  // an f32 cache: the exact kernel
  kv.dtype = KvDtype::kBf16;
  for (int d : {8, 40, 80, 112, 136, 255}) {
    kv.head_dim = d;
    EXPECT_FALSE(prefill_mma_supported(kv)) << "head_dim " << d;
  }
  kv.head_dim = 64;
  kv.values = rows + 2;  // bf16 rows 2-byte aligned only
  EXPECT_FALSE(prefill_mma_supported(kv));
  kv.values = rows;
  for (int d : {32, 64, 96, 128, 256}) {
    kv.head_dim = d;
    if (has_device()) {
      int dev = 0, major = 0;
      KVB_CUDA_CHECK(cudaGetDevice(&dev));
      KVB_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
      EXPECT_EQ(prefill_mma_supported(kv), major >= 8) << "head_dim " << d;
    } else {
      EXPECT_THROW(prefill_mma_supported(kv), Error) << "head_dim " << d;  // no device to ask
    }
  }
}

TEST(CudaHostChecks, DeviceKvCacheValidatesShape) {
  EXPECT_NE(error_of([] {
              DeviceKvCache c({0, 2, 8}, KvDtype::kF32, 4);
            }).find("bad shape"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              DeviceKvCache c({2, 2, 8}, KvDtype::kBf16, std::vector<int32_t>{1, 2, 3});
            }).find("3 capacities for 4 heads"),
            std::string::npos);
  EXPECT_EQ(kv_dtype_bytes(KvDtype::kBf16), 2u);
  EXPECT_EQ(kv_dtype_bytes(KvDtype::kF32), 4u);
}

TEST(CudaHostChecks, NoDeviceMeansZeroAndNamedErrors) {
  EXPECT_EQ(has_device(), device_count() > 0);
  if (has_device()) GTEST_SKIP() << "a device is present; the no-device path cannot be shown";
  EXPECT_EQ(device_count(), 0);
  EXPECT_EQ(device_count(), 0);  // repeated queries stay quiet (the driver error is persistent)
  // A CUDA failure is a kvb::Error naming the call and CUDA's error name.
  const std::string msg = error_of([] { DeviceBuffer<float> b(16); });
  EXPECT_NE(msg.find("cudaMalloc"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cudaError"), std::string::npos) << msg;
  // Zero-sized buffers allocate nothing, so they work anywhere.
  DeviceBuffer<float> empty(0);
  EXPECT_EQ(empty.data(), nullptr);
}

// Outside a capture (kernels/cuda/graph.h) the capture-aware helpers are the plain calls: nothing
// is captured, waits and host copies are allowed, empty work touches no CUDA call (so this runs
// without a device), and a StepGraph without a driver fails as a named error.
TEST(CudaHostChecks, CaptureHelpersOutsideACapture) {
  EXPECT_FALSE(capturing(nullptr));
  EXPECT_FALSE(capturing_any());
  EXPECT_NO_THROW(require_not_capturing(nullptr, "a wait for the device"));
  EXPECT_NO_THROW(free_async(nullptr, nullptr));
  const int host = 7;
  EXPECT_NO_THROW(upload_async(nullptr, &host, 0, nullptr));
  if (has_device()) return;
  const std::string msg = error_of([] { StepGraph g(nullptr); });
  EXPECT_NE(msg.find("cudaStreamCreateWithFlags"), std::string::npos) << msg;
  EXPECT_FALSE(capturing_any());  // the failed construction left no capture behind
}

}  // namespace
}  // namespace kvb::kernels::cuda
