// cuda::attention_batch (kernels/cuda/attention.h; issue 16 items 1 and 3): decode steps of
// several sequences over their own caches in a few launches. Law: every sequence's output and
// statistics are the bits cuda::attention gives it alone (the same partial kernel and split-K
// plan per sequence, blockIdx.z picking it), whatever its length, statistics or kernel; and the
// launches are counted: one partial pass per 16 sequences on the streamed or tensor-core kernel,
// one combine and one probabilities pass per 16. The host checks run without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/runtime.h"
#include "tests/cuda/parity_util.h"

namespace kvb {
namespace {

namespace cu = kernels::cuda;
using parity::expect_bits;
using parity::random_vec;
using parity::to_device;
using parity::to_host;

// One sequence: its cache (one layer, ragged heads), query, output and statistics rows.
struct Seq {
  std::unique_ptr<cu::DeviceKvCache> cache;
  cu::DeviceBuffer<float> q, out, col_sums, last_probs;
  int stride = 0;
};

struct BatchCase {
  std::string name;
  cu::KvDtype dtype;
  int kv_heads, group, head_dim;
  std::vector<std::vector<int>> lengths;  // per sequence, per KV head (>= 1)
  std::vector<int> stats;                 // per sequence: 0 none, 1 col_sums, 2 last_probs, 3 both
  int decode_kernel = cu::kDecodeDefault;
  int window = 0;
  int want_launches = 0;  // the launches attention_batch makes
};

Seq make_seq(const BatchCase& c, const std::vector<int>& lens, int stats, uint64_t seed) {
  Seq s;
  const int d = c.head_dim, nh = c.kv_heads * c.group;
  std::vector<int32_t> caps(c.kv_heads);
  for (int h = 0; h < c.kv_heads; ++h) caps[h] = lens[h] + 3;
  s.cache =
      std::make_unique<cu::DeviceKvCache>(kernels::KvCacheShape{1, c.kv_heads, d}, c.dtype, caps);
  for (int h = 0; h < c.kv_heads; ++h) {
    const auto k = to_device(random_vec(static_cast<size_t>(lens[h]) * d, ++seed, -2, 2));
    const auto v = to_device(random_vec(static_cast<size_t>(lens[h]) * d, ++seed));
    for (int t = 0; t < lens[h]; ++t) {
      s.cache->append(0, h, k.data() + static_cast<size_t>(t) * d,
                      v.data() + static_cast<size_t>(t) * d, t);
    }
  }
  int longest = 0;
  for (int len : lens) longest = std::max(longest, len);
  s.stride = longest + 5;
  s.q = to_device(random_vec(static_cast<size_t>(nh) * d, ++seed, -2, 2));
  s.out = cu::DeviceBuffer<float>(static_cast<size_t>(nh) * d);
  if (stats & 1) s.col_sums = cu::DeviceBuffer<float>(static_cast<size_t>(nh) * s.stride);
  if (stats & 2) s.last_probs = cu::DeviceBuffer<float>(static_cast<size_t>(nh) * s.stride);
  return s;
}

cu::AttentionArgs args_of(const BatchCase& c, Seq& s) {
  cu::AttentionArgs a;
  a.out = s.out.data();
  a.q = s.q.data();
  a.kv = s.cache->layer(0);
  a.n = 1;
  a.num_heads = c.kv_heads * c.group;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  a.col_sums = s.col_sums.data();
  a.last_probs = s.last_probs.data();
  a.last_w = a.last_probs != nullptr ? 1 : 0;
  a.stats_stride = s.stride;
  a.window = c.window;
  a.decode_kernel = c.decode_kernel;
  return a;
}

// Garbage in every output (each element must be written), then what the device holds. The
// alone and batched runs poison with different bytes, so an element neither writes differs.
void poison(Seq& s, int byte) {
  for (cu::DeviceBuffer<float>* b : {&s.out, &s.col_sums, &s.last_probs}) {
    if (b->data() != nullptr) KVB_CUDA_CHECK(cudaMemset(b->data(), byte, b->bytes()));
  }
}
std::vector<std::vector<float>> results(Seq& s) {
  std::vector<std::vector<float>> r = {to_host(s.out)};
  if (s.col_sums.data() != nullptr) r.push_back(to_host(s.col_sums));
  if (s.last_probs.data() != nullptr) r.push_back(to_host(s.last_probs));
  return r;
}

void run_case(const BatchCase& c) {
  SCOPED_TRACE(c.name);
  const int count = static_cast<int>(c.lengths.size());
  std::vector<Seq> seqs;
  for (int b = 0; b < count; ++b) {
    seqs.push_back(make_seq(c, c.lengths[b], c.stats[b], 1000 * (b + 1)));
  }
  std::vector<std::vector<std::vector<float>>> alone(count);
  for (int b = 0; b < count; ++b) {
    poison(seqs[b], 0x7f);
    cu::attention(args_of(c, seqs[b]));
    alone[b] = results(seqs[b]);
    // A law, so that the comparison below cannot pass on two equally broken runs: every output
    // is a convex combination of values in [-1, 1] and every statistic a probability (or 0 past
    // a head's length), so all lie in [-1, 1] (5% for bf16-rounded probabilities); the poison
    // (3.4e38) and NaN or infinity do not.
    for (size_t i = 0; i < alone[b].size(); ++i) {
      size_t outside = 0;
      for (float x : alone[b][i]) outside += !(std::fabs(x) <= 1.05f);
      EXPECT_EQ(outside, 0u) << "sequence " << b << (i == 0 ? " out" : " statistics")
                             << ": elements outside [-1.05, 1.05] (unwritten, NaN or inf)";
    }
  }
  std::vector<cu::AttentionArgs> batch;
  for (int b = 0; b < count; ++b) {
    poison(seqs[b], 0x3f);
    batch.push_back(args_of(c, seqs[b]));
  }
  const int launches = cu::attention_batch(batch);
  EXPECT_EQ(launches, c.want_launches);
  for (int b = 0; b < count; ++b) {
    const std::vector<std::vector<float>> got = results(seqs[b]);
    ASSERT_EQ(got.size(), alone[b].size());
    for (size_t i = 0; i < got.size(); ++i) {
      expect_bits(got[i], alone[b][i],
                  "sequence " + std::to_string(b) + (i == 0 ? " out" : " statistics"));
    }
  }
}

std::vector<BatchCase> cases() {
  using K = cu::KvDtype;
  std::vector<BatchCase> v;
  // Llama-3's group at head_dim 128, bf16, the default (streamed) kernel: three sequences of
  // very different lengths (so different splits), statistics on two of them in different rows:
  // one partial, one combine, one probabilities launch.
  v.push_back({"streamed_bf16_mixed_stats",
               K::kBf16,
               4,
               4,
               128,
               {{1, 3, 67, 1200}, {5000, 20, 7, 300}, {64, 64, 64, 64}},
               {0, 1, 3}});
  v.back().want_launches = 3;
  // 20 sequences on f32 (more than one launch's 16): 2 partial, 2 combine, and one
  // probabilities launch for the 13 that ask for statistics.
  {
    BatchCase c{"streamed_f32_twenty", K::kF32, 2, 2, 64, {}, {}};
    for (int b = 0; b < 20; ++b) {
      c.lengths.push_back({1 + 37 * b, 300 - 11 * b});
      c.stats.push_back(b % 3 == 0 ? 2 : b % 3 == 1 ? 0 : 1);
    }
    c.want_launches = 5;
    v.push_back(c);
  }
  // No statistics anywhere: no probabilities launch.
  v.push_back({"streamed_bf16_no_stats",
               K::kBf16,
               8,
               4,
               128,
               {{100, 200, 300, 400, 500, 600, 700, 800}, {4096, 1, 1, 1, 1, 1, 1, 4096}},
               {0, 0}});
  v.back().want_launches = 2;
  // A sliding window (no statistics with one): windows that start mid-tile.
  v.push_back({"streamed_bf16_window", K::kBf16, 2, 4, 64, {{300, 12}, {33, 900}}, {0, 0}});
  v.back().window = 33;
  v.back().want_launches = 2;
  // The tensor-core kernel (bf16, no statistics): one partial launch for the three sequences,
  // then the combine.
  v.push_back({"tensor_bf16",
               K::kBf16,
               4,
               4,
               128,
               {{1, 3, 67, 1200}, {5000, 20, 7, 300}, {64, 64, 64, 64}},
               {0, 0, 0}});
  v.back().decode_kernel = cu::kDecodeTensorCore;
  v.back().want_launches = 2;
  // The same three and a fourth sequence with statistics, which runs the streamed kernel in a
  // launch of its own (put first: the launches take their shape from sequence 0, never its
  // statistics).
  v.push_back({"tensor_bf16_one_with_stats",
               K::kBf16,
               4,
               4,
               128,
               {{9, 900, 90, 9}, {1, 3, 67, 1200}, {5000, 20, 7, 300}, {64, 64, 64, 64}},
               {3, 0, 0, 0}});
  v.back().decode_kernel = cu::kDecodeTensorCore;
  v.back().want_launches = 4;
  // The grouped kernel (asked for) and head_dim 40 (the streamed kernel refuses it; the grouped
  // path runs it on its per-query-head kernel): a partial launch per sequence, then the shared
  // combine and probabilities.
  v.push_back(
      {"grouped_bf16", K::kBf16, 4, 4, 128, {{1, 3, 67, 1200}, {5000, 20, 7, 300}}, {1, 0}});
  v.back().decode_kernel = cu::kDecodeGrouped;
  v.back().want_launches = 4;
  v.push_back({"fallback_bf16_d40", K::kBf16, 2, 3, 40, {{70, 3}, {5, 500}, {1, 1}}, {2, 0, 1}});
  v.back().want_launches = 5;
  return v;
}

TEST(CudaAttentionBatch, EverySequenceGetsItsAloneBits) {
  if (!cu::has_device()) GTEST_SKIP() << "no CUDA device visible";
  for (const BatchCase& c : cases()) run_case(c);
}

// The host checks, before any CUDA call: no sequences, a prefill block, a sequence of another
// shape (heads, head_dim, dtype, window, scale), and attention()'s own checks per sequence.
TEST(CudaAttentionBatch, RejectsBadBatchesOnTheHost) {
  alignas(16) static float rows[64];
  static const int32_t lengths[2] = {3, 4};
  auto base = [&] {
    cu::AttentionArgs a;
    a.out = rows;
    a.q = rows;
    a.kv.num_kv_heads = 2;
    a.kv.head_dim = 8;
    a.kv.dtype = cu::KvDtype::kBf16;
    a.kv.keys = rows;
    a.kv.values = rows;
    a.kv.host_lengths = lengths;
    a.kv.lengths = lengths;  // never read: every case fails before the device
    a.kv.offsets = lengths;
    a.n = 1;
    a.num_heads = 4;
    a.scale = 0.5f;
    return a;
  };
  auto error_of = [](const std::vector<cu::AttentionArgs>& v) {
    try {
      cu::attention_batch(v);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of({}).find("no sequences"), std::string::npos);
  cu::AttentionArgs prefill = base();
  prefill.n = 2;
  EXPECT_NE(error_of({base(), prefill}).find("sequence 1 has n = 2"), std::string::npos);
  const std::string shape = "differs from sequence 0's shape";
  cu::AttentionArgs other = base();
  other.num_heads = 8;
  EXPECT_NE(error_of({base(), other}).find(shape), std::string::npos);
  other = base();
  other.kv.head_dim = 16;
  EXPECT_NE(error_of({base(), other}).find(shape), std::string::npos);
  other = base();
  other.kv.dtype = cu::KvDtype::kF32;
  EXPECT_NE(error_of({base(), other}).find(shape), std::string::npos);
  other = base();
  other.window = 2;
  EXPECT_NE(error_of({base(), other}).find(shape), std::string::npos);
  other = base();
  other.scale = 0.25f;
  EXPECT_NE(error_of({base(), other}).find(shape), std::string::npos);
  other = base();
  other.decode_kernel = 7;
  EXPECT_NE(error_of({base(), other}).find("decode_kernel 7"), std::string::npos);
  other = base();
  other.q = nullptr;
  EXPECT_NE(error_of({base(), other}).find("null pointer"), std::string::npos);
}

}  // namespace
}  // namespace kvb
