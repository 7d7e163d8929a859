// The CPU-vs-CUDA parity suite (STYLE.md "Tests"; ggml's test-backend-ops): ONE table of cases
// over every op of kernels/cuda, each running the CPU reference (kernels/cpu, or the policy code
// for score accumulation) and the CUDA twin on the same seeded inputs and comparing with the
// op's contract: bitwise where the twin promises the CPU's bits (dequant, pool, score
// accumulation, k-center, the selection orders), tolerances for f32 arithmetic whose order
// differs (GEMM, attention, norms), tie-aware keep sets for top-k. Awkward sizes throughout:
// lengths 1, 3, 7, 17, 4097; GQA groups 1, 2, 4, 7; budgets above the length; empty inputs.
// Every case skips (GTEST_SKIP) when no CUDA device is present.
#include <gtest/gtest.h>

#include <cfloat>
#include <cstring>
#include <functional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/budget.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/select.h"
#include "kernels/cpu/subgen_estimator.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/budget.h"
#include "kernels/cuda/dequant.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/pool.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/scores.h"
#include "kernels/cuda/select.h"
#include "kernels/cuda/subgen_estimator.h"
#include "kernels/cuda/swiglu.h"
#include "kernels/policies/policy.h"
#include "tests/cuda/parity_attention.h"
#include "tests/cuda/parity_kcenter.h"
#include "tests/cuda/parity_prefill_mma.h"
#include "tests/dequant_fixture.h"
#include "tests/cuda/parity_util.h"

namespace kvb::parity {
namespace {

namespace cpu = kvb::kernels::cpu;

struct Case {
  std::string name;
  std::function<void()> run;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }  // gtest's parameter display

// ---- dequantization: bitwise ----------------------------------------------------------------

// Random block bytes with every f16 scale field made a finite f16 (random bytes there would give
// inf/NaN scales, which test nothing about the decoding).
void run_dequant(uint32_t type, size_t blocks) {
  size_t bb = 0, be = 0;
  ASSERT_TRUE(cpu::ggml_block_info(type, &bb, &be));
  std::vector<uint8_t> src(blocks * bb);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(uniform(type, i, 0, 256));
  if (type == 1 || type == 30) {  // F16 / BF16 "blocks" are single elements
    for (size_t o = 0; o < src.size(); o += 2) src[o + 1] &= type == 1 ? 0x3b : 0x7e;
  } else {
    testing::make_scales_finite(type, src.data(), src.size(), bb);
  }
  const size_t n = blocks * be;
  std::vector<float> want(n);
  cpu::dequantize(type, src.data(), want.data(), n);
  const auto srcd = to_device(src);
  cu::DeviceBuffer<float> got(n);
  cu::dequantize(type, srcd.data(), got.data(), n);
  expect_bits(to_host(got), want, std::string("dequantize ") + cpu::ggml_type_name(type));
}

// ---- GEMM: the matmul unit test's bound 4 (k+1) eps sum|x w| against the double reference -----

void run_matmul(int n, int k, int m, bool bias, bool bf16) {
  std::vector<float> x = random_vec(static_cast<size_t>(n) * k, 11),
                     w = random_vec(static_cast<size_t>(m) * k, 12);
  const std::vector<float> b = random_vec(m, 13);
  std::vector<uint16_t> xb(x.size()), wb(w.size());
  if (bf16) {  // the reference multiplies the same rounded inputs
    for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_round(x[i]), xb[i] = bf16_bits(x[i]);
    for (size_t i = 0; i < w.size(); ++i) w[i] = bf16_round(w[i]), wb[i] = bf16_bits(w[i]);
  }
  std::vector<float> want(static_cast<size_t>(n) * m);
  cpu::matmul_reference(want.data(), x.data(), w.data(), bias ? b.data() : nullptr, n, k, m);
  cu::DeviceBuffer<float> y(want.size());
  const auto bd = to_device(b);
  if (bf16) {
    const auto xd = to_device(xb), wd = to_device(wb);
    cu::matmul(y.data(), reinterpret_cast<const __nv_bfloat16*>(xd.data()),
               reinterpret_cast<const __nv_bfloat16*>(wd.data()), bias ? bd.data() : nullptr, n, k,
               m);
  } else {
    const auto xd = to_device(x), wd = to_device(w);
    cu::matmul(y.data(), xd.data(), wd.data(), bias ? bd.data() : nullptr, n, k, m);
  }
  const std::vector<float> got = to_host(y);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < m; ++j) {
      double abs_sum = bias ? std::fabs(b[j]) : 0.0;
      for (int p = 0; p < k; ++p) {
        abs_sum += std::fabs(double{x[static_cast<size_t>(i) * k + p]} *
                             w[static_cast<size_t>(j) * k + p]);
      }
      const size_t at = static_cast<size_t>(i) * m + j;
      ASSERT_LE(std::fabs(double{got[at]} - want[at]),
                4.0 * (k + 1) * FLT_EPSILON * abs_sum + 1e-30)
          << "matmul " << n << "x" << k << "x" << m << " at (" << i << ", " << j << ")";
    }
  }
}

// f32 -> bf16, round to nearest even: bitwise against the host rounding (ties included).
void run_to_bf16(size_t n) {
  std::vector<float> x = random_vec(n, 15, -100, 100);
  for (size_t i = 0; i < n; i += 5) {  // exact halfway cases: low 16 bits 0x8000
    uint32_t b;
    std::memcpy(&b, &x[i], sizeof b);
    b = (b & 0xffff0000u) | 0x8000u;
    std::memcpy(&x[i], &b, sizeof b);
  }
  const auto xd = to_device(x);
  cu::DeviceBuffer<uint16_t> yd(n);
  cu::f32_to_bf16(reinterpret_cast<__nv_bfloat16*>(yd.data()), xd.data(), n);
  const std::vector<uint16_t> got = to_host(yd);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], bf16_bits(x[i])) << "element " << i;
}

// ---- elementwise -------------------------------------------------------------------------------

void run_rmsnorm(int n, int dim) {
  const std::vector<float> x = random_vec(static_cast<size_t>(n) * dim, 21, -3, 3);
  const std::vector<float> w = random_vec(dim, 22);
  std::vector<float> want(x.size());
  cpu::rmsnorm(want.data(), x.data(), w.data(), n, dim, 1e-5f);
  auto xd = to_device(x);
  const auto wd = to_device(w);
  cu::rmsnorm(xd.data(), xd.data(), wd.data(), n, dim, 1e-5f);  // in place, as the engine does
  // Double sums in a different order can move the f32 scale by at most one rounding.
  expect_close(to_host(xd), want, 0, 4 * FLT_EPSILON, "rmsnorm");
}

void run_rope(cpu::RopeStyle style, int rot_dim, bool factors, float linear,
              float attn_factor = 1.0f) {
  const int n = 7, heads = 3, d = 64;
  cpu::RopeParams p;
  p.style = style;
  p.rot_dim = rot_dim;
  p.theta = 500000.0f;
  p.linear_scale = linear;
  p.attn_factor = attn_factor;
  if (factors) {
    for (int i = 0; i < rot_dim / 2; ++i) p.freq_factors.push_back(1.0f + 0.5f * (i % 3));
  }
  const std::vector<int32_t> pos = {0, 1, 3, 7, 17, 4096, 4097};
  std::vector<float> want = random_vec(static_cast<size_t>(n) * heads * d, 31);
  auto xd = to_device(want);
  const auto pd = to_device(pos);
  auto td = to_device(want);
  cpu::rope(want.data(), pos.data(), n, heads, d, p);
  cu::rope(xd.data(), pd.data(), n, heads, d, p);
  // cos/sin of the same f32 angle, rounded from double on both sides: at most an ulp apart.
  const std::vector<float> got = to_host(xd);
  expect_close(got, want, 4e-7, 4 * FLT_EPSILON, "rope");
  // The frequencies uploaded once (the engine's tables): the same bits as per call.
  const cu::RopeTable table(p, d);
  cu::rope(td.data(), pd.data(), n, heads, table);
  expect_bits(to_host(td), got, "rope with a table");
}

void run_swiglu(size_t n) {
  std::vector<float> g = random_vec(n, 41, -8, 8);
  const std::vector<float> u = random_vec(n, 42, -2, 2);
  auto gd = to_device(g);
  const auto ud = to_device(u);
  cpu::swiglu(g.data(), u.data(), n);
  cu::swiglu(gd.data(), ud.data(), n);
  // CUDA's expf is within 2 ulp, glibc's within 1: a few ulp apart after the division.
  expect_close(to_host(gd), g, 1e-30, 8 * FLT_EPSILON, "swiglu");
}

void run_geglu_tanh(size_t n) {
  std::vector<float> g = random_vec(n, 43, -8, 8);
  const std::vector<float> u = random_vec(n, 44, -2, 2);
  auto gd = to_device(g);
  const auto ud = to_device(u);
  cpu::geglu_tanh(g.data(), u.data(), n);
  cu::geglu_tanh(gd.data(), ud.data(), n);
  // tanhf within 2 ulp on both sides; near the zero of 1 + tanh (x << 0) the absolute floor.
  expect_close(to_host(gd), g, 1e-6, 8 * FLT_EPSILON, "geglu_tanh");
}

void run_pool(int rows, int n, int kernel, cpu::PoolKind kind) {
  std::vector<float> in = tied_vec(static_cast<size_t>(rows) * n, 51, 9);
  if (in.size() > 5) in[5] = NAN;  // max propagates it; avg turns its windows NaN on both sides
  std::vector<float> want(in.size());
  cpu::pool1d(in.data(), want.data(), rows, n, kernel, kind);
  const auto ind = to_device(in);
  cu::DeviceBuffer<float> out(in.size());
  cu::pool1d(ind.data(), out.data(), rows, n, kernel, kind);
  expect_bits(to_host(out), want, "pool1d");
}

// ---- selection ---------------------------------------------------------------------------------

std::vector<float> selection_scores(int n, uint64_t seed) {
  std::vector<float> s = tied_vec(n, seed, 5);  // heavy ties
  for (int i = 0; i < n; i += 11) s[i] = (i / 11) % 2 ? -0.0f : 0.0f;
  if (n > 3) s[3] = NAN;
  if (n > 9) s[9] = INFINITY;
  return s;
}

void run_topk(int n, int k) {
  const std::vector<float> s = selection_scores(n, 61);
  std::vector<uint8_t> mask(n);
  for (int i = 0; i < n; ++i) mask[i] = (i % 3) != 1;
  const auto sd = to_device(s);
  const auto md = to_device(mask);
  cu::DeviceBuffer<int32_t> outd(std::max(n, 1));
  std::vector<int32_t> want(std::max(n, 1));
  auto check = [&](int got_count, int want_count, const std::string& what) {
    std::vector<int32_t> got = to_host(outd.data(), got_count);
    want.resize(want_count);
    expect_keep_sets_match(got, want, s.data(), what);
    want.resize(std::max(n, 1));
  };
  check(cu::select_topk(sd.data(), n, k, outd.data()),
        cpu::select_topk(s.data(), n, k, want.data()), "select_topk");
  const int b = n / 3, e = n - n / 4;
  check(cu::select_topk_range(sd.data(), b, e, k, outd.data()),
        cpu::select_topk_range(s.data(), b, e, k, want.data()), "select_topk_range");
  check(cu::select_topk_masked(sd.data(), md.data(), n, k, outd.data()),
        cpu::select_topk_masked(s.data(), mask.data(), n, k, want.data()), "select_topk_masked");
  EXPECT_EQ(cu::select_argmin(sd.data(), nullptr, n), cpu::select_argmin(s.data(), nullptr, n));
  EXPECT_EQ(cu::select_argmin(sd.data(), md.data(), n),
            cpu::select_argmin(s.data(), mask.data(), n));
}

// The tie rule itself (tie-aware comparison cannot see it): all scores equal, so the k kept must
// be the k most recent, and argmin must name index 0 (the oldest goes).
void run_tie_rule(int n, int k) {
  const std::vector<float> s(n, 0.5f);
  const auto sd = to_device(s);
  cu::DeviceBuffer<int32_t> outd(n);
  const int got = cu::select_topk(sd.data(), n, k, outd.data());
  std::vector<int32_t> want;
  for (int i = std::max(0, n - k); i < n; ++i) want.push_back(i);
  EXPECT_EQ(to_host(outd.data(), got), want);
  EXPECT_EQ(cu::select_argmin(sd.data(), nullptr, n), 0);
}

void run_topk_rows(const std::vector<int32_t>& lengths, const std::vector<int32_t>& ks) {
  const int rows = static_cast<int>(lengths.size());
  const int ld = *std::max_element(lengths.begin(), lengths.end()) + 2;
  const std::vector<float> s = selection_scores(rows * ld, 71);
  std::vector<int32_t> want(rows * ld), wc(rows);
  cpu::select_topk_rows(s.data(), rows, ld, lengths.data(), ks.data(), want.data(), wc.data());
  const auto sd = to_device(s);
  const auto ld_d = to_device(lengths), kd = to_device(ks);
  cu::DeviceBuffer<int32_t> out(rows * ld), counts(rows), amin(rows);
  cu::select_topk_rows(sd.data(), rows, ld, ld_d.data(), kd.data(), out.data(), counts.data());
  const std::vector<int32_t> got = to_host(out), gc = to_host(counts);
  for (int r = 0; r < rows; ++r) {
    ASSERT_EQ(gc[r], wc[r]) << "row " << r;
    expect_keep_sets_match({got.begin() + r * ld, got.begin() + r * ld + gc[r]},
                           {want.begin() + r * ld, want.begin() + r * ld + wc[r]},
                           s.data() + static_cast<size_t>(r) * ld, "row " + std::to_string(r));
  }
  cu::select_argmin_rows(sd.data(), rows, ld, ld_d.data(), amin.data());
  const std::vector<int32_t> ga = to_host(amin);
  for (int r = 0; r < rows; ++r) {
    EXPECT_EQ(ga[r],
              cpu::select_argmin(s.data() + static_cast<size_t>(r) * ld, nullptr, lengths[r]))
        << "argmin row " << r;
  }
  // A length past ld is refused on the device.
  std::vector<int32_t> bad = lengths;
  bad[0] = ld + 1;
  const auto badd = to_device(bad);
  EXPECT_THROW(
      cu::select_topk_rows(sd.data(), rows, ld, badd.data(), kd.data(), out.data(), counts.data()),
      Error);
}

// `scores`: [heads, ld] with ld = longest + 1, or empty for selection_scores.
void run_global_topk(const std::vector<int32_t>& lengths, bool positions, int k,
                     std::vector<float> scores = {}, std::vector<int32_t> expect = {}) {
  const int heads = static_cast<int>(lengths.size());
  const int ld = *std::max_element(lengths.begin(), lengths.end()) + 1;
  const std::vector<float> s = scores.empty() ? selection_scores(heads * ld, 81) : scores;
  ASSERT_EQ(s.size(), static_cast<size_t>(heads) * ld);
  std::vector<int32_t> pos(heads * ld);
  for (int h = 0; h < heads; ++h) {
    for (int j = 0; j < ld; ++j) pos[h * ld + j] = 3 * j + (h % 2);  // some equal across heads
  }
  cpu::RaggedScores rs{s.data(), positions ? pos.data() : nullptr, lengths.data(), heads, ld};
  std::vector<int32_t> want(heads);
  cpu::global_topk_counts(rs, k, want.data());
  if (!expect.empty()) {
    ASSERT_EQ(want, expect) << "the CPU reference itself";
  }
  const auto sd = to_device(s);
  const auto pd = to_device(pos), lend = to_device(lengths);
  cu::RaggedScores rd{sd.data(), positions ? pd.data() : nullptr, lend.data(), heads, ld};
  cu::DeviceBuffer<int32_t> got(heads);
  cu::global_topk_counts(rd, k, got.data());
  // Counts follow from the total order (score, position, head): they must agree exactly.
  EXPECT_EQ(to_host(got), want) << "k = " << k;
}

// ---- policy scoring, clustering, SubGen --------------------------------------------------------

void run_accumulate(int group, policies::GqaReduce how) {
  const std::vector<int32_t> lengths = {1, 17, 4097};
  const int kvh = 3, ld = 4100, stride = 4099;
  const std::vector<float> cs = random_vec(static_cast<size_t>(kvh) * group * stride, 91, 0, 1);
  std::vector<float> want = random_vec(static_cast<size_t>(kvh) * ld, 92, 0, 4);
  auto sd = to_device(want);
  std::vector<float> add(ld);
  for (int h = 0; h < kvh; ++h) {  // the H2O policy's own steps
    policies::reduce_gqa(cs.data() + static_cast<size_t>(h) * group * stride, stride, group,
                         lengths[h], how, add.data());
    for (int s = 0; s < lengths[h]; ++s) want[static_cast<size_t>(h) * ld + s] += add[s];
  }
  const auto csd = to_device(cs);
  const auto lend = to_device(lengths);
  cu::accumulate_scores(sd.data(), ld, lend.data(), csd.data(), stride, kvh, group, how);
  expect_bits(to_host(sd), want, "accumulate_scores");
}

// Scissorhands' history bits: the policy's loop (kernels/policies/scissorhands.cc update) is the
// reference, replayed here per head on the same cache, probabilities and old bits.
void run_history_bits(int group, int n_new, int last_w, int history, bool inv_position) {
  const std::vector<int> before = {0, 3, 40};  // a fresh head, a short one, a longer one
  const int kvh = 3, nh = kvh * group;
  kernels::KvCache cpu({1, kvh, 4}, 64);
  const std::vector<float> kv(4, 0.5f);
  for (int h = 0; h < kvh; ++h) {
    for (int s = 0; s < before[h] + n_new; ++s) cpu.append(0, h, kv.data(), kv.data(), 3 * s + h);
  }
  cu::DeviceKvCache dev({1, kvh, 4}, cu::KvDtype::kF32, 64);
  dev.upload(cpu);
  const int ld = 64, stride = 60;
  std::vector<float> probs(static_cast<size_t>(nh) * last_w * stride);
  for (size_t i = 0; i < probs.size(); ++i) probs[i] = uniform(131, i, 0.0f, 0.06f);  // ~1/visible
  std::vector<uint64_t> bits(static_cast<size_t>(kvh) * ld);
  for (size_t i = 0; i < bits.size(); ++i) {
    bits[i] = kernels::cpu::mix64(i) & (history == 64 ? ~0ull : (1ull << history) - 1);
  }
  auto bd = to_device(bits);
  const auto pd = to_device(probs);
  const uint64_t window = history == 64 ? ~0ull : (1ull << history) - 1;
  std::vector<float> p(ld);
  for (int h = 0; h < kvh; ++h) {
    const int len = cpu.length(0, h), b0 = len - n_new, unrecorded = n_new - last_w;
    uint64_t* row = &bits[static_cast<size_t>(h) * ld];
    for (int s = b0; s < len; ++s) row[s] = 0;  // new slots (and a fresh head: b0 == 0)
    for (int s = 0; s < len; ++s)
      row[s] = unrecorded >= history ? 0 : (row[s] << unrecorded) & window;
    for (int j = 0; j < last_w; ++j) {
      const int i = unrecorded + j, visible = b0 + i + 1;
      policies::reduce_gqa(&probs[(static_cast<size_t>(h) * group * last_w + j) * stride],
                           static_cast<size_t>(last_w) * stride, group, visible,
                           policies::GqaReduce::kMean, p.data());
      const int32_t pos = cpu.layer(0).position(h)[b0 + i];
      const float threshold = 1.0f / static_cast<float>(inv_position ? pos + 1 : visible);
      for (int s = 0; s < len; ++s) {
        const uint64_t below = s < visible && p[s] < threshold ? 1 : 0;
        row[s] = ((row[s] << 1) | below) & window;
      }
    }
  }
  cu::HistoryBitsArgs a;
  a.bits = bd.data();
  a.ld = ld;
  a.kv = dev.layer(0);
  a.last_probs = pd.data();
  a.stride = stride;
  a.last_w = last_w;
  a.n_new = n_new;
  a.num_heads = nh;
  a.history = history;
  a.inv_position = inv_position;
  cu::scissorhands_update_bits(a);
  const std::vector<uint64_t> got = to_host(bd);
  for (int h = 0; h < kvh; ++h) {
    for (int s = 0; s < cpu.length(0, h); ++s) {
      ASSERT_EQ(got[static_cast<size_t>(h) * ld + s], bits[static_cast<size_t>(h) * ld + s])
          << "head " << h << " slot " << s;
    }
  }
}

void run_subgen(int tokens, int n_exact) {
  const int d = 16;
  cpu::SubgenParams p{d, 4, 3, 6, 0.5};
  cpu::SubgenSketch sk;
  for (int t = 0; t < tokens; ++t) {
    const std::vector<float> k = random_vec(d, 200 + t), v = random_vec(d, 300 + t);
    cpu::subgen_absorb(p, {7, 0, 1, static_cast<uint64_t>(t)}, k.data(), v.data(), sk);
  }
  const std::vector<float> q = random_vec(d, 111, -3, 3);
  const std::vector<float> ek = random_vec(static_cast<size_t>(n_exact) * d, 112);
  const std::vector<float> ev = random_vec(static_cast<size_t>(n_exact) * d, 113);
  const std::vector<float> eb = random_vec(n_exact, 114);
  cpu::SubgenQueryArgs a;
  a.q = q.data();
  a.head_dim = d;
  a.scale = 0.25f;
  a.sketch = tokens > 0 ? cpu::subgen_view(sk, p) : cpu::SubgenSketchView{};
  a.exact_keys = ek.data();
  a.exact_values = ev.data();
  a.exact_bias = eb.data();
  a.n_exact = n_exact;
  std::vector<float> want(d, 123.0f), sentinel(d, 123.0f);
  a.out = want.data();
  cpu::subgen_query(a);
  // The same query with device copies of every array.
  const auto qd = to_device(q), ekd = to_device(ek), evd = to_device(ev), ebd = to_device(eb);
  const auto mk = to_device(sk.m_keys), mv = to_device(sk.m_values), smp = to_device(sk.samples);
  const auto cnt = to_device(sk.counts);
  auto outd = to_device(sentinel);
  cpu::SubgenQueryArgs g = a;
  g.q = qd.data();
  g.exact_keys = ekd.data();
  g.exact_values = evd.data();
  g.exact_bias = ebd.data();
  g.out = outd.data();
  if (tokens > 0) {
    g.sketch.m_keys = mk.data();
    g.sketch.m_values = mv.data();
    g.sketch.samples = smp.data();
    g.sketch.counts = cnt.data();
  }
  cu::subgen_query(g);
  // Same order, double sums; exp may differ in a double's last bit.
  expect_close(to_host(outd), want, 1e-7, 1e-6, "subgen_query");
}

// ---- the table ---------------------------------------------------------------------------------

std::vector<Case> all_cases() {
  std::vector<Case> c;
  auto add = [&](std::string name, std::function<void()> f) {
    c.push_back({std::move(name), std::move(f)});
  };
  // F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS.
  for (uint32_t type : {1u, 30u, 2u, 3u, 6u, 7u, 8u, 20u, 10u, 11u, 12u, 13u, 14u, 23u}) {
    for (size_t blocks : {1, 3, 17}) {
      add("dequant_" + std::string(cpu::ggml_type_name(type)) + "_" + std::to_string(blocks),
          [=] { run_dequant(type, blocks); });
    }
  }
  add("dequant_F16_4097", [] { run_dequant(1, 4097); });
  for (bool bf16 : {false, true}) {
    const std::string t = bf16 ? "bf16" : "f32";
    add("matmul_" + t + "_1x1x1", [=] { run_matmul(1, 1, 1, true, bf16); });
    add("matmul_" + t + "_3x7x17", [=] { run_matmul(3, 7, 17, false, bf16); });
    add("matmul_" + t + "_17x4097x3", [=] { run_matmul(17, 4097, 3, true, bf16); });
    add("matmul_" + t + "_7x64x33_k0", [=] { run_matmul(7, 0, 33, true, bf16); });
  }
  for (size_t n : {1, 17, 4097}) add("to_bf16_" + std::to_string(n), [=] { run_to_bf16(n); });
  for (int dim : {1, 7, 4097}) add("rmsnorm_" + std::to_string(dim), [=] { run_rmsnorm(17, dim); });
  add("rope_norm", [] { run_rope(cpu::RopeStyle::kNorm, 64, false, 1.0f); });
  add("rope_neox", [] { run_rope(cpu::RopeStyle::kNeox, 64, false, 1.0f); });
  add("rope_neox_partial_factors", [] { run_rope(cpu::RopeStyle::kNeox, 32, true, 1.0f); });
  add("rope_norm_linear_scale", [] { run_rope(cpu::RopeStyle::kNorm, 48, false, 2.0f); });
  // YaRN / LongRoPE: per-dimension factors and cos/sin scaled by the attention factor.
  add("rope_neox_factors_attn_factor",
      [] { run_rope(cpu::RopeStyle::kNeox, 48, true, 1.0f, 1.1386294f); });
  for (size_t n : {1, 7, 4097}) add("swiglu_" + std::to_string(n), [=] { run_swiglu(n); });
  for (size_t n : {1, 7, 4097}) {
    add("geglu_tanh_" + std::to_string(n), [=] { run_geglu_tanh(n); });
  }
  for (int n : {1, 3, 7, 17, 4097}) {
    for (int kernel : {1, 7, 9}) {
      add("pool_max_" + std::to_string(n) + "_k" + std::to_string(kernel),
          [=] { run_pool(3, n, kernel, cpu::PoolKind::kMax); });
      add("pool_avg_" + std::to_string(n) + "_k" + std::to_string(kernel),
          [=] { run_pool(3, n, kernel, cpu::PoolKind::kAvg); });
    }
  }
  for (int n : {1, 3, 7, 17, 4097}) {
    for (int k : std::set<int>{0, 1, n / 2, n, n + 5}) {  // n + 5: budget above the length
      add("topk_" + std::to_string(n) + "_k" + std::to_string(k), [=] { run_topk(n, k); });
    }
    add("tie_rule_" + std::to_string(n), [=] { run_tie_rule(n, (n + 1) / 2); });
  }
  add("topk_rows_ragged", [] { run_topk_rows({1, 3, 7, 17, 4097, 0}, {1, 2, 7, 5, 1024, 3}); });
  add("topk_rows_budget_above", [] { run_topk_rows({3, 17}, {9, 40}); });
  for (bool pos : {false, true}) {
    for (int k : {0, 1, 13, 4113, 9000}) {
      add(std::string("global_topk_") + (pos ? "pos_" : "slot_") + std::to_string(k), [=] {
        run_global_topk({1, 3, 7, 17, 4097, 8}, pos, k);
      });
    }
  }
  // Equal (score, position) entries at the k-th in heads 0 and 1, and a larger entry in head 2:
  // the 5 is in, then the tie goes to head 0 (by hand: {1, 0, 1}). A count that handed ties out
  // head by head before counting later heads' larger entries gave {1, 1, 0}.
  add("global_topk_ties_before_larger", [] {
    const float x = -1;  // beyond the length, never read
    run_global_topk({1, 1, 2}, false, 2, {1, x, x, 1, x, x, 1, 5, x}, {1, 0, 1});
  });
  // Many ties across heads: scores from {0, 1, 2}, positions equal across heads (slots).
  for (int k : {1, 7, 100, 2000}) {
    add("global_topk_many_ties_" + std::to_string(k), [=] {
      const std::vector<int32_t> lengths = {5, 17, 4097, 33};
      const int ld = 4098;
      std::vector<float> sc(lengths.size() * ld);
      for (size_t i = 0; i < sc.size(); ++i) sc[i] = static_cast<float>((i * 7919u) % 3);
      run_global_topk(lengths, false, k, sc);
    });
  }
  for (int g : {1, 2, 4, 7}) {
    add("accumulate_mean_g" + std::to_string(g),
        [=] { run_accumulate(g, policies::GqaReduce::kMean); });
    add("accumulate_max_g" + std::to_string(g),
        [=] { run_accumulate(g, policies::GqaReduce::kMax); });
  }
  for (int g : {1, 2, 4, 7}) {
    add("history_bits_decode_g" + std::to_string(g), [=] { run_history_bits(g, 1, 1, 32, false); });
    add("history_bits_block_g" + std::to_string(g), [=] { run_history_bits(g, 17, 5, 64, true); });
  }
  add("history_bits_unrecorded_past_history", [] { run_history_bits(2, 7, 1, 4, false); });
  add("history_bits_all_recorded", [] { run_history_bits(7, 3, 3, 3, true); });
  add("kcenter_1", [] { run_kcenter(1, 8, 3, false); });
  add("kcenter_17_dup", [] { run_kcenter(17, 5, 7, true); });
  add("kcenter_4097", [] { run_kcenter(4097, 16, 64, true); });
  add("kcenter_k_above_n", [] { run_kcenter(7, 4, 20, false); });
  for (const auto& named : kcenter_batch_cases()) {
    const std::vector<KCenterSpec> specs = named.second;
    add("kcenter_batch_" + named.first, [specs] { run_kcenter_batch(specs); });
  }
  add("subgen_empty", [] { run_subgen(0, 0); });
  add("subgen_exact_only", [] { run_subgen(0, 3); });
  add("subgen_sketch", [] { run_subgen(40, 0); });
  add("subgen_sketch_exact", [] { run_subgen(17, 7); });
  int i = 0;
  for (const AttentionCase& a : attention_cases()) {
    add("attention_" + std::to_string(i) + "_n" + std::to_string(a.n),
        [=] { run_attention_case(a); });
    if (a.n == 1) {
      // Decode runs the streamed kernel by default where it takes the layer: the same case on
      // the grouped kernel too.
      AttentionCase g = a;
      g.decode_kernel = cu::kDecodeGrouped;
      add("attention_" + std::to_string(i) + "_n1_grouped", [=] { run_attention_case(g); });
    }
    ++i;
  }
  for (const auto& named : decode_tuning_cases()) {
    const AttentionCase a = named.second;
    add("attention_decode_" + named.first, [a] { run_attention_case(a); });
  }
  for (const auto& named : decode_stream_cases()) {
    const AttentionCase a = named.second;
    add("attention_decode_" + named.first, [a] { run_attention_case(a); });
  }
  i = 0;
  for (const PrefillMmaCase& a : prefill_mma_cases()) {
    add("prefill_mma_" + std::to_string(i++) + "_n" + std::to_string(a.n) + "_d" +
            std::to_string(a.head_dim),
        [=] { run_prefill_mma_case(a); });
  }
  i = 0;
  for (const PrefillMmaCase& a : decode_mma_cases()) {
    add("decode_mma_" + std::to_string(i++) + "_g" + std::to_string(a.group) + "_d" +
            std::to_string(a.head_dim) + (a.expect_mma ? "" : "_fallback"),
        [=] { run_prefill_mma_case(a); });
  }
  add("kv_cache_f32", [] { run_kv_cache_case(cu::KvDtype::kF32); });
  add("kv_cache_bf16", [] { run_kv_cache_case(cu::KvDtype::kBf16); });
  add("kv_cache_bf16_d7", [] { run_kv_cache_case(cu::KvDtype::kBf16, 7); });
  add("kv_cache_f32_d64", [] { run_kv_cache_case(cu::KvDtype::kF32, 64); });
  add("kv_cache_many_heads", [] { run_kv_cache_many_heads_case(); });
  return c;
}

class CudaParity : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!cu::has_device()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
  }
};

TEST_P(CudaParity, MatchesCpuReference) { GetParam().run(); }

INSTANTIATE_TEST_SUITE_P(AllOps, CudaParity, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// Without a device the helpers must say so rather than throw (what every skip relies on).
TEST(CudaRuntime, DeviceQueryNeverThrows) {
  EXPECT_NO_THROW(cu::device_count());
  EXPECT_EQ(cu::has_device(), cu::device_count() > 0);
  if (!cu::has_device()) GTEST_SKIP() << "no CUDA device";
  EXPECT_THROW(KVB_CUDA_CHECK(cudaSetDevice(cu::device_count())), Error);
}

}  // namespace
}  // namespace kvb::parity
