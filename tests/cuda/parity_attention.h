// Attention and device-KV-cache cases of the parity table (test_cuda_parity.cc): the same
// ragged cache on both sides (the CPU reference reads the device cache's own download, so a
// bf16 cache is compared against the CPU on exactly the rounded values), prefill and decode,
// statistics, append/compaction/accounting.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_cache_device.h"
#include "tests/cuda/parity_util.h"

namespace kvb::parity {

struct AttentionCase {
  int n;                    // query tokens (1: the decode path)
  std::vector<int> before;  // per KV head: slots cached before the block (ragged)
  int group;                // query heads per KV head
  int head_dim;
  cu::KvDtype dtype;
  bool stats;             // col_sums + last_probs
  int window = 0;         // sliding window (no statistics with one)
  int decode_rows = 0;    // cu::AttentionArgs::decode_rows (0: the kernel's default)
  int decode_blocks = 0;  // cu::AttentionArgs::decode_blocks (0: the kernel's default)
  int decode_kernel = 0;  // cu::AttentionArgs::decode_kernel (0: the default)
};

inline std::string describe(const AttentionCase& c) {
  std::string s = "n=" + std::to_string(c.n) + " group=" + std::to_string(c.group) +
                  " d=" + std::to_string(c.head_dim) + " " + cu::kv_dtype_name(c.dtype) +
                  " before={";
  for (int b : c.before) s += std::to_string(b) + ",";
  return s + "}" + (c.stats ? " stats" : "") +
         (c.window > 0 ? " window=" + std::to_string(c.window) : "") +
         (c.decode_rows > 0 ? " decode_rows=" + std::to_string(c.decode_rows) : "") +
         (c.decode_blocks > 0 ? " decode_blocks=" + std::to_string(c.decode_blocks) : "") +
         (c.decode_kernel > 0 ? " decode_kernel=" + std::to_string(c.decode_kernel) : "");
}

inline void run_attention_case(const AttentionCase& c) {
  const std::string what = describe(c);
  const int kvh = static_cast<int>(c.before.size()), nh = kvh * c.group, d = c.head_dim;
  const kernels::KvCacheShape shape{1, kvh, d};
  // Fill a device cache: the earlier slots first, per head, then the block's n slots for all.
  std::vector<int32_t> caps(kvh);
  int max_len = 0;
  for (int h = 0; h < kvh; ++h) {
    caps[h] = c.before[h] + c.n + 3;  // spare room: capacities differ from lengths
    max_len = std::max(max_len, c.before[h] + c.n);
  }
  cu::DeviceKvCache dev(shape, c.dtype, caps);
  uint64_t seed = 100;
  for (int h = 0; h < kvh; ++h) {
    // Slot s holds random_vec(d, ...) for its key then its value, seeds in (head, slot) order;
    // one upload per head (heads of 64K slots), then one append per slot.
    std::vector<float> hk, hv;
    for (int s = 0; s < c.before[h]; ++s) {
      const std::vector<float> k = random_vec(d, ++seed), v = random_vec(d, ++seed);
      hk.insert(hk.end(), k.begin(), k.end());
      hv.insert(hv.end(), v.begin(), v.end());
    }
    if (c.before[h] == 0) continue;
    const auto kd = to_device(hk), vd = to_device(hv);
    for (int s = 0; s < c.before[h]; ++s) {
      const size_t at = static_cast<size_t>(s) * d;
      dev.append(0, h, kd.data() + at, vd.data() + at, s);
    }
  }
  const auto kb = to_device(random_vec(static_cast<size_t>(c.n) * kvh * d, ++seed, -2, 2));
  const auto vb = to_device(random_vec(static_cast<size_t>(c.n) * kvh * d, ++seed));
  std::vector<int32_t> pos(c.n);
  for (int i = 0; i < c.n; ++i) pos[i] = 5000 + i;
  const auto posd = to_device(pos);
  dev.append(0, kb.data(), vb.data(), posd.data(), c.n);
  kernels::KvCache cpu = dev.download();  // the exact values the device holds (bf16 widened)
  for (int h = 0; h < kvh; ++h) ASSERT_EQ(cpu.length(0, h), c.before[h] + c.n) << what;

  const std::vector<float> q = random_vec(static_cast<size_t>(c.n) * nh * d, ++seed, -2, 2);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int stride = max_len + 5, last_w = std::min(c.n, 3);
  const size_t stats_n = static_cast<size_t>(nh) * stride;
  std::vector<float> out(q.size()), cs(stats_n), lp(stats_n * last_w);
  kernels::cpu::AttentionArgs ca{out.data(), q.data(), cpu.layer(0), c.n, nh, scale};
  ca.window = c.window;
  if (c.stats) {
    ca.col_sums = cs.data();
    ca.last_probs = lp.data();
    ca.last_w = last_w;
    ca.stats_stride = stride;
  }
  kernels::cpu::attention(ca);

  const auto qd = to_device(q);
  cu::DeviceBuffer<float> outd(q.size()), csd(stats_n), lpd(stats_n * last_w);
  // Garbage in the outputs: every element must be written (stats rows past a head: zeroed).
  KVB_CUDA_CHECK(cudaMemset(outd.data(), 0x7f, outd.bytes()));
  KVB_CUDA_CHECK(cudaMemset(csd.data(), 0x7f, csd.bytes()));
  KVB_CUDA_CHECK(cudaMemset(lpd.data(), 0x7f, lpd.bytes()));
  cu::AttentionArgs ga;
  ga.out = outd.data();
  ga.q = qd.data();
  ga.kv = dev.layer(0);
  ga.n = c.n;
  ga.num_heads = nh;
  ga.scale = scale;
  ga.window = c.window;
  ga.decode_rows = c.decode_rows;
  ga.decode_blocks = c.decode_blocks;
  ga.decode_kernel = c.decode_kernel;
  if (c.stats) {
    ga.col_sums = csd.data();
    ga.last_probs = lpd.data();
    ga.last_w = last_w;
    ga.stats_stride = stride;
  }
  cu::attention(ga);
  // Outputs are convex combinations of values in [-1, 1]: f32 rounding stays far below 1e-5.
  expect_close(to_host(outd), out, 2e-5, 1e-4, what + " out");
  if (c.stats) {
    // Column sums add up to n probabilities: the bound scales with the sum.
    expect_close(to_host(csd), cs, 1e-5, 1e-4, what + " col_sums");
    expect_close(to_host(lpd), lp, 1e-6, 1e-4, what + " last_probs");
  }
}

inline std::vector<AttentionCase> attention_cases() {
  using K = cu::KvDtype;
  std::vector<AttentionCase> v;
  for (K dt : {K::kF32, K::kBf16}) {
    // Decode over ragged heads, GQA groups 1, 2, 4, 7, lengths 1 .. 4097.
    v.push_back({1, {0}, 1, 64, dt, true});
    v.push_back({1, {2, 6, 16}, 2, 64, dt, true});
    v.push_back({1, {4096, 16, 0}, 7, 64, dt, true});
    v.push_back({1, {300, 700}, 4, 128, dt, false});
    // The grouped decode kernel at its limits: group 8, head_dim 256 (f32: two 16-byte vectors
    // per lane), four ragged heads one of them empty before the query; head_dim 40 does not split
    // into 16-byte vectors over a power of two of lanes: the per-query-head kernel.
    v.push_back({1, {2000, 5, 300, 0}, 8, 256, dt, true});
    v.push_back({1, {70, 3}, 3, 40, dt, true});
    // Sliding windows (Gemma 3's local layers, Mistral): prefill blocks whose queries start
    // inside, at and past the window's reach, ragged heads, and decode past the window on both
    // decode kernels (head_dim 64: grouped; 40: per query head).
    v.push_back({17, {20, 3, 0}, 2, 64, dt, false, 8});
    v.push_back({40, {100}, 4, 64, dt, false, 33});
    v.push_back({1, {300, 12}, 4, 64, dt, false, 16});
    v.push_back({1, {300, 12}, 3, 40, dt, false, 16});
    // Prefill blocks of 3, 7, 17 over ragged earlier slots; odd head_dim 40 and the maximum 256.
    v.push_back({3, {0, 5}, 2, 40, dt, true});
    v.push_back({7, {17, 0, 1}, 7, 64, dt, true});
    v.push_back({17, {4080, 3}, 4, 64, dt, true});
    v.push_back({17, {33}, 1, 256, dt, true});
  }
  // A 4097-token prompt (one head pair, small head_dim to keep the CPU reference quick).
  v.push_back({4097, {0}, 2, 32, K::kF32, true});
  v.push_back({4097, {0}, 1, 32, K::kBf16, false});
  return v;
}

// The grouped decode kernel's tuning knobs (cu::AttentionArgs::decode_rows, decode_blocks) on
// both cache dtypes, named. Ragged heads whose lengths (before + the query: 1, 3, 67, 1201, ...)
// are not multiples of decode_rows x row groups per block, so batches end part-way; splits from
// 1 per head to 1024 per head (a 65536-slot head of 64-key chunks: the combine's longest loop);
// group 7 under the 8-head template; head_dim 256 (f32: two 16-byte vectors per lane, the most
// registers); windows that start mid-batch; head_dim 40, where the knobs are ignored.
inline std::vector<std::pair<std::string, AttentionCase>> decode_tuning_cases() {
  using K = cu::KvDtype;
  std::vector<std::pair<std::string, AttentionCase>> v;
  for (K dt : {K::kF32, K::kBf16}) {
    auto add = [&](const std::string& name, std::vector<int> before, int group, int head_dim,
                   bool stats, int rows, int blocks, int window = 0) {
      v.push_back({name + "_" + cu::kv_dtype_name(dt),
                   {1, std::move(before), group, head_dim, dt, stats, window, rows, blocks,
                    cu::kDecodeGrouped}});
    };
    const std::vector<int> ragged = {0, 2, 66, 1200}, ragged_long = {16383, 2, 66, 1000};
    add("rows1_g4_d128_stats", ragged, 4, 128, true, 1, 0);
    add("rows2_g4_d128_stats", ragged, 4, 128, true, 2, 0);
    add("rows4_g4_d128", ragged, 4, 128, false, 4, 0);
    add("rows4_g4_d128_stats", ragged, 4, 128, true, 4, 0);
    add("rows2_g8_d256_stats", {1000, 66, 2, 0}, 8, 256, true, 2, 0);
    add("rows4_g8_d256", {1000, 66, 2, 0}, 8, 256, false, 4, 0);
    add("rows4_g7_d64_stats", {66, 0, 1000}, 7, 64, true, 4, 0);
    add("rows4_g1_d32", {1000, 3}, 1, 32, false, 4, 0);
    add("rows2_g4_d64_window16", {300, 12}, 4, 64, false, 2, 0, 16);
    add("rows4_g4_d64_window33", {300, 12}, 4, 64, false, 4, 0, 33);
    add("blocks1_rows4_g4_d128_stats", ragged, 4, 128, true, 4, 1);
    add("blocks1024_g4_d128_stats", ragged_long, 4, 128, true, 0, 1024);
    add("blocks1024_rows1_g4_d128_stats", ragged_long, 4, 128, true, 1, 1024);
    add("blocks1024_rows4_g4_d128", ragged_long, 4, 128, false, 4, 1024);
    add("blocks1024_rows2_g4_d128_stats", ragged_long, 4, 128, true, 2, 1024);
    add("blocks1024_rows4_one_head_g4_d64_stats", {65535}, 4, 64, true, 4, 1024);
    add("rows4_blocks1024_g3_d40_stats_ignored", {70, 3}, 3, 40, true, 4, 1024);
  }
  return v;
}

// The streamed decode kernel (cu::kDecodeStreamed, attention_decode_stream.h) on both cache
// dtypes, named: ragged heads whose lengths (1, 3, 67, 1201, ...) end tiles part-way and leave
// chunks of some heads empty; GQA groups 1, 2, 3 (rounded up to 4), 4, 7 and 8; head_dim 8 (one
// 16-byte bf16 vector per row), 40 (bf16: five vectors, not a power of two: the grouped kernel
// runs), 64, 128 and 256 (f32 group 8: four vectors per thread, the most registers); one split
// per head and 1024 (a 65536-slot head of 64-key chunks: three-stage pipelines of two tiles);
// long heads of 16K-64K slots, where every stage cycles many times; windows that start
// mid-tile; statistics (raw scores for the probabilities) with and without.
inline std::vector<std::pair<std::string, AttentionCase>> decode_stream_cases() {
  using K = cu::KvDtype;
  std::vector<std::pair<std::string, AttentionCase>> v;
  for (K dt : {K::kF32, K::kBf16}) {
    auto add = [&](const std::string& name, std::vector<int> before, int group, int head_dim,
                   bool stats, int blocks, int window = 0) {
      v.push_back({"stream_" + name + "_" + cu::kv_dtype_name(dt),
                   {1, std::move(before), group, head_dim, dt, stats, window, 0, blocks,
                    cu::kDecodeStreamed}});
    };
    const std::vector<int> ragged = {0, 2, 66, 1200}, ragged_long = {16383, 2, 66, 1000};
    add("g4_d128_stats", ragged, 4, 128, true, 0);
    add("g4_d128", ragged, 4, 128, false, 0);
    add("g1_d64_stats", {300, 0}, 1, 64, true, 0);
    add("g2_d64", {31, 32, 33}, 2, 64, false, 0);
    add("g3_d128_stats", {66, 0, 1000}, 3, 128, true, 0);
    add("g7_d64_stats", {66, 0, 1000}, 7, 64, true, 0);
    add("g8_d256_stats", {1000, 66, 2, 0}, 8, 256, true, 0);
    add("g1_d256", {1000, 3}, 1, 256, false, 0);
    add("g4_d8_stats", {500, 7}, 4, 8, true, 0);
    add("g3_d40_stats_fallback", {70, 3}, 3, 40, true, 0);
    add("g4_d64_window16", {300, 12}, 4, 64, false, 0, 16);
    add("g4_d64_window33", {300, 12}, 4, 64, false, 0, 33);
    add("blocks1_g4_d128_stats", ragged, 4, 128, true, 1);
    add("blocks1024_g4_d128_stats", ragged_long, 4, 128, true, 1024);
    add("blocks1024_one_head_g4_d64_stats", {65535}, 4, 64, true, 1024);
    add("long_g2_d128", {32767, 20000}, 2, 128, false, 0);
  }
  return v;
}

// Append, keep_slots (device lists for all heads, and KvCache's one-head form), clear and the
// byte accounting, replayed on a CPU KvCache and compared after every step.
// head_dim picks the compaction's piece size: rows of 16k bytes move as 16-byte pieces, others
// as 4 or 2 bytes (20: f32 80 bytes, bf16 40; 7: bf16 14 bytes).
inline void run_kv_cache_case(cu::KvDtype dtype, int head_dim = 20) {
  const kernels::KvCacheShape shape{2, 3, head_dim};
  const int d = shape.head_dim, heads = shape.num_kv_heads;
  cu::DeviceKvCache dev(shape, dtype, std::vector<int32_t>{40, 17, 33, 8, 40, 40});
  kernels::KvCache cpu(shape, 40);
  uint64_t seed = 900;
  auto same = [&](const std::string& what) {
    kernels::KvCache got = dev.download();
    for (int l = 0; l < shape.num_layers; ++l) {
      for (int h = 0; h < heads; ++h) {
        ASSERT_EQ(got.length(l, h), cpu.length(l, h)) << what << " l" << l << " h" << h;
        const kernels::LayerKvView a = got.layer(l), b = cpu.layer(l);
        for (int s = 0; s < cpu.length(l, h); ++s) {
          ASSERT_EQ(a.position(h)[s], b.position(h)[s]) << what << " slot " << s;
          for (int x = 0; x < d; ++x) {
            ASSERT_EQ(a.key(h, s)[x], b.key(h, s)[x]) << what << " key " << s << "," << x;
            ASSERT_EQ(a.value(h, s)[x], b.value(h, s)[x]) << what << " value " << s << "," << x;
          }
        }
      }
    }
    const size_t slot = 2 * static_cast<size_t>(d) * cu::kv_dtype_bytes(dtype) + 4;
    EXPECT_EQ(dev.bytes_per_slot(), slot);
    EXPECT_EQ(dev.total_slots(), cpu.total_slots()) << what;
    EXPECT_EQ(dev.logical_bytes(), cpu.total_slots() * slot) << what;
    EXPECT_EQ(dev.physical_bytes(), (40 + 17 + 33 + 8 + 40 + 40) * slot) << what;
    EXPECT_EQ(dev.logical_bytes(1, 2), cpu.length(1, 2) * slot) << what;
  };
  // The CPU side stores what the device stores: bf16-rounded inputs when the cache is bf16.
  auto host_val = [&](float f) { return dtype == cu::KvDtype::kBf16 ? bf16_round(f) : f; };
  for (int t = 0; t < 8; ++t) {  // 8 tokens into layer 0 (all heads), then 3 into head 1 of layer 1
    std::vector<float> k = random_vec(static_cast<size_t>(heads) * d, ++seed);
    std::vector<float> v = random_vec(static_cast<size_t>(heads) * d, ++seed);
    const auto kd = to_device(k), vd = to_device(v);
    const auto pd = to_device(std::vector<int32_t>{10 * t});
    dev.append(0, kd.data(), vd.data(), pd.data(), 1);
    for (float& f : k) f = host_val(f);
    for (float& f : v) f = host_val(f);
    for (int h = 0; h < heads; ++h) {
      cpu.append(0, h, &k[static_cast<size_t>(h) * d], &v[static_cast<size_t>(h) * d], 10 * t);
    }
    if (t < 3) {
      dev.append(1, 1, kd.data(), vd.data(), 7 + t);
      cpu.append(1, 1, k.data(), v.data(), 7 + t);
    }
  }
  same("after append");
  // Head 1 of layer 0 holds 8 of its 17; 10 more do not fit: refused, nothing changes.
  const auto big = to_device(random_vec(static_cast<size_t>(10) * heads * d, 1));
  const auto bigp = to_device(std::vector<int32_t>(10, 0));
  EXPECT_THROW(dev.append(0, big.data(), big.data(), bigp.data(), 10), Error);
  // Per-head keep lists of different sizes, one of them empty.
  const int ld = 8;
  const std::vector<std::vector<int32_t>> keep = {{1, 2, 5, 7}, {}, {0, 1, 2, 3, 4, 5, 6}};
  std::vector<int32_t> flat(heads * ld, 0), counts(heads);
  for (int h = 0; h < heads; ++h) {
    std::copy(keep[h].begin(), keep[h].end(), flat.begin() + h * ld);
    counts[h] = static_cast<int32_t>(keep[h].size());
  }
  auto flat_d = to_device(flat);
  dev.keep_slots(0, flat_d.data(), ld, counts.data());
  for (int h = 0; h < heads; ++h) cpu.keep_slots(0, h, keep[h]);
  same("after keep_slots");
  // The lengths went down with the rows: nothing was uploaded but the counts the unvalidated
  // form checks on the device (the appends above uploaded nothing either).
  EXPECT_EQ(dev.h2d_copies(), 1);
  // A bad list (not increasing) is refused on the device and leaves the cache as it was.
  std::vector<int32_t> bad = flat;
  bad[2 * ld + 1] = 0;
  auto bad_d = to_device(bad);
  EXPECT_THROW(dev.keep_slots(0, bad_d.data(), ld, counts.data()), Error);
  EXPECT_THROW(dev.keep_slots(1, 1, {2, 2}), Error);
  same("after refused keep_slots");
  dev.keep_slots(1, 1, {0, 2});
  cpu.keep_slots(1, 1, {0, 2});
  same("after one-head keep_slots");
  // Validated lists (the engine's plans): no upload at all.
  const int64_t up0 = dev.h2d_copies();
  const std::vector<int32_t> keep2_h = {0, 1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        0, 2, 3, 4, 5, 6, 0, 0};
  auto keep2 = to_device(keep2_h);
  const std::vector<int32_t> counts2 = {3, 0, 6};
  dev.keep_slots(0, keep2.data(), 8, counts2.data(), 0, /*validated=*/true);
  cpu.keep_slots(0, 0, {0, 1, 3});
  cpu.keep_slots(0, 2, {0, 2, 3, 4, 5, 6});
  same("after validated keep_slots");
  EXPECT_EQ(dev.h2d_copies(), up0);
  // One victim per head (EvictionPlan's kVictim): the first slot, none, the last; then a middle
  // one; a victim at or past a head's length is refused before anything changes.
  const int32_t bad_victims[] = {3, -1, 6};
  EXPECT_THROW(dev.evict_slots(0, bad_victims), Error);
  same("after refused evict_slots");
  const int32_t victims[] = {0, -1, 5};
  dev.evict_slots(0, victims);
  cpu.evict_slot(0, 0, 0);
  cpu.evict_slot(0, 2, 5);
  same("after evict_slots");
  const int32_t middle[] = {-1, -1, 2};
  dev.evict_slots(0, middle);
  cpu.evict_slot(0, 2, 2);
  same("after evict_slots of a middle slot");
  const int32_t none[] = {-1, -1, -1};
  dev.evict_slots(0, none);
  same("after evict_slots of nothing");
  EXPECT_EQ(dev.h2d_copies(), up0);
  // Appends after evictions land after the kept rows (the device lengths followed).
  {
    std::vector<float> k = random_vec(static_cast<size_t>(heads) * d, ++seed);
    std::vector<float> v = random_vec(static_cast<size_t>(heads) * d, ++seed);
    const auto kd = to_device(k), vd = to_device(v);
    const auto pd = to_device(std::vector<int32_t>{500});
    dev.append(0, kd.data(), vd.data(), pd.data(), 1);
    for (float& f : k) f = host_val(f);
    for (float& f : v) f = host_val(f);
    for (int h = 0; h < heads; ++h) {
      cpu.append(0, h, &k[static_cast<size_t>(h) * d], &v[static_cast<size_t>(h) * d], 500);
    }
    same("after append past evictions");
  }
  // Round trip: upload the CPU cache into a fresh device cache.
  cu::DeviceKvCache dev2(shape, dtype, 12);
  dev2.upload(cpu);
  kernels::KvCache back = dev2.download();
  EXPECT_EQ(back.total_slots(), cpu.total_slots());
  EXPECT_EQ(back.layer(0).key(0, 2)[5], cpu.layer(0).key(0, 2)[5]);
  dev.clear();
  cpu.clear();
  same("after clear");
}

// A layer with more heads than a kernel argument holds (cu::kMaxParamHeads): the lengths, counts
// and victims' lists go up as copies instead, with the same results; each copy is counted.
inline void run_kv_cache_many_heads_case() {
  const int heads = cu::kMaxParamHeads + 3, d = 8;
  const kernels::KvCacheShape shape{1, heads, d};
  cu::DeviceKvCache dev(shape, cu::KvDtype::kF32, 12);
  kernels::KvCache cpu(shape, 12);
  uint64_t seed = 77;
  for (int t = 0; t < 6; ++t) {
    const std::vector<float> k = random_vec(static_cast<size_t>(heads) * d, ++seed);
    const std::vector<float> v = random_vec(static_cast<size_t>(heads) * d, ++seed);
    const auto kd = to_device(k), vd = to_device(v);
    const auto pd = to_device(std::vector<int32_t>{3 * t});
    dev.append(0, kd.data(), vd.data(), pd.data(), 1);
    for (int h = 0; h < heads; ++h) {
      cpu.append(0, h, &k[static_cast<size_t>(h) * d], &v[static_cast<size_t>(h) * d], 3 * t);
    }
  }
  EXPECT_EQ(dev.h2d_copies(), 6);  // one lengths push per append
  std::vector<int32_t> victims(heads);
  for (int h = 0; h < heads; ++h) victims[h] = h % 7 == 6 ? -1 : h % 6;
  dev.evict_slots(0, victims.data());
  for (int h = 0; h < heads; ++h) {
    if (victims[h] >= 0) cpu.evict_slot(0, h, victims[h]);
  }
  EXPECT_EQ(dev.h2d_copies(), 6 + 3);  // the lists, the counts, the lengths
  const kernels::KvCache got = dev.download();
  for (int h = 0; h < heads; ++h) {
    ASSERT_EQ(got.length(0, h), cpu.length(0, h)) << "head " << h;
    for (int s = 0; s < cpu.length(0, h); ++s) {
      ASSERT_EQ(got.layer(0).position(h)[s], cpu.layer(0).position(h)[s])
          << "head " << h << " slot " << s;
      for (int x = 0; x < d; ++x) {
        ASSERT_EQ(got.layer(0).key(h, s)[x], cpu.layer(0).key(h, s)[x]) << h << "," << s;
        ASSERT_EQ(got.layer(0).value(h, s)[x], cpu.layer(0).value(h, s)[x]) << h << "," << s;
      }
    }
  }
}

}  // namespace kvb::parity
