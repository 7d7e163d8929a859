// Cases of the parity table (test_cuda_parity.cc) for the tensor-core prefill path
// (kernels/cuda/attention_prefill_mma.h, AttentionArgs::tensor_core_prefill): bf16 caches,
// ragged heads with earlier slots (the block on top of an existing cache), GQA groups 1/2/4/7/8,
// head_dim 32..256, statistics, sliding windows; head_dims it lacks and f32 caches fall back to
// the exact kernel. The same contract for one query (n == 1): the tensor-core decode kernel
// (attention_decode_mma.h, AttentionArgs::decode_kernel = kDecodeTensorCore), decode_mma_cases();
// its fallbacks (statistics asked, f32 caches, head_dims it lacks) run the default decode kernel.
//
// Reference: the CPU twin on the device cache's own bf16 values, fed the queries rounded to bf16
// (nearest even, as the kernel rounds them), so what remains is
//  - P rounded to bf16 before P x V: each weight is off by at most 2^-8 relative (bf16's unit
//    roundoff: 8 significant bits, so 1 + 2^-8 is a tie), so an output moves by at most
//    2^-8 max|v| (sum_j |bf16(p_j) - p_j| |v_j| / l <= 2^-8 max|v|);
//  - f32 scores summed in a different order (tensor cores vs the CPU's 16 lanes): |ds| <= E =
//    scale * d * 2^-22 * max|q| |k| (twice the 2 d u bound of two f32 dot products, u = 2^-24,
//    for accumulators that may truncate), which moves log p by at most 2E (s and the row's
//    log-sum-exp), i.e. p relatively by <= 2E(1 + 2E) <= 4E, and outputs by <= 4E max|v|.
// Statistics never see a rounded probability: relative 4E plus the exact kernel's 1e-4 for f32
// summation order. The fallback cases keep the exact kernel's tolerances (parity_attention.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_cache_device.h"
#include "tests/cuda/parity_util.h"

namespace kvb::parity {

struct PrefillMmaCase {
  int n;                    // query tokens (>= 2: the prefill path; 1: the decode path)
  std::vector<int> before;  // per KV head: slots cached before the block (ragged)
  int group;
  int head_dim;
  bool stats;  // col_sums + last_probs of the last min(n, 20) queries
  int window = 0;
  bool expect_mma = true;  // false: the exact f32 kernel must run (its tolerances, its bits)
  cu::KvDtype dtype = cu::KvDtype::kBf16;
  int decode_blocks = 0;  // n == 1: AttentionArgs::decode_blocks (0: as many as fit)
};

inline std::string describe(const PrefillMmaCase& c) {
  std::string s = std::string(c.n == 1 ? "decode " : "") + "mma n=" + std::to_string(c.n) +
                  " group=" + std::to_string(c.group) + " d=" + std::to_string(c.head_dim) + " " +
                  cu::kv_dtype_name(c.dtype) + " before={";
  for (int b : c.before) s += std::to_string(b) + ",";
  return s + "}" + (c.stats ? " stats" : "") +
         (c.window > 0 ? " window=" + std::to_string(c.window) : "") +
         (c.decode_blocks > 0 ? " blocks=" + std::to_string(c.decode_blocks) : "") +
         (c.expect_mma ? "" : " (exact kernel)");
}

inline double max_row_norm(const std::vector<float>& rows, int d) {
  double best = 0;
  for (size_t r = 0; r * d < rows.size(); ++r) {
    double s = 0;
    for (int x = 0; x < d; ++x) s += double{rows[r * d + x]} * rows[r * d + x];
    best = std::max(best, std::sqrt(s));
  }
  return best;
}

inline void run_prefill_mma_case(const PrefillMmaCase& c) {
  const std::string what = describe(c);
  const int kvh = static_cast<int>(c.before.size()), nh = kvh * c.group, d = c.head_dim;
  std::vector<int32_t> caps(kvh);
  int max_len = 0;
  for (int h = 0; h < kvh; ++h) {
    caps[h] = c.before[h] + c.n + 5;
    max_len = std::max(max_len, c.before[h] + c.n);
  }
  cu::DeviceKvCache dev({1, kvh, d}, c.dtype, caps);
  uint64_t seed = 7000 + static_cast<uint64_t>(c.n) * 31 + d;
  for (int h = 0; h < kvh; ++h) {
    for (int s = 0; s < c.before[h]; ++s) {
      const auto k = to_device(random_vec(d, ++seed, -2, 2)), v = to_device(random_vec(d, ++seed));
      dev.append(0, h, k.data(), v.data(), s);
    }
  }
  const auto kb = to_device(random_vec(static_cast<size_t>(c.n) * kvh * d, ++seed, -2, 2));
  const auto vb = to_device(random_vec(static_cast<size_t>(c.n) * kvh * d, ++seed));
  std::vector<int32_t> pos(c.n);
  for (int i = 0; i < c.n; ++i) pos[i] = 9000 + i;
  const auto posd = to_device(pos);
  dev.append(0, kb.data(), vb.data(), posd.data(), c.n);
  kernels::KvCache cpu = dev.download();  // the exact values the device holds

  const std::vector<float> q = random_vec(static_cast<size_t>(c.n) * nh * d, ++seed, -2, 2);
  std::vector<float> q_ref = q;
  if (c.expect_mma) {
    for (float& f : q_ref) f = bf16_round(f);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int stride = max_len + 3, last_w = std::min(c.n, 20);
  const size_t stats_n = static_cast<size_t>(nh) * stride;
  std::vector<float> out(q.size()), cs(stats_n), lp(stats_n * last_w);
  kernels::cpu::AttentionArgs ca{out.data(), q_ref.data(), cpu.layer(0), c.n, nh, scale};
  ca.window = c.window;
  if (c.stats) {
    ca.col_sums = cs.data();
    ca.last_probs = lp.data();
    ca.last_w = last_w;
    ca.stats_stride = stride;
  }
  kernels::cpu::attention(ca);

  // The bound E on score differences (see the top of this file), from the data.
  double kmax = 0, vmax = 0;
  for (int h = 0; h < kvh; ++h) {
    const kernels::LayerKvView view = cpu.layer(0);
    for (int s = 0; s < cpu.length(0, h); ++s) {
      double k2 = 0;
      for (int x = 0; x < d; ++x) {
        k2 += double{view.key(h, s)[x]} * view.key(h, s)[x];
        vmax = std::max(vmax, std::fabs(double{view.value(h, s)[x]}));
      }
      kmax = std::max(kmax, std::sqrt(k2));
    }
  }
  const double e = scale * d * std::ldexp(1.0, -22) * max_row_norm(q_ref, d) * kmax;

  const auto qd = to_device(q);
  cu::DeviceBuffer<float> outd(q.size()), csd(stats_n), lpd(stats_n * last_w);
  cu::AttentionArgs ga;
  ga.out = outd.data();
  ga.q = qd.data();
  ga.kv = dev.layer(0);
  ga.n = c.n;
  ga.num_heads = nh;
  ga.scale = scale;
  ga.window = c.window;
  ga.tensor_core_prefill = true;
  if (c.n == 1) {
    ga.decode_kernel = cu::kDecodeTensorCore;
    ga.decode_blocks = c.decode_blocks;
  }
  if (c.stats) {
    ga.col_sums = csd.data();
    ga.last_probs = lpd.data();
    ga.last_w = last_w;
    ga.stats_stride = stride;
  }
  auto run = [&] {
    // Garbage in the outputs: every element must be written (stats rows past a head: zeroed).
    KVB_CUDA_CHECK(cudaMemset(outd.data(), 0x7f, outd.bytes()));
    KVB_CUDA_CHECK(cudaMemset(csd.data(), 0x7f, csd.bytes()));
    KVB_CUDA_CHECK(cudaMemset(lpd.data(), 0x7f, lpd.bytes()));
    cu::attention(ga);
  };
  run();
  const std::vector<float> got = to_host(outd), got_cs = to_host(csd), got_lp = to_host(lpd);
  if (c.expect_mma) {
    expect_close(got, out, vmax * (std::ldexp(1.0, -8) + 4 * e) + 1e-5, 0, what + " out");
    if (c.stats) {
      expect_close(got_cs, cs, 1e-5, 1e-4 + 4 * e, what + " col_sums");
      expect_close(got_lp, lp, 1e-6, 1e-4 + 4 * e, what + " last_probs");
    }
  } else {
    expect_close(got, out, 2e-5, 1e-4, what + " out");
    if (c.stats) {
      expect_close(got_cs, cs, 1e-5, 1e-4, what + " col_sums");
      expect_close(got_lp, lp, 1e-6, 1e-4, what + " last_probs");
    }
  }
  // Deterministic: a second run gives the same bits (column sums in a fixed order).
  run();
  expect_bits(to_host(outd), got, what + " out, second run");
  expect_bits(to_host(csd), got_cs, what + " col_sums, second run");
  expect_bits(to_host(lpd), got_lp, what + " last_probs, second run");
  // The path taken: the exact kernel (flag off; for one query the default decode kernel) gives
  // the same bits iff the flag fell back; the tensor-core path rounds the queries, so some output
  // differs.
  if (c.n == 1) {
    ga.decode_kernel = cu::kDecodeDefault;
  } else {
    ga.tensor_core_prefill = false;
  }
  run();
  const std::vector<float> exact = to_host(outd);
  size_t differ = 0;
  for (size_t i = 0; i < exact.size(); ++i) differ += exact[i] != got[i];
  if (c.expect_mma) {
    EXPECT_GT(differ, 0u) << what
                          << ": identical to the exact kernel: the tensor cores did not run";
  } else {
    EXPECT_EQ(differ, 0u) << what << ": differs from the exact kernel it should fall back to";
  }
}

inline std::vector<PrefillMmaCase> prefill_mma_cases() {
  std::vector<PrefillMmaCase> v;
  // Smallest block, group 1, one head with an earlier cache and one without.
  v.push_back({2, {0, 5}, 1, 64, true});
  // Llama-3's group of 4 at head_dim 128, ragged heads up to 300 earlier slots: rows of one
  // 16-query tile end mid key tile, and tiles lie wholly before the block.
  v.push_back({17, {33, 0, 300}, 4, 128, true});
  // 300 queries (19 query tiles, the last partial), group 8 (two blocks per query tile).
  v.push_back({300, {0, 100}, 8, 128, true});
  // A short block on top of a long cache, no statistics.
  v.push_back({64, {1000}, 4, 64, false});
  // head_dim 96 (Phi-3), four ragged heads, group 1 (a block spans 4 query tiles).
  v.push_back({129, {7, 70, 0, 200}, 1, 96, true});
  // head_dim 256 (Gemma 3; 32-key tiles), group 7: a block's warps straddle query tiles.
  v.push_back({45, {3, 40}, 7, 256, true});
  // Sliding windows: queries inside, at and past the window's reach; tiles skipped before it.
  v.push_back({100, {50, 0}, 4, 64, false, 33});
  v.push_back({20, {10, 200}, 2, 128, false, 8});
  // head_dim 32, one KV head, a 300-token prompt; and a 1024-token prompt at 128 with stats.
  v.push_back({300, {0}, 4, 32, false});
  v.push_back({1024, {0}, 1, 128, true});
  // Fallbacks to the exact kernel: a head_dim the kernel lacks (40), and an f32 cache.
  v.push_back({7, {17, 0, 1}, 7, 40, true, 0, false});
  v.push_back({17, {5, 30}, 4, 64, true, 0, false, cu::KvDtype::kF32});
  return v;
}

// One query over ragged heads (lengths before + 1): Llama-3's group of 4 at head_dim 128 with
// heads of 1, 3, 67 and 1201 slots (tiles that end part-way, chunks of short heads empty); 1024
// blocks asked over a 16K head (a chunk of a few tiles, warps without tiles); group 1, 2, 3, 7, 8
// (query rows gid only) and 16 (rows gid + 8 too); head_dim 32, 64, 96, 256 (16-key tiles); a
// window that starts mid-tile; one block (every warp cycles its stages many times); heads of
// 20K-32K slots; group 12 (rows gid + 8 written for some lanes only). Fallbacks to the default decode kernel, bit for bit: statistics asked, an f32
// cache, head_dim 40.
inline std::vector<PrefillMmaCase> decode_mma_cases() {
  std::vector<PrefillMmaCase> v;
  v.push_back({1, {0, 2, 66, 1200}, 4, 128, false});
  v.push_back({1, {16383, 2, 66, 1000}, 4, 128, false, 0, true, cu::KvDtype::kBf16, 1024});
  v.push_back({1, {300, 0}, 1, 64, false});
  v.push_back({1, {31, 32, 33}, 2, 64, false});
  v.push_back({1, {66, 0, 1000}, 3, 96, false});
  v.push_back({1, {1000, 66, 2, 0}, 8, 256, false});
  v.push_back({1, {500, 7}, 16, 32, false});
  v.push_back({1, {200, 40}, 12, 64, false});
  v.push_back({1, {300, 12}, 7, 64, false, 33});
  v.push_back({1, {4000, 12}, 4, 128, false, 0, true, cu::KvDtype::kBf16, 1});
  v.push_back({1, {32767, 20000}, 2, 128, false});
  v.push_back({1, {0, 2, 66, 1200}, 4, 128, true, 0, false});
  v.push_back({1, {0, 2, 66, 1200}, 4, 128, false, 0, false, cu::KvDtype::kF32});
  v.push_back({1, {70, 3}, 3, 40, false, 0, false});
  return v;
}

}  // namespace kvb::parity
