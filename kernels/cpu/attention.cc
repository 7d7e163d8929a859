// Causal GQA attention over the ragged per-head cache with optional statistics, CPU reference.
#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include "common/error.h"
#include "kernels/cpu/aligned_scratch.h"
#include "kernels/cpu/exp_exact.h"
#include "kernels/cpu/exp_fast.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_tree.h"
#include "kernels/cpu/vec.h"
#include "kernels/f16.h"

namespace kvb::kernels::cpu {

namespace {
// Prefill blocks of many queries go through the GEMM kernel: per (KV head, query block), the
// scores of the group's query heads against the visible keys in one product, a masked softmax
// per row, then P x V in a second product (both matmul_wt_packed over K and V packed once per
// call). Probabilities, outputs and statistics are the same quantities as the row path, up to f32
// summation order.
//
// The bits are those of the first version of this path (kept by the tests in
// test_attention_cpu.cc against a plain transcription of it): scores = matmul(q rows, keys);
// per row, p = scores * scale, max, p = exp(p - max) with a double sum in slot order, p *= 1/sum;
// P x V = matmul(P, V^T) over k = the head's length (window: the block's span), P zero past a
// row's visible slots. What changed is only where the work goes: P and the queries sit in 64-byte
// aligned rows read in place (the matmul copied P, V^T and the keys for every block: about 35 GB
// for a 4,096-token prompt on SmolLM2); P x V stops at the block's last visible slot instead of the
// head's length (half the products, all of them 0 x v); the rows' max and sum chains run eight
// rows at a time; both products are matmul_wt's outer products (matmul's bits, no horizontal
// reductions; Q K^T at head_dim 64 ran at 38 GFLOP/s as dot products, 50 as an outer product).
// Fewer queries than a block (decode) take run_few_job below, with the row path's definition.
constexpr int kBlockedMinQueries = 32;
constexpr int kQueryBlock = 32;
constexpr int kRowGroup = 8;  // rows whose max and sum chains are interleaved

size_t round16(size_t x) { return (x + 15) / 16 * 16; }

// Row `slot` of KV head h's keys / values as f32: the cache's own row, or (a cache of f16 rows,
// kernels/f16.h) the row converted into tmp ([head_dim]). Conversion is exact, so every result
// below equals the f32 path's on a cache holding the f16 rows' values.
const float* value_row(const LayerKvView& kv, int h, int slot, float* tmp) {
  if (kv.values16 == nullptr) return kv.value(h, slot);
  f16_to_f32(kv.value16(h, slot), tmp, kv.head_dim);
  return tmp;
}

// max over p[first, visible), -inf when empty. In 16 interleaved lanes: the maximum is the same
// number in any order (a NaN is skipped as std::max(acc, NaN) skips it); only the sign of a zero
// maximum may differ, and exp(p - (+0)) == exp(p - (-0)) for every p.
float row_max(const float* p, int first, int visible) {
  float acc[16];
  std::fill(acc, acc + 16, -INFINITY);
  int s = first;
  for (; s + 16 <= visible; s += 16) {
    for (int l = 0; l < 16; ++l) acc[l] = std::max(acc[l], p[s + l]);
  }
  for (int l = 0; s < visible; ++s, ++l) acc[l] = std::max(acc[l], p[s]);
  float m = -INFINITY;
  for (int l = 0; l < 16; ++l) m = std::max(m, acc[l]);
  return m;
}

// sum[r] = sum of p[r][first[r], visible[r]) in double, each row in increasing slot order, for
// kRowGroup rows: the rows' chains interleaved where they all have slots, so that the adds'
// latency overlaps.
void row_sums(float* const* p, const int* first, const int* visible, double* sum) {
  int lo = 0, hi = INT32_MAX;
  for (int r = 0; r < kRowGroup; ++r) {
    lo = std::max(lo, first[r]);
    hi = std::min(hi, visible[r]);
  }
  hi = std::max(hi, lo);
  double acc[kRowGroup];
  for (int r = 0; r < kRowGroup; ++r) {
    acc[r] = 0;
    for (int s = first[r]; s < std::min(lo, visible[r]); ++s) acc[r] += p[r][s];
  }
  for (int s = lo; s < hi; ++s) {
#pragma GCC unroll 8
    for (int r = 0; r < kRowGroup; ++r) acc[r] += p[r][s];
  }
  for (int r = 0; r < kRowGroup; ++r) {
    for (int s = std::max(hi, first[r]); s < visible[r]; ++s) acc[r] += p[r][s];
    sum[r] = acc[r];
  }
}

// Per row r of rows: p[r] = softmax(scale * src[r]) over [first[r], visible[r]), in place
// (src may be p), as the row path computes it: p = src * scale, its max, p = exp(p - max) with
// a double sum in increasing slot order, p *= (float)(1 / sum); exp is exp_fast under fast_exp
// (the difference and the exp in one pass, exp_fast_floats_shifted). scaled: p holds
// src * scale already (the blocked path's Q K^T multiplies as it stores), so that pass is
// skipped. p, src: row r at r * ld.
void softmax_rows(float* p, const float* src, size_t ld, int rows, const int* first,
                  const int* visible, float scale, bool scaled, bool fast_exp) {
  thread_local std::vector<float*> pr;  // the rows, and their sums: kept for the next call
  thread_local std::vector<double> sum;
  pr.resize(rows);
  sum.resize(rows);
  for (int r = 0; r < rows; ++r) {
    pr[r] = p + static_cast<size_t>(r) * ld;
    const float* sr = src + static_cast<size_t>(r) * ld;
    if (!scaled) {
      for (int s = first[r]; s < visible[r]; ++s) pr[r][s] = sr[s] * scale;
    }
    const float mx = row_max(pr[r], first[r], visible[r]);
    if (fast_exp) {
      exp_fast_floats_shifted(pr[r] + first[r], pr[r] + first[r], visible[r] - first[r], mx);
    } else {
      for (int s = first[r]; s < visible[r]; ++s) pr[r][s] -= mx;
      exp_floats(pr[r] + first[r], pr[r] + first[r], visible[r] - first[r]);  // std::exp's bits
    }
  }
  int r = 0;
  for (; r + kRowGroup <= rows; r += kRowGroup) {
    row_sums(&pr[r], first + r, visible + r, &sum[r]);
  }
  for (; r < rows; ++r) {
    double acc = 0;
    for (int s = first[r]; s < visible[r]; ++s) acc += pr[r][s];
    sum[r] = acc;
  }
  for (r = 0; r < rows; ++r) {
    const float inv = static_cast<float>(1.0 / sum[r]);
    for (int s = first[r]; s < visible[r]; ++s) pr[r][s] *= inv;
  }
}

// One output of P x V over k = len slots in the matmul's order, P's row zero from `cut` on:
// what the first version of this path computed for it. P x V now stops at `cut` (the products
// past it are 0 x v); a lane sum that is -0 there would have become +0 by adding a 0 x v of
// positive v, which can change only an output that is zero, so those are computed again here.
float pv_full_width(const float* p, int cut, const LayerKvView& kv, int kvh, int len, int j) {
  float lanes[16] = {};
  for (int s = 0; s < len; ++s) {
    const float ps = s < cut ? p[s] : 0.0f;
    const float v = kv.values16 ? f16_to_f32(kv.value16(kvh, s)[j]) : kv.value(kvh, s)[j];
    lanes[s & 15] = std::fma(ps, v, lanes[s & 15]);
  }
  return tree16(lanes);
}

// Per-thread buffers of one block: the group's queries, scores/probabilities and outputs, 64-byte
// aligned.
struct BlockScratch {
  AlignedScratch qb, sc, ob;
  std::vector<int> first, visible;
};

void attention_blocked(const AttentionArgs& a, int group) {
  const LayerKvView& kv = a.kv;
  const int d = kv.head_dim;
  const size_t d16 = round16(d);
  const int n = a.n;
  // Per KV head, packed once per call for matmul_wt_packed (matmul.h: matmul's bits with the
  // weight given transposed, as an outer product, so no product reduces across a vector and V is
  // never transposed): K^T in panels of 16 slots (panel c: slots [16c, 16c + 16), row p their
  // dimension p; a block's keys are the columns [lo, vis_max)) and V in panels of 16 dimensions
  // (panel c: dimensions [16c, 16c + 16), row s slot s; a block's P x V starts at row lo).
  // f16 rows are converted as they are packed (exactly).
  std::vector<AlignedScratch> kp(kv.num_kv_heads), vp(kv.num_kv_heads);
  std::vector<const float*> kpan(kv.num_kv_heads), vpan(kv.num_kv_heads);
  std::vector<size_t> vstride(kv.num_kv_heads);
  const size_t kstride = 16 * static_cast<size_t>(d);
  const int dpanels = (d + 15) / 16;
  for (int h = 0; h < kv.num_kv_heads; ++h) {
    const int len = kv.lengths[h];
    const size_t kpanels = (len + 15) / 16;
    vstride[h] = 16 * static_cast<size_t>(len);
    float* kh = kp[h].get(kpanels * kstride);
    float* vh = vp[h].get(dpanels * vstride[h]);
    kpan[h] = kh;
    vpan[h] = vh;
    std::fill(kh + (kpanels - 1) * kstride, kh + kpanels * kstride, 0.0f);  // slots past len
    if (d % 16 != 0) {                                                      // dimensions past d
      std::fill(vh + (dpanels - 1) * vstride[h], vh + dpanels * vstride[h], 0.0f);
    }
    std::vector<float> krow(d), vrow(d);
    for (int s = 0; s < len; ++s) {
      const float* k = krow.data();
      const float* v = vrow.data();
      if (kv.keys16) {
        f16_to_f32(kv.key16(h, s), krow.data(), d);
      } else {
        k = kv.key(h, s);
      }
      if (kv.values16) {
        f16_to_f32(kv.value16(h, s), vrow.data(), d);
      } else {
        v = kv.value(h, s);
      }
      float* kc = kh + (s / 16) * kstride + s % 16;
      for (int j = 0; j < d; ++j) kc[16 * j] = k[j];
      for (int j = 0; j < d; ++j)
        vh[(j / 16) * vstride[h] + 16 * static_cast<size_t>(s) + j % 16] = v[j];
    }
  }
  const int blocks = (n + kQueryBlock - 1) / kQueryBlock;
  // Query heads [g0, g1) of KV head kvh's group, query block b.
  auto run_block = [&](int kvh, int g0, int g1, int b, BlockScratch& t) {
    const int len = kv.lengths[kvh];
    const int i0 = b * kQueryBlock, i1 = std::min(n, i0 + kQueryBlock), nb = i1 - i0;
    const int rows = (g1 - g0) * nb;
    const int vis_max = len - n + i1;  // keys the last query of the block sees
    // Without a window the block's keys are [0, vis_max); with one, [lo, vis_max) (the first
    // query's window onwards). Probability rows hold the span in aligned rows of lds.
    const int lo = a.window > 0 ? std::max(0, len - n + i0 - a.window + 1) : 0;
    const int span = vis_max - lo;
    const size_t lds = round16(span);
    float* qb = t.qb.get(static_cast<size_t>(rows) * d16);
    for (int g = g0; g < g1; ++g) {
      const int h = kvh * group + g;
      for (int r = 0; r < nb; ++r) {
        std::memcpy(qb + (static_cast<size_t>(g - g0) * nb + r) * d16,
                    a.q + (static_cast<size_t>(i0 + r) * a.num_heads + h) * d, d * sizeof(float));
      }
    }
    float* sc = t.sc.get(static_cast<size_t>(rows) * lds);
    matmul_wt_packed(sc, lds, qb, d16, kpan[kvh], kstride, rows, d, lo, span, a.scale);
    t.first.resize(rows);
    t.visible.resize(rows);
    for (int g = g0; g < g1; ++g) {
      for (int r = 0; r < nb; ++r) {
        // Row entries [first, visible) relative to lo (first > 0 only under a window).
        const int visible = len - n + i0 + r + 1 - lo;
        const int row = (g - g0) * nb + r;
        t.first[row] = a.window > 0 ? std::max(0, visible - a.window) : 0;
        t.visible[row] = visible;
      }
    }
    softmax_rows(sc, sc, lds, rows, t.first.data(), t.visible.data(), a.scale, true, a.fast_exp);
    for (int g = g0; g < g1; ++g) {
      const int h = kvh * group + g;
      for (int r = 0; r < nb; ++r) {
        const int i = i0 + r;
        const int row = (g - g0) * nb + r;
        float* p = sc + static_cast<size_t>(row) * lds;
        const int first = t.first[row], visible = t.visible[row];
        // P x V reads [0, span): zero what the softmax left out.
        std::fill(p, p + first, 0.0f);
        std::fill(p + visible, p + span, 0.0f);
        if (a.col_sums) {
          float* cs = a.col_sums + static_cast<size_t>(h) * a.stats_stride;
          for (int s = 0; s < visible; ++s) cs[s] += p[s];
        }
        const int w_index = i - (n - a.last_w);
        if (a.last_probs && w_index >= 0) {
          std::memcpy(a.last_probs + (static_cast<size_t>(h) * a.last_w + w_index) * a.stats_stride,
                      p, visible * sizeof(float));
        }
      }
    }
    float* ob = t.ob.get(static_cast<size_t>(rows) * d);
    matmul_wt_packed(ob, d, sc, lds, vpan[kvh] + 16 * static_cast<size_t>(lo), vstride[kvh], rows,
                     span, 0, d);
    if (a.window == 0 && span < len) {
      for (int row = 0; row < rows; ++row) {
        float* o = ob + static_cast<size_t>(row) * d;
        for (int j = 0; j < d; ++j) {
          if (o[j] == 0.0f) {
            o[j] = pv_full_width(sc + static_cast<size_t>(row) * lds, span, kv, kvh, len, j);
          }
        }
      }
    }
    for (int g = g0; g < g1; ++g) {
      const int h = kvh * group + g;
      for (int r = 0; r < nb; ++r) {
        std::memcpy(a.out + (static_cast<size_t>(i0 + r) * a.num_heads + h) * d,
                    ob + (static_cast<size_t>(g - g0) * nb + r) * d, d * sizeof(float));
      }
    }
  };
  if (a.col_sums) {
    // Column sums accumulate in query order: one query head per thread, its blocks in order.
#pragma omp parallel
    {
      BlockScratch t;
#pragma omp for schedule(dynamic, 1)
      for (int h = 0; h < a.num_heads; ++h) {
        for (int b = 0; b < blocks; ++b) run_block(h / group, h % group, h % group + 1, b, t);
      }
    }
    return;
  }
  const int jobs = kv.num_kv_heads * blocks;
#pragma omp parallel
  {
    BlockScratch t;
    // Later blocks see more keys: hand them out first.
#pragma omp for schedule(dynamic, 1)
    for (int j = 0; j < jobs; ++j) {
      const int b = blocks - 1 - j / kv.num_kv_heads;
      run_block(j % kv.num_kv_heads, 0, group, b, t);
    }
  }
}

// P x V of the row path for `rows` rows of KV head kvh: out[r][j] = tree16 over lanes l of the
// sum, in increasing slot order with fused multiply-adds from +0, of p_r[s] * v_s[j] over the
// slots s = l (mod 16) of [lo + first[r], lo + visible[r]) (first, visible relative to lo, as
// the softmax's; p_r[s] at p + r * ldp + s - lo). lanes: [rows, 16, d], the 16 lane sums of each
// row (a row's 16 x d floats stay in L1); out: [rows, d]. Both paths give these bits (the portable
// one is the definition written out); active_isa() picks.
//
// The AVX-512 path reads V once, in slot order (each slot's row feeds every row's lane s & 15).
// It kept each lane's sums in registers and read the slots of one lane at a time (s = l, l + 16,
// ...): 16 sweeps with a stride of 16 rows, which at head_dim 64 is 4 KiB, the page size, where
// the hardware prefetchers stop; a decode step's P x V then waited on memory for every row.
void pv_lanes_portable(const float* p, size_t ldp, int lo, const int* first, const int* visible,
                       int rows, const LayerKvView& kv, int kvh, float* lanes);

// The slots the rows of a P x V see, [lo + first[r], lo + visible[r]) for row r: their union
// [all_lo, all_hi), the slots read, and their intersection [every_lo, every_hi), the slots every
// row reads (empty when every_lo >= every_hi).
struct SlotSpan {
  int all_lo = INT32_MAX, all_hi = 0, every_lo = 0, every_hi = INT32_MAX;
};
SlotSpan slot_span(int rows, int lo, const int* first, const int* visible) {
  SlotSpan sp;
  for (int r = 0; r < rows; ++r) {
    sp.all_lo = std::min(sp.all_lo, lo + first[r]);
    sp.all_hi = std::max(sp.all_hi, lo + visible[r]);
    sp.every_lo = std::max(sp.every_lo, lo + first[r]);
    sp.every_hi = std::min(sp.every_hi, lo + visible[r]);
  }
  return sp;
}

// Value row `slot` of KV head h as the cache stores it: T float (f32 rows) or uint16_t (f16).
template <typename T>
const T* stored_value(const LayerKvView& kv, int h, int slot) {
  if constexpr (std::is_same_v<T, float>) {
    return kv.value(h, slot);
  } else {
    return kv.value16(h, slot);
  }
}
#if defined(__AVX512F__)
inline __m512 load16(const float* v) { return _mm512_loadu_ps(v); }
inline __m512 load16(const uint16_t* v) {  // 16 f16 values, exactly
  return _mm512_maskz_cvtph_ps(static_cast<__mmask16>(0xFFFF),
                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v)));
}
// One slot's row v into the lane sums acc of one row, nc full vectors (NC > 0: a constant).
template <int NC, typename T>
inline void pv_slot_avx512(float* acc, const T* v, __m512 pb, int nc, __mmask16 tail) {
  const int n = NC > 0 ? NC : nc;
  for (int c = 0; c < n; ++c) {
    _mm512_storeu_ps(acc + 16 * c,
                     _mm512_fmadd_ps(pb, load16(v + 16 * c), _mm512_loadu_ps(acc + 16 * c)));
  }
  if constexpr (std::is_same_v<T, float>) {
  if (NC == 0 && tail != 0) {
    const int c = n;
    _mm512_mask_storeu_ps(acc + 16 * c, tail,
                          _mm512_fmadd_ps(pb, _mm512_maskz_loadu_ps(tail, v + 16 * c),
                                          _mm512_maskz_loadu_ps(tail, acc + 16 * c)));
  }
  }
}

// T: the cache's element (float, or uint16_t for f16 rows, which take NC > 0: head_dim 64 or
// 128; other widths convert each row first).
template <int NC, typename T>
void pv_rows_avx512(const float* p, size_t ldp, int lo, const int* first, const int* visible,
                    int rows, const LayerKvView& kv, int kvh, float* lanes) {
  const int d = kv.head_dim;
  const int nc = d / 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (d % 16)) - 1u);
  std::fill(lanes, lanes + static_cast<size_t>(rows) * 16 * d, 0.0f);
  const SlotSpan sp = slot_span(rows, lo, first, visible);
  for (int s = sp.all_lo; s < sp.all_hi; ++s) {
    const T* v = stored_value<T>(kv, kvh, s);
    const bool every = s >= sp.every_lo && s < sp.every_hi;  // every row sees slot s
    for (int r = 0; r < rows; ++r) {
      if (!every && (s < lo + first[r] || s >= lo + visible[r])) continue;
      const __m512 pb = _mm512_set1_ps(p[static_cast<size_t>(r) * ldp + (s - lo)]);
      pv_slot_avx512<NC, T>(lanes + (static_cast<size_t>(r) * 16 + (s & 15)) * d, v, pb, nc, tail);
    }
  }
}

void pv_lanes_avx512(const float* p, size_t ldp, int lo, const int* first, const int* visible,
                     int rows, const LayerKvView& kv, int kvh, float* lanes) {
  if (kv.values16 != nullptr) {
    switch (kv.head_dim) {
      case 64: return pv_rows_avx512<4, uint16_t>(p, ldp, lo, first, visible, rows, kv, kvh, lanes);
      case 128:
        return pv_rows_avx512<8, uint16_t>(p, ldp, lo, first, visible, rows, kv, kvh, lanes);
      default: return pv_lanes_portable(p, ldp, lo, first, visible, rows, kv, kvh, lanes);
    }
  }
  switch (kv.head_dim) {
    case 64: return pv_rows_avx512<4, float>(p, ldp, lo, first, visible, rows, kv, kvh, lanes);
    case 128: return pv_rows_avx512<8, float>(p, ldp, lo, first, visible, rows, kv, kvh, lanes);
    default: return pv_rows_avx512<0, float>(p, ldp, lo, first, visible, rows, kv, kvh, lanes);
  }
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
#define KVB_ATTENTION_AVX2 1
inline __m256 load8(const float* v) { return _mm256_loadu_ps(v); }
inline __m256 load8(const uint16_t* v) {  // 8 f16 values, exactly
#if defined(__F16C__)
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v)));
#else
  alignas(32) float t[8];
  for (int i = 0; i < 8; ++i) t[i] = f16_to_f32(v[i]);
  return _mm256_load_ps(t);
#endif
}

// The AVX-512 path's loop with eight lanes of j: each slot's row, read once in slot order, into
// the lane sums of every row that sees it. NC: head_dim / 8 as a constant (64 and 128), or 0
// (any head_dim: nc vectors, then the last head_dim % 8 values one at a time). T: float, or
// uint16_t for f16 rows (converted exactly as they are read).
template <int NC, typename T>
void pv_rows_avx2(const float* p, size_t ldp, int lo, const int* first, const int* visible,
                  int rows, const LayerKvView& kv, int kvh, float* lanes) {
  const int d = kv.head_dim;
  const int nc = NC > 0 ? NC : d / 8;
  std::fill(lanes, lanes + static_cast<size_t>(rows) * 16 * d, 0.0f);
  const SlotSpan sp = slot_span(rows, lo, first, visible);
  for (int s = sp.all_lo; s < sp.all_hi; ++s) {
    const T* v = stored_value<T>(kv, kvh, s);
    for (int r = 0; r < rows; ++r) {
      if (s < lo + first[r] || s >= lo + visible[r]) continue;
      const float ps = p[static_cast<size_t>(r) * ldp + (s - lo)];
      const __m256 pb = _mm256_set1_ps(ps);
      float* acc = lanes + (static_cast<size_t>(r) * 16 + (s & 15)) * d;
      for (int c = 0; c < nc; ++c) {
        _mm256_storeu_ps(acc + 8 * c,
                         _mm256_fmadd_ps(pb, load8(v + 8 * c), _mm256_loadu_ps(acc + 8 * c)));
      }
      if constexpr (NC == 0) {
        for (int j = 8 * nc; j < d; ++j) {
          float vj;
          if constexpr (std::is_same_v<T, float>) {
            vj = v[j];
          } else {
            vj = f16_to_f32(v[j]);
          }
          acc[j] = std::fma(ps, vj, acc[j]);
        }
      }
    }
  }
}

// pv_rows_avx2 for the cache's element T, with head_dim a constant where it is 64 or 128.
template <typename T>
void pv_widths_avx2(const float* p, size_t ldp, int lo, const int* first, const int* visible,
                    int rows, const LayerKvView& kv, int kvh, float* lanes) {
  switch (kv.head_dim) {
    case 64: return pv_rows_avx2<8, T>(p, ldp, lo, first, visible, rows, kv, kvh, lanes);
    case 128: return pv_rows_avx2<16, T>(p, ldp, lo, first, visible, rows, kv, kvh, lanes);
    default: return pv_rows_avx2<0, T>(p, ldp, lo, first, visible, rows, kv, kvh, lanes);
  }
}

void pv_lanes_avx2(const float* p, size_t ldp, int lo, const int* first, const int* visible,
                   int rows, const LayerKvView& kv, int kvh, float* lanes) {
  if (kv.values16 != nullptr) {
    return pv_widths_avx2<uint16_t>(p, ldp, lo, first, visible, rows, kv, kvh, lanes);
  }
  pv_widths_avx2<float>(p, ldp, lo, first, visible, rows, kv, kvh, lanes);
}

inline __m256 load8_aligned(const float* v) { return _mm256_load_ps(v); }

// Scores of f16 keys without converting them into scratch first: sc[r][s] = matmul.h's dot of
// query row r (q + r * ldq, 32-byte aligned) and key s (keys + s * d) for s < span, with
// matmul's bits: lane l (of 16) sums q[p] k[p] for p = l, l + 16, ... by fused multiply-adds from
// +0, then s8[l] = a[l] + a[l + 8], s4[l] = s8[l] + s8[l + 4], (s4[0] + s4[2]) + (s4[1] + s4[3]).
// Here lanes 0-7 and 8-15 are two vectors, s8 their sum; eight keys' s8 reduce side by side.
// ROWS query rows at a time (1-4: their accumulators and a key's 64 values fit the 16
// registers). head_dim % 16 == 0.
template <int ROWS>
void scores_f16_rows(float* sc, size_t lds, const float* q, size_t ldq, const uint16_t* keys, int d,
                     int span) {
  alignas(32) uint16_t pad[8 * 256];  // the last block's keys, zero past span (d <= 256)
  for (int s0 = 0; s0 < span; s0 += 8) {
    const int m = std::min(8, span - s0);
    const uint16_t* block = keys + static_cast<size_t>(s0) * d;
    if (m < 8) {
      std::fill(pad, pad + 8 * d, uint16_t{0});
      std::copy(block, block + static_cast<size_t>(m) * d, pad);
      block = pad;
    }
    __m256 s8[ROWS][8];
    for (int j = 0; j < 8; ++j) {
      const uint16_t* k = block + static_cast<size_t>(j) * d;
      __m256 lo[ROWS], hi[ROWS];
      for (int r = 0; r < ROWS; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
      for (int c = 0; c < d; c += 64) {  // 64 values (8 vectors) of the key at a time
        const int pairs = std::min(4, (d - c) / 16);
        __m256 kv[8];
        for (int t = 0; t < 2 * pairs; ++t) kv[t] = load8(k + c + 8 * t);
        for (int r = 0; r < ROWS; ++r) {
          const float* qr = q + r * ldq + c;
          for (int t = 0; t < pairs; ++t) {
            lo[r] = _mm256_fmadd_ps(load8_aligned(qr + 16 * t), kv[2 * t], lo[r]);
            hi[r] = _mm256_fmadd_ps(load8_aligned(qr + 16 * t + 8), kv[2 * t + 1], hi[r]);
          }
        }
      }
      for (int r = 0; r < ROWS; ++r) s8[r][j] = _mm256_add_ps(lo[r], hi[r]);
    }
    for (int r = 0; r < ROWS; ++r) {
      const __m256 dots = detail::reduce8(s8[r]);
      float* out = sc + r * lds + s0;
      if (m == 8) {
        _mm256_storeu_ps(out, dots);
      } else {
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, dots);
        std::copy(tmp, tmp + m, out);
      }
    }
  }
}

// Calls f(r0, std::integral_constant<int, R>) for the rows [r0, r0 + R) of `rows`, in groups of
// four (R = 4 but for the last group): the scores kernels' ROWS as a constant.
template <typename F>
void in_row_groups(int rows, F f) {
  for (int r0 = 0; r0 < rows; r0 += 4) {
    switch (std::min(4, rows - r0)) {
      case 1: f(r0, std::integral_constant<int, 1>{}); break;
      case 2: f(r0, std::integral_constant<int, 2>{}); break;
      case 3: f(r0, std::integral_constant<int, 3>{}); break;
      default: f(r0, std::integral_constant<int, 4>{}); break;
    }
  }
}

// q: rows of 64-byte aligned query rows (ldq floats apart); keys: span f16 rows of d values.
void scores_f16_avx2(float* sc, size_t lds, const float* q, size_t ldq, const uint16_t* keys, int d,
                     int rows, int span) {
  in_row_groups(rows, [&](int r0, auto group) {
    scores_f16_rows<decltype(group)::value>(sc + r0 * lds, lds, q + r0 * ldq, ldq, keys, d, span);
  });
}
#endif  // AVX2 and FMA

#if defined(__AVX512F__)
// GCC 12's false positive on reduce16's inlined shuffles (matmul_tree.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// scores_f16_avx2's contract with sixteen lanes in one register: each key's 16 lane sums are one
// vector, and sixteen keys' vectors reduce together (matmul_tree.h's reduce16, the same pairings
// as reduce_lanes). ROWS query rows at a time; the lane vectors wait in `acc` ([ROWS][16]).
template <int ROWS>
void scores_f16_rows_avx512(float* sc, size_t lds, const float* q, size_t ldq,
                            const uint16_t* keys, int d, int span) {
  alignas(64) uint16_t pad[16 * 256];  // the last block's keys, zero past span (d <= 256)
  __m512 acc[ROWS][16];
  // reduce16's lane 4 r + c holds key r + 4 c: key j goes back to lane j.
  const __m512i order =
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  for (int s0 = 0; s0 < span; s0 += 16) {
    const int m = std::min(16, span - s0);
    const uint16_t* block = keys + static_cast<size_t>(s0) * d;
    if (m < 16) {
      std::fill(pad, pad + 16 * d, uint16_t{0});
      std::copy(block, block + static_cast<size_t>(m) * d, pad);
      block = pad;
    }
    for (int j = 0; j < 16; ++j) {
      const uint16_t* k = block + static_cast<size_t>(j) * d;
      __m512 a[ROWS];
      for (int r = 0; r < ROWS; ++r) a[r] = _mm512_setzero_ps();
      for (int c = 0; c < d; c += 64) {  // four vectors of the key at a time
        const int vecs = std::min(4, (d - c) / 16);
        __m512 kv[4];
        for (int t = 0; t < vecs; ++t) {
          kv[t] = _mm512_cvtph_ps(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + c + 16 * t)));
        }
        for (int r = 0; r < ROWS; ++r) {
          const float* qr = q + r * ldq + c;
          for (int t = 0; t < vecs; ++t) a[r] = _mm512_fmadd_ps(_mm512_load_ps(qr + 16 * t), kv[t], a[r]);
        }
      }
      for (int r = 0; r < ROWS; ++r) acc[r][j] = a[r];
    }
    for (int r = 0; r < ROWS; ++r) {
      const __m512 dots = _mm512_permutexvar_ps(order, detail::reduce16(acc[r]));
      _mm512_mask_storeu_ps(sc + r * lds + s0, static_cast<__mmask16>((1u << m) - 1u), dots);
    }
  }
}

void scores_f16_avx512(float* sc, size_t lds, const float* q, size_t ldq, const uint16_t* keys,
                       int d, int rows, int span) {
  in_row_groups(rows, [&](int r0, auto group) {
    scores_f16_rows_avx512<decltype(group)::value>(sc + r0 * lds, lds, q + r0 * ldq, ldq, keys, d,
                                                   span);
  });
}
#pragma GCC diagnostic pop
#endif  // __AVX512F__

// The scores of run_few_job over f16 keys read in place where a path can (head_dim a multiple of
// 16 up to 256, on the AVX-512 and AVX2 paths); false: the caller converts them.
bool scores_f16(float* sc, size_t lds, const float* q, size_t ldq, const LayerKvView& kv, int kvh,
                int lo, int rows, int span) {
#if defined(KVB_ATTENTION_AVX2)
  const int d = kv.head_dim;
  if (d % 16 == 0 && d <= 256) {
#if defined(__AVX512F__)
    if (active_isa() == Isa::kAvx512) {
      count_dispatch(SimdKernel::kAttentionScores, Isa::kAvx512);
      scores_f16_avx512(sc, lds, q, ldq, kv.key16(kvh, lo), d, rows, span);
      return true;
    }
#endif
    if (active_isa() >= Isa::kAvx2) {
      count_dispatch(SimdKernel::kAttentionScores, Isa::kAvx2);
      scores_f16_avx2(sc, lds, q, ldq, kv.key16(kvh, lo), d, rows, span);
      return true;
    }
  }
#else
  (void)sc, (void)lds, (void)q, (void)ldq, (void)kvh, (void)lo, (void)rows, (void)span;
#endif
  (void)kv;
  count_dispatch(SimdKernel::kAttentionScores, Isa::kPortable);
  return false;
}

// The portable loop reads V in slot order too, each slot's row (converted once, for f16 rows)
// feeding every row that sees it: each lane sum still takes its slots in increasing order, so the
// bits are those of a loop over rows then slots (the definition above).
void pv_lanes_portable(const float* p, size_t ldp, int lo, const int* first, const int* visible,
                       int rows, const LayerKvView& kv, int kvh, float* lanes) {
  const int d = kv.head_dim;
  std::fill(lanes, lanes + static_cast<size_t>(rows) * 16 * d, 0.0f);
  thread_local std::vector<float> row;
  row.resize(d);
  const SlotSpan sp = slot_span(rows, lo, first, visible);
  for (int s = sp.all_lo; s < sp.all_hi; ++s) {
    const float* v = value_row(kv, kvh, s, row.data());
    for (int r = 0; r < rows; ++r) {
      if (s < lo + first[r] || s >= lo + visible[r]) continue;
      const float ps = p[static_cast<size_t>(r) * ldp + (s - lo)];
      float* acc = lanes + (static_cast<size_t>(r) * 16 + (s & 15)) * d;
      for (int j = 0; j < d; ++j) acc[j] = std::fma(ps, v[j], acc[j]);
    }
  }
}

void pv_lanes(const float* p, size_t ldp, int lo, const int* first, const int* visible, int rows,
              const LayerKvView& kv, int kvh, float* lanes) {
#if defined(__AVX512F__)
  if (active_isa() == Isa::kAvx512) {
    count_dispatch(SimdKernel::kAttentionPv, Isa::kAvx512);
    pv_lanes_avx512(p, ldp, lo, first, visible, rows, kv, kvh, lanes);
    return;
  }
#endif
#if defined(KVB_ATTENTION_AVX2)
  if (active_isa() >= Isa::kAvx2) {
    count_dispatch(SimdKernel::kAttentionPv, Isa::kAvx2);
    pv_lanes_avx2(p, ldp, lo, first, visible, rows, kv, kvh, lanes);
    return;
  }
#endif
  count_dispatch(SimdKernel::kAttentionPv, Isa::kPortable);
  pv_lanes_portable(p, ldp, lo, first, visible, rows, kv, kvh, lanes);
}

// Per-thread buffers of run_few_job.
struct FewScratch {
  AlignedScratch qb, sc, lanes, keys;  // keys: a chunk of f16 keys converted
  std::vector<int> first, visible;  // a row's slots relative to the job's lo
  float col[16];
};

// One job of run_few_job: query heads [g0, g1) of KV head kvh's group in call `a`.
struct FewJob {
  const AttentionArgs* a;
  int group, kvh, g0, g1;
};

// Fewer queries than a block (decode steps): each query row as the row path defines it (scores
// in matmul's order, softmax_rows, P x V over the row's visible slots with lanes by slot), for
// the rows of one KV head's query heads [g0, g1) together: one scores matmul over the keys they
// see, P x V reading V once (pv_lanes). Row (g - g0) * n + i is query i of query head g.
void run_few_job(const FewJob& job, FewScratch& t) {
  const AttentionArgs& a = *job.a;
  const LayerKvView& kv = a.kv;
  const int d = kv.head_dim;
  const size_t d16 = round16(d);
  const int n = a.n, group = job.group, kvh = job.kvh, g0 = job.g0, g1 = job.g1;
  const int len = kv.lengths[kvh];
  const int rows = (g1 - g0) * n;
  t.first.resize(rows);
  t.visible.resize(rows);
  int lo = len;
  for (int row = 0; row < rows; ++row) {
    const int visible = len - n + row % n + 1;
    t.first[row] = a.window > 0 ? std::max(0, visible - a.window) : 0;
    t.visible[row] = visible;
    lo = std::min(lo, t.first[row]);
  }
  for (int row = 0; row < rows; ++row) {
    t.first[row] -= lo;
    t.visible[row] -= lo;
  }
  const int span = len - lo;  // slots [lo, len): what the last query sees, and every window
  const size_t lds = round16(span);
  float* qb = t.qb.get(static_cast<size_t>(rows) * d16);
  for (int row = 0; row < rows; ++row) {
    const int h = kvh * group + g0 + row / n, i = row % n;
    std::memcpy(qb + row * d16, a.q + (static_cast<size_t>(i) * a.num_heads + h) * d,
                d * sizeof(float));
  }
  float* sc = t.sc.get(static_cast<size_t>(rows) * lds);
  if (kv.keys16 == nullptr) {
    matmul_strided(sc, lds, qb, d16, kv.key(kvh, lo), d, nullptr, rows, d, span);
  } else if (!scores_f16(sc, lds, qb, d16, kv, kvh, lo, rows, span)) {
    // f16 keys: converted a chunk at a time (it stays in L2), each chunk's scores the same
    // matmul's columns (a score's bits depend only on its query row and its key).
    constexpr int kKeyChunk = 512;
    float* kf = t.keys.get(static_cast<size_t>(kKeyChunk) * d);
    for (int c0 = 0; c0 < span; c0 += kKeyChunk) {
      const int m = std::min(kKeyChunk, span - c0);
      f16_to_f32(kv.key16(kvh, lo + c0), kf, static_cast<size_t>(m) * d);
      matmul_strided(sc + c0, lds, qb, d16, kf, d, nullptr, rows, d, m);
    }
  }
  softmax_rows(sc, sc, lds, rows, t.first.data(), t.visible.data(), a.scale, false, a.fast_exp);
  float* lanes = t.lanes.get(static_cast<size_t>(rows) * 16 * d);
  pv_lanes(sc, lds, lo, t.first.data(), t.visible.data(), rows, kv, kvh, lanes);
  for (int row = 0; row < rows; ++row) {
    const int h = kvh * group + g0 + row / n, i = row % n;
    float* out = a.out + (static_cast<size_t>(i) * a.num_heads + h) * d;
    const float* lr = lanes + static_cast<size_t>(row) * 16 * d;
    for (int j = 0; j < d; ++j) {
      for (int l = 0; l < 16; ++l) t.col[l] = lr[static_cast<size_t>(l) * d + j];
      out[j] = tree16(t.col);
    }
    // Statistics are asked only without a window, where lo == 0.
    const float* p = sc + static_cast<size_t>(row) * lds;
    const int visible = lo + t.visible[row];
    if (a.col_sums) {
      float* cs = a.col_sums + static_cast<size_t>(h) * a.stats_stride;
      for (int s = 0; s < visible; ++s) cs[s] += p[s];
    }
    const int w_index = i - (n - a.last_w);
    if (a.last_probs && w_index >= 0) {
      float* lp = a.last_probs + (static_cast<size_t>(h) * a.last_w + w_index) * a.stats_stride;
      std::memcpy(lp, p, visible * sizeof(float));
    }
  }
}

// Appends the jobs of call `a`: with column sums one query head each (they accumulate over its
// queries in order), otherwise `chunk` query heads of a group each (whole groups read K and V
// once per KV head).
void add_few_jobs(const AttentionArgs& a, int group, int chunk, std::vector<FewJob>* jobs) {
  if (a.col_sums) chunk = 1;
  for (int kvh = 0; kvh < a.kv.num_kv_heads; ++kvh) {
    for (int g0 = 0; g0 < group; g0 += chunk) {
      jobs->push_back({&a, group, kvh, g0, std::min(group, g0 + chunk)});
    }
  }
}

// Runs the jobs on the OpenMP threads; a job's bits do not depend on which thread or with which
// other jobs it runs.
void run_few_jobs(const std::vector<FewJob>& jobs) {
  const int count = static_cast<int>(jobs.size());
#pragma omp parallel if (count > 1)
  {
    FewScratch t;
#pragma omp for schedule(dynamic, 1)
    for (int j = 0; j < count; ++j) run_few_job(jobs[j], t);
  }
}

// Query heads per job: whole groups (K and V of a KV head read once for all its query heads)
// when the calls' KV heads, `heads / group` in all, give every thread a job; otherwise groups
// split into as few parts as give every thread one. (Splitting whenever a thread could take
// several jobs read each KV head's rows once per part: a decode step of SmolLM2 at 2K tokens on
// 2 threads ran 9 single-head jobs, each reading its KV head's K and V, 12% slower than 3 whole
// groups.)
int few_chunk(int heads, int group) {
  const int kv_heads = std::max(1, heads / group);
  const int parts = (omp_get_max_threads() + kv_heads - 1) / kv_heads;  // per KV head
  return std::clamp((group + parts - 1) / parts, 1, group);
}

// Checks a call's arguments and zeroes its statistics; returns its GQA group size.
int prepare(const AttentionArgs& a) {
  const LayerKvView& kv = a.kv;
  KVB_CHECK(a.num_heads % kv.num_kv_heads == 0)
      << "num_heads " << a.num_heads << " not a multiple of num_kv_heads " << kv.num_kv_heads;
  int max_len = 0;
  for (int h = 0; h < kv.num_kv_heads; ++h) {
    KVB_CHECK(kv.lengths[h] >= a.n) << "attention: head " << h << " holds " << kv.lengths[h]
                                    << " slots, fewer than the " << a.n << " queries";
    max_len = std::max(max_len, static_cast<int>(kv.lengths[h]));
  }
  const bool stats = a.col_sums != nullptr || a.last_probs != nullptr;
  KVB_CHECK(a.window >= 0 && (a.window == 0 || !stats))
      << "attention: window " << a.window << " (statistics are not defined under a window)";
  if (stats) {
    KVB_CHECK(a.stats_stride >= max_len) << "attention: stats_stride " << a.stats_stride
                                         << " < longest head " << max_len;
    const size_t rows = static_cast<size_t>(a.num_heads) * a.stats_stride;
    if (a.col_sums && !a.accumulate_col_sums) std::memset(a.col_sums, 0, rows * sizeof(float));
    if (a.last_probs) {
      KVB_CHECK(a.last_w >= 1 && a.last_w <= a.n) << "attention: last_w " << a.last_w
                                                  << " outside [1, " << a.n << "]";
      std::memset(a.last_probs, 0, rows * a.last_w * sizeof(float));
    }
  }
  return a.num_heads / kv.num_kv_heads;
}

}  // namespace

void attention(const AttentionArgs& a) {
  const int group = prepare(a);
  if (a.n >= kBlockedMinQueries) return attention_blocked(a, group);
  std::vector<FewJob> jobs;
  add_few_jobs(a, group, few_chunk(a.num_heads, group), &jobs);
  run_few_jobs(jobs);
}

void attention_batch(std::span<const AttentionArgs> calls) {
  std::vector<FewJob> jobs;
  int heads = 0;
  for (const AttentionArgs& a : calls) heads += a.n < kBlockedMinQueries ? a.num_heads : 0;
  for (const AttentionArgs& a : calls) {
    const int group = prepare(a);
    if (a.n >= kBlockedMinQueries) {
      attention_blocked(a, group);
    } else {
      add_few_jobs(a, group, few_chunk(heads, group), &jobs);
    }
  }
  run_few_jobs(jobs);
}

}  // namespace kvb::kernels::cpu
