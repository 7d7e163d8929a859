// Products with quantized weights in their ggml blocks (qmatmul.h): the per-type integer dot
// products of one 32-element block, on the portable path (the contract written out) and with AVX2
// integer instructions (unsigned weights x signed activations: maddubs, then madd into eight int32
// lanes), and the fixed float accumulation per output that both share.
#include "kernels/cpu/qmatmul.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#define KVB_QMATMUL_AVX2 1
#endif
// AVX-512 VNNI on 256-bit registers: one vpdpbusd for maddubs + madd (the same exact integers).
#if defined(KVB_QMATMUL_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define KVB_QMATMUL_VNNI 1
#endif
#if defined(KVB_QMATMUL_AVX2) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "common/error.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/ggml_blocks.h"
#include "kernels/cpu/isa.h"

namespace kvb::kernels::cpu {
namespace {

using namespace ggml;

constexpr uint32_t kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14;

// An f16 scale at p (any alignment), widened exactly.
inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(h);  // exact, as fp16_to_f32
#else
  return fp16_to_f32(h);
#endif
}

// The block's (scale, min) pair j of a K-quant's 12 packed bytes.
inline void k_scale_min(const uint8_t* scales, int j, float* sc, float* mn) {
  uint8_t s, m;
  get_scale_min_k4(j, scales, &s, &m);
  *sc = s;
  *mn = m;
}

// One type: where 32-element block b of a row lies, its coefficients (the contract's c and mc,
// shared by every path), its integer sum element by element (portable) and as eight int32 lanes
// whose total, less kOffset x act.sum, is that sum (AVX2).
struct TQ4_0 {
  static constexpr bool kNegMin = false;
  static constexpr int kOffset = 8;
  static constexpr bool kMin = false;
  static const uint8_t* at(const uint8_t* row, int b) { return row + size_t(b) * sizeof(BlockQ4_0); }
  static float wscale(const uint8_t* row, int b, float*) { return f16(at(row, b)); }
  static int isum(const uint8_t* row, int b, const Q8Act& a) {
    const uint8_t* qs = at(row, b) + 2;
    int s = 0;
    for (int l = 0; l < 16; ++l) s += ((qs[l] & 15) - 8) * a.q[l] + ((qs[l] >> 4) - 8) * a.q[l + 16];
    return s;
  }
};
struct TQ4_1 {
  static constexpr bool kNegMin = false;
  static constexpr int kOffset = 0;
  static constexpr bool kMin = true;
  static const uint8_t* at(const uint8_t* row, int b) { return row + size_t(b) * sizeof(BlockQ4_1); }
  static float wscale(const uint8_t* row, int b, float* wmin) {
    *wmin = f16(at(row, b) + 2);
    return f16(at(row, b));
  }
  static int isum(const uint8_t* row, int b, const Q8Act& a) {
    const uint8_t* qs = at(row, b) + 4;
    int s = 0;
    for (int l = 0; l < 16; ++l) s += (qs[l] & 15) * a.q[l] + (qs[l] >> 4) * a.q[l + 16];
    return s;
  }
};
struct TQ5_0 {
  static constexpr bool kNegMin = false;
  static constexpr int kOffset = 16;
  static constexpr bool kMin = false;
  static const uint8_t* at(const uint8_t* row, int b) { return row + size_t(b) * sizeof(BlockQ5_0); }
  static float wscale(const uint8_t* row, int b, float*) { return f16(at(row, b)); }
  static int isum(const uint8_t* row, int b, const Q8Act& a) {
    const uint8_t* w = at(row, b);
    uint32_t qh;
    std::memcpy(&qh, w + 2, 4);
    const uint8_t* qs = w + 6;
    int s = 0;
    for (int l = 0; l < 16; ++l) {
      const int lo = (qs[l] & 15) | static_cast<int>(((qh >> l) & 1) << 4);
      const int hi = (qs[l] >> 4) | static_cast<int>(((qh >> (l + 16)) & 1) << 4);
      s += (lo - 16) * a.q[l] + (hi - 16) * a.q[l + 16];
    }
    return s;
  }
};
struct TQ8_0 {
  static constexpr bool kNegMin = false;
  static constexpr int kOffset = 0;
  static constexpr bool kMin = false;
  static const uint8_t* at(const uint8_t* row, int b) { return row + size_t(b) * sizeof(BlockQ8_0); }
  static float wscale(const uint8_t* row, int b, float*) { return f16(at(row, b)); }
  static int isum(const uint8_t* row, int b, const Q8Act& a) {
    const int8_t* qs = reinterpret_cast<const int8_t*>(at(row, b) + 2);
    int s = 0;
    for (int l = 0; l < 32; ++l) s += qs[l] * a.q[l];
    return s;
  }
};
// Q4_K and Q5_K: block b is sub-block b % 8 of super-block b / 8.
template <bool kFive>
struct TQK45 {
  static constexpr bool kNegMin = true;  // y = d sc q - dmin mn
  static constexpr int kOffset = 0;
  static constexpr bool kMin = true;
  static constexpr size_t kBytes = kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  static const uint8_t* at(const uint8_t* row, int b) { return row + size_t(b / 8) * kBytes; }
  // d x sc and dmin x mn are exact in f32 (11 + 6 significant bits).
  static float wscale(const uint8_t* row, int b, float* wmin) {
    const uint8_t* w = at(row, b);
    float sc, mn;
    k_scale_min(w + 4, b % 8, &sc, &mn);
    *wmin = f16(w + 2) * mn;
    return f16(w) * sc;
  }
  static const uint8_t* qs(const uint8_t* w, int j) { return (kFive ? w + 48 : w + 16) + 32 * (j / 2); }
  static int isum(const uint8_t* row, int b, const Q8Act& a) {
    const uint8_t* w = at(row, b);
    const int j = b % 8;
    const uint8_t* q = qs(w, j);
    const uint8_t* qh = w + 16;
    int s = 0;
    for (int l = 0; l < 32; ++l) {
      int v = j % 2 == 0 ? (q[l] & 15) : (q[l] >> 4);
      if (kFive) v |= ((qh[l] >> j) & 1) << 4;
      s += v * a.q[l];
    }
    return s;
  }
};
struct TQ6_K {
  static constexpr bool kNegMin = false;
  static constexpr int kOffset = 0;
  static constexpr bool kMin = false;
  static const uint8_t* at(const uint8_t* row, int b) { return row + size_t(b / 8) * sizeof(BlockQ6_K); }
  static float wscale(const uint8_t* row, int b, float*) { return f16(at(row, b) + 208); }
  // Block b's two int8 scales, of its first and second 16 elements.
  static const int8_t* scales16(const uint8_t* row, int b) {
    return reinterpret_cast<const int8_t*>(at(row, b) + 192) + 8 * ((b % 8) / 4) + 2 * (b % 4);
  }
  // Block b % 8 = 4h + g: half h of the super-block, group g of its 32-element groups.
  static int isum(const uint8_t* row, int b, const Q8Act& a) {
    const uint8_t* w = at(row, b);
    const int h = (b % 8) / 4, g = b % 4;
    const uint8_t* ql = w + 64 * h + (g % 2 == 1 ? 32 : 0);
    const uint8_t* qh = w + 128 + 32 * h;
    const int8_t* sc = scales16(row, b);
    int half[2] = {0, 0};
    for (int l = 0; l < 32; ++l) {
      const int lo4 = g < 2 ? (ql[l] & 15) : (ql[l] >> 4);
      half[l / 16] += ((lo4 | (((qh[l] >> (2 * g)) & 3) << 4)) - 32) * a.q[l];
    }
    return sc[0] * half[0] + sc[1] * half[1];
  }
};

// The contract's c and mc of block b of a row against activation block a.
template <class T>
inline float coef(const uint8_t* row, int b, const Q8Act& a, float* mc) {
  float wmin = 0;
  const float c = T::wscale(row, b, &wmin) * a.d;
  *mc = T::kNegMin ? -(wmin * a.d) : wmin * a.d;
  return c;
}

// One row's dot product: w points at the row's first block, a at the activation row, nb32 = k/32.
using RowFn = float (*)(const uint8_t* w, const Q8Act* a, int nb32);
// Eight consecutive rows of w (row_bytes apart) against n activation rows: out[i * out_stride +
// r] for row r and activation row i. prefetch: bring the next eight rows into the cache
// meanwhile (rows8_avx2).
// halves: Q6_K's activation half sums (activation_halves), else nullptr.
using Rows8Fn = void (*)(const uint8_t* w, size_t row_bytes, const Q8Act* a, const int32_t* halves,
                         int nb32, int n, float* out, int out_stride, bool prefetch);

// The contract, element by element.
template <class T>
float row_portable(const uint8_t* w, const Q8Act* a, int nb32) {
  float acc = 0;
  for (int b = 0; b < nb32; ++b) {
    float mc = 0;
    const float c = coef<T>(w, b, a[b], &mc);
    acc = std::fma(c, static_cast<float>(T::isum(w, b, a[b])), acc);
    if (T::kMin) acc = std::fma(mc, static_cast<float>(a[b].sum), acc);
  }
  return acc;
}

// ---- AVX2: the same integers from 32 bytes at a time ------------------------------------------
#if defined(KVB_QMATMUL_AVX2)

inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// Lane r = the total of v[r]'s eight lanes.
inline __m256i hsum8_i32(const __m256i* v) {
  const __m256i t0 = _mm256_hadd_epi32(v[0], v[1]), t1 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i t2 = _mm256_hadd_epi32(v[4], v[5]), t3 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                          _mm256_permute2x128_si256(u0, u1, 0x31));
}

// Eight int32 lanes, lane k = sum of bytes 4k..4k+3 of w (unsigned, <= 63) x a (signed): no
// int16 saturation (2 x 63 x 128 < 32767).
// kVnni: the same sums by vpdpbusd (no int16 step at all).
template <bool kVnni>
inline __m256i dot_u8s8(__m256i w, __m256i a) {
#if defined(KVB_QMATMUL_VNNI)
  if (kVnni) return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, a);
#endif
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));
}

inline __m256i load_act(const Q8Act& x) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q));
}

// 16 bytes of nibbles into 32 bytes: low nibbles (elements 0..15), then high (16..31).
inline __m256i nibbles16(const uint8_t* qs) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(15));
}

// Byte i = 0x10 where bit i of x is set, else 0.
inline __m256i bits_to_0x10(uint32_t x) {
  const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                          0x0202020202020202, 0x0303030303030303);
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)), shuf);
  v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  v = _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
  return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

// A block's quants as 32 bytes (unsigned 0..63, or Q8_0's signed), unpacked once and dotted
// with every activation row of a tile.
template <class T>
__m256i unpack(const uint8_t* row, int b);

template <>
__m256i unpack<TQ4_0>(const uint8_t* row, int b) {
  return nibbles16(TQ4_0::at(row, b) + 2);
}
template <>
__m256i unpack<TQ4_1>(const uint8_t* row, int b) {
  return nibbles16(TQ4_1::at(row, b) + 4);
}
template <>
__m256i unpack<TQ5_0>(const uint8_t* row, int b) {
  const uint8_t* w = TQ5_0::at(row, b);
  uint32_t qh;
  std::memcpy(&qh, w + 2, 4);
  return _mm256_or_si256(nibbles16(w + 6), bits_to_0x10(qh));
}
template <>
__m256i unpack<TQ8_0>(const uint8_t* row, int b) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(TQ8_0::at(row, b) + 2));
}
template <bool kFive>
__m256i unpack_qk45(const uint8_t* row, int b) {
  using T = TQK45<kFive>;
  const uint8_t* w = T::at(row, b);
  const int j = b % 8;
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(T::qs(w, j)));
  __m256i q = _mm256_and_si256(j % 2 == 0 ? raw : _mm256_srli_epi16(raw, 4), _mm256_set1_epi8(15));
  if (kFive) {
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16));
    const __m256i hb =
        _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j)), _mm256_set1_epi8(1));
    q = _mm256_or_si256(q, _mm256_slli_epi16(hb, 4));
  }
  return q;
}
template <>
__m256i unpack<TQK45<false>>(const uint8_t* row, int b) {
  return unpack_qk45<false>(row, b);
}
template <>
__m256i unpack<TQK45<true>>(const uint8_t* row, int b) {
  return unpack_qk45<true>(row, b);
}
template <>
__m256i unpack<TQ6_K>(const uint8_t* row, int b) {
  const uint8_t* w = TQ6_K::at(row, b);
  const int h = (b % 8) / 4, g = b % 4;
  const __m256i ql =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64 * h + (g % 2 == 1 ? 32 : 0)));
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 128 + 32 * h));
  const __m256i lo = _mm256_and_si256(g < 2 ? ql : _mm256_srli_epi16(ql, 4), _mm256_set1_epi8(15));
  const __m256i hi =
      _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g)), _mm256_set1_epi8(3));
  return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));  // 0..63
}

// Per block of a row, what its lanes need besides the quants: Q6_K's two scales as a lane
// vector (lanes 0-3: the first 16 elements, 4-7: the second).
template <class T>
__m256i block_extra(const uint8_t*, int) {
  return _mm256_setzero_si256();
}
template <>
__m256i block_extra<TQ6_K>(const uint8_t* row, int b) {
  const int8_t* sc = TQ6_K::scales16(row, b);
  return _mm256_setr_epi32(sc[0], sc[0], sc[0], sc[0], sc[1], sc[1], sc[1], sc[1]);
}

// Eight int32 lanes whose total, less kOffset x act.sum, is the block's isum. act_ones: the
// activation's lanes against all-ones bytes (sum of a per lane; Q6_K's offset of 32).
template <class T, bool kVnni>
struct Lanes {
  static __m256i of(__m256i q, __m256i act, __m256i, __m256i) { return dot_u8s8<kVnni>(q, act); }
};
template <bool kVnni>
struct Lanes<TQ8_0, kVnni> {
  // |q| as unsigned (128 for -128) times a with q's sign: pairs <= 2 x 128 x 127 < 32767.
  static __m256i of(__m256i q, __m256i act, __m256i, __m256i) {
    return dot_u8s8<kVnni>(_mm256_sign_epi8(q, q), _mm256_sign_epi8(act, q));
  }
};
template <bool kVnni>
struct Lanes<TQ6_K, kVnni> {
  // sum (q - 32) a per lane, times that half's scale.
  static __m256i of(__m256i q, __m256i act, __m256i act_ones, __m256i scales) {
    return _mm256_mullo_epi32(
        _mm256_sub_epi32(dot_u8s8<kVnni>(q, act), _mm256_slli_epi32(act_ones, 5)), scales);
  }
};

template <bool kVnni>
inline __m256i ones_lanes(__m256i act) {
  return dot_u8s8<kVnni>(_mm256_set1_epi8(1), act);
}

template <class T, bool kVnni>
float row_avx2(const uint8_t* w, const Q8Act* a, int nb32) {
  float acc = 0;
  for (int b = 0; b < nb32; ++b) {
    float mc = 0;
    const float c = coef<T>(w, b, a[b], &mc);
    const __m256i act = load_act(a[b]);
    const __m256i l = Lanes<T, kVnni>::of(unpack<T>(w, b), act, ones_lanes<kVnni>(act),
                                          block_extra<T>(w, b));
    const int isum = hsum_i32(l) - T::kOffset * a[b].sum;
    acc = std::fma(c, static_cast<float>(isum), acc);
    if (T::kMin) acc = std::fma(mc, static_cast<float>(a[b].sum), acc);
  }
  return acc;
}

// The f16 at p + r * stride for r = 0..7, widened exactly (vcvtph2ps, as f16()).
inline __m256 f16x8(const uint8_t* p, size_t stride) {
  uint16_t v[8];
  for (int r = 0; r < 8; ++r) std::memcpy(&v[r], p + r * stride, 2);
  const __m128i h = _mm_setr_epi16(static_cast<short>(v[0]), static_cast<short>(v[1]), static_cast<short>(v[2]),
                     static_cast<short>(v[3]), static_cast<short>(v[4]), static_cast<short>(v[5]),
                     static_cast<short>(v[6]), static_cast<short>(v[7]));
#if defined(__F16C__)
  return _mm256_cvtph_ps(h);
#else
  alignas(32) float f[8];
  for (int r = 0; r < 8; ++r) f[r] = fp16_to_f32(v[r]);
  return _mm256_load_ps(f);
#endif
}

// out[j] lane r = in[r] lane j (eight floats of eight rows, transposed).
inline void transpose8_ps(const __m256* in, __m256* out);

// The contract's weight scales of block b for eight rows (row_bytes apart) as lanes: ws (d, or
// Q4_K/Q5_K's d x sc) and wm (Q4_1's m, Q4_K/Q5_K's dmin x mn, else 0), the same products as
// T::wscale's, with no scalar step per row and block (a decode step spent more on the K-quants'
// scalar scale unpacking than on its products). The K-quants' eight sub-blocks' scales are
// unpacked once per super-block: each row's 12 packed bytes by 32-bit masks (get_scale_min_k4's
// fields), widened, times that row's d and dmin, then transposed to lanes of rows.
template <class T>
struct Scales8 {
  void at(const uint8_t* w, size_t row_bytes, int b, __m256* ws, __m256* wm) {
    if constexpr (std::is_same_v<T, TQK45<false>> || std::is_same_v<T, TQK45<true>>) {
      if (b / 8 != super) {
        super = b / 8;
        __m256 rs[8], rm[8];
        for (int r = 0; r < 8; ++r) {
          const uint8_t* blk = T::at(w + r * row_bytes, b);
          uint32_t q[3];
          std::memcpy(q, blk + 4, 12);
          const uint32_t lo6 = 0x3f3f3f3f, lo4 = 0x0f0f0f0f, lo2 = 0x03030303;
          // Bytes j = 0..3 then 4..7 of the scales and of the mins.
          const uint64_t sc = (q[0] & lo6) | uint64_t((q[2] & lo4) | (((q[0] >> 6) & lo2) << 4))
                                                 << 32;
          const uint64_t mn =
              (q[1] & lo6) | uint64_t(((q[2] >> 4) & lo4) | (((q[1] >> 6) & lo2) << 4)) << 32;
          const __m256 scf =
              _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(sc))));
          const __m256 mnf =
              _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(mn))));
          rs[r] = _mm256_mul_ps(_mm256_set1_ps(f16(blk)), scf);
          rm[r] = _mm256_mul_ps(_mm256_set1_ps(f16(blk + 2)), mnf);
        }
        transpose8_ps(rs, ks);
        transpose8_ps(rm, km);
      }
      *ws = ks[b % 8];
      *wm = km[b % 8];
    } else if constexpr (std::is_same_v<T, TQ6_K>) {
      if (b / 8 != super) {
        super = b / 8;
        ks[0] = f16x8(T::at(w, b) + 208, row_bytes);
      }
      *ws = ks[0];
      *wm = _mm256_setzero_ps();
    } else {
      const uint8_t* blk = T::at(w, b);
      *ws = f16x8(blk, row_bytes);
      *wm = T::kMin ? f16x8(blk + 2, row_bytes) : _mm256_setzero_ps();
    }
  }
  int super = -1;
  __m256 ks[8] = {}, km[8] = {};
};

// One block of eight rows of w, unpacked: the quants, Q6_K's scale lanes and the scales.
struct Unpacked8 {
  __m256i q[8], extra[8];
  __m256 ws, wm;
};

template <class T>
inline void unpack8(const uint8_t* w, size_t row_bytes, int b, Scales8<T>& scales, Unpacked8* u) {
  for (int r = 0; r < 8; ++r) {
    const uint8_t* row = w + r * row_bytes;
    u->q[r] = unpack<T>(row, b);
    u->extra[r] = block_extra<T>(row, b);
  }
  scales.at(w, row_bytes, b, &u->ws, &u->wm);
}

// The contract's floats for eight rows' block against activation block x, lane r for row r:
// isum less kOffset x act.sum, then fma(c, isum, acc) and, for types with a min,
// fma(mc, act.sum, acc). ws, wm: the rows' weight scales (Scales8).
template <class T>
inline __m256 accumulate(__m256 acc, __m256i isum, const Q8Act& x, __m256 ws, __m256 wm) {
  if (T::kOffset) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(T::kOffset * x.sum));
  const __m256 ad = _mm256_set1_ps(x.d);
  acc = _mm256_fmadd_ps(_mm256_mul_ps(ws, ad), _mm256_cvtepi32_ps(isum), acc);
  if (T::kMin) {
    __m256 mc = _mm256_mul_ps(wm, ad);
    if (T::kNegMin) mc = _mm256_xor_ps(mc, _mm256_set1_ps(-0.0f));
    acc = _mm256_fmadd_ps(mc, _mm256_set1_ps(static_cast<float>(x.sum)), acc);
  }
  return acc;
}

// Block b of eight rows against nx <= kTile activation rows (x rows apart by nb32 blocks), row r
// of activation row i in float lane r of acc[i]: each lane runs row_avx2's sequence of fmas.
constexpr int kTile = 4;
template <class T, bool kVnni>
inline void tile_block(const Unpacked8& u, const Q8Act* a, int nb32, int b, int nx, __m256* acc) {
  __m256i l[8];
  const __m256 wsv = u.ws, wmv = u.wm;
  for (int i = 0; i < nx; ++i) {
    const Q8Act& x = a[static_cast<size_t>(i) * nb32 + b];
    const __m256i act = load_act(x);
    const __m256i ones = ones_lanes<kVnni>(act);
    for (int r = 0; r < 8; ++r) l[r] = Lanes<T, kVnni>::of(u.q[r], act, ones, u.extra[r]);
    __m256i isum = hsum8_i32(l);
    acc[i] = accumulate<T>(acc[i], isum, x, wsv, wmv);
  }
}

// ---- Prefill: eight rows interleaved, no horizontal sums ----------------------------------------
//
// A block of eight rows transposed by 32-bit words: q[j] holds, in lane r, row r's quants 4j to
// 4j + 3. An activation row's word j broadcast against q[j], summed over j = 0..7, leaves row r's
// integer sum of the block in lane r: eight products of eight rows with no horizontal reduction
// (tile_block reduces eight vectors of eight lanes per activation row and block, which cost more
// than the products). The transposition is paid once per call per group and block, and read by
// every activation row.
struct Inter8 {
  __m256i q[8];
  __m256i sc_lo, sc_hi;  // Q6_K: lane r = row r's scale of the block's elements 0-15 / 16-31
  __m256 ws, wm;
};

// out[j] lane r = in[r] word j.
inline void transpose8_epi32(const __m256i* in, __m256i* out) {
  __m256i t[8], u[8];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm256_unpacklo_epi32(in[2 * p], in[2 * p + 1]);
    t[2 * p + 1] = _mm256_unpackhi_epi32(in[2 * p], in[2 * p + 1]);
  }
  for (int p = 0; p < 2; ++p) {
    u[4 * p + 0] = _mm256_unpacklo_epi64(t[4 * p + 0], t[4 * p + 2]);
    u[4 * p + 1] = _mm256_unpackhi_epi64(t[4 * p + 0], t[4 * p + 2]);
    u[4 * p + 2] = _mm256_unpacklo_epi64(t[4 * p + 1], t[4 * p + 3]);
    u[4 * p + 3] = _mm256_unpackhi_epi64(t[4 * p + 1], t[4 * p + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    out[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
    out[j + 4] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
  }
}

inline void transpose8_ps(const __m256* in, __m256* out) {
  __m256i a[8], t[8];
  for (int r = 0; r < 8; ++r) a[r] = _mm256_castps_si256(in[r]);
  transpose8_epi32(a, t);
  for (int j = 0; j < 8; ++j) out[j] = _mm256_castsi256_ps(t[j]);
}

template <class T>
inline void unpack8_interleaved(const uint8_t* w, size_t row_bytes, int b, Scales8<T>& scales,
                                Inter8* u) {
  __m256i rows[8];
  alignas(32) int32_t lo[8] = {}, hi[8] = {};
  scales.at(w, row_bytes, b, &u->ws, &u->wm);
  for (int r = 0; r < 8; ++r) {
    const uint8_t* row = w + r * row_bytes;
    rows[r] = unpack<T>(row, b);
    if constexpr (std::is_same_v<T, TQ6_K>) {
      const int8_t* sc = TQ6_K::scales16(row, b);
      lo[r] = sc[0];
      hi[r] = sc[1];
    }
  }
  transpose8_epi32(rows, u->q);
  u->sc_lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo));
  u->sc_hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi));
}

// acc + the eight lanes' sums of four u8 x s8 products (exact: no int16 saturation, as dot_u8s8).
template <bool kVnni>
inline __m256i dot_acc(__m256i acc, __m256i w, __m256i a) {
#if defined(KVB_QMATMUL_VNNI)
  if (kVnni) return _mm256_dpbusd_epi32(acc, w, a);
#endif
  return _mm256_add_epi32(acc, dot_u8s8<false>(w, a));
}

inline __m256i act_word(const Q8Act& x, int j) {
  int32_t v;
  std::memcpy(&v, x.q + 4 * j, 4);
  return _mm256_set1_epi32(v);
}

// Block b of eight interleaved rows against nx activation rows (x rows nb32 blocks apart;
// halves: Q6_K's per-block sums of the activation's first and second 16 quants, two per block in
// the same order), each lane running row_avx2's sequence of fmas.
template <class T, bool kVnni>
inline void tile_block_interleaved(const Inter8& u, const Q8Act* a, const int32_t* halves, int nb32,
                                   int b, int nx, __m256* acc) {
  __m256i q[8];
  for (int j = 0; j < 8; ++j) q[j] = u.q[j];
  const __m256 wsv = u.ws, wmv = u.wm;
  for (int i = 0; i < nx; ++i) {
    const size_t at = static_cast<size_t>(i) * nb32 + b;
    const Q8Act& x = a[at];
    __m256i isum;
    if constexpr (std::is_same_v<T, TQ6_K>) {
      __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
      for (int j = 0; j < 4; ++j) lo = dot_acc<kVnni>(lo, q[j], act_word(x, j));
      for (int j = 4; j < 8; ++j) hi = dot_acc<kVnni>(hi, q[j], act_word(x, j));
      lo = _mm256_sub_epi32(lo, _mm256_set1_epi32(32 * halves[2 * at]));
      hi = _mm256_sub_epi32(hi, _mm256_set1_epi32(32 * halves[2 * at + 1]));
      isum = _mm256_add_epi32(_mm256_mullo_epi32(lo, u.sc_lo), _mm256_mullo_epi32(hi, u.sc_hi));
    } else if constexpr (std::is_same_v<T, TQ8_0>) {
      isum = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        isum = dot_acc<kVnni>(isum, _mm256_sign_epi8(q[j], q[j]),
                              _mm256_sign_epi8(act_word(x, j), q[j]));
      }
    } else {
      isum = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) isum = dot_acc<kVnni>(isum, q[j], act_word(x, j));
    }
    acc[i] = accumulate<T>(acc[i], isum, x, wsv, wmv);
  }
}

// Activation rows per prefill tile: the eight interleaved quants stay in registers beside one
// accumulator per row (32 vector registers with AVX-512's encodings, 16 without).
#if defined(__AVX512VL__)
constexpr int kInterTile = 8;
#else
constexpr int kInterTile = 4;
#endif

// Eight rows of w against the n activation rows: out[i * out_stride + r]. Up to kTile rows
// (decode) each block is unpacked as it is used and reduced with horizontal sums (tile_block); more
// rows (prefill) unpack and interleave the eight rows' blocks once into a per-thread buffer (k =
// 2048: 24 KiB) that every tile of kInterTile rows reads (tile_block_interleaved). Both give every
// output the contract's sequence of fmas.
//
// prefetch: the next eight rows (the next group a thread takes: groups are contiguous, and so
// are a thread's) into the cache a share per block: eight rows read a block at a time are eight
// streams of a few hundred bytes each, too short for the hardware prefetchers, and a decode step
// (one activation row) waited on memory at every block: decode steps 1.4-1.5x faster on SmolLM2.
// Prefetches never fault, so past the matrix's end they cost nothing.
template <class T, bool kVnni>
void rows8_avx2(const uint8_t* w, size_t row_bytes, const Q8Act* a, const int32_t* halves, int nb32,
                int n, float* out, int out_stride, bool prefetch) {
  const char* next = reinterpret_cast<const char*>(w + 8 * row_bytes);
  const size_t lines = prefetch ? (8 * row_bytes + 63) / 64 : 0;
  auto prefetch_share = [&](int b) {
    for (size_t c = lines * b / nb32; c < lines * (b + 1) / nb32; ++c) {
      _mm_prefetch(next + 64 * c, _MM_HINT_T0);
    }
  };
  if (n <= kTile) {
    __m256 acc[kTile];
    for (int i = 0; i < n; ++i) acc[i] = _mm256_setzero_ps();
    Unpacked8 u;
    Scales8<T> scales;
    for (int b = 0; b < nb32; ++b) {
      prefetch_share(b);
      unpack8<T>(w, row_bytes, b, scales, &u);
      tile_block<T, kVnni>(u, a, nb32, b, n, acc);
    }
    for (int i = 0; i < n; ++i) _mm256_storeu_ps(out + static_cast<size_t>(i) * out_stride, acc[i]);
    return;
  }
  thread_local std::vector<Inter8> blocks;
  blocks.resize(nb32);
  Scales8<T> scales;
  for (int b = 0; b < nb32; ++b) {
    prefetch_share(b);
    unpack8_interleaved<T>(w, row_bytes, b, scales, &blocks[b]);
  }
  __m256 acc[kInterTile];
  for (int i0 = 0; i0 < n; i0 += kInterTile) {
    const int nx = std::min(kInterTile, n - i0);
    for (int i = 0; i < nx; ++i) acc[i] = _mm256_setzero_ps();
    const size_t first = static_cast<size_t>(i0) * nb32;
    const Q8Act* x = a + first;
    const int32_t* hx = halves ? halves + 2 * first : nullptr;
    for (int b = 0; b < nb32; ++b)
      tile_block_interleaved<T, kVnni>(blocks[b], x, hx, nb32, b, nx, acc);
    for (int i = 0; i < nx; ++i) {
      _mm256_storeu_ps(out + static_cast<size_t>(i0 + i) * out_stride, acc[i]);
    }
  }
}

#endif  // KVB_QMATMUL_AVX2

struct TypeKernels {
  uint32_t type;
  RowFn portable;
  RowFn avx2;
  Rows8Fn avx2_rows8;
  RowFn vnni;  // AVX-512 VNNI (the avx512 path), where the build has it
  Rows8Fn vnni_rows8;
};

const TypeKernels* kernels_of(uint32_t type) {
#if defined(KVB_QMATMUL_VNNI)
#define KVB_AVX2(T) row_avx2<T, false>, rows8_avx2<T, false>, row_avx2<T, true>, rows8_avx2<T, true>
#elif defined(KVB_QMATMUL_AVX2)
#define KVB_AVX2(T) row_avx2<T, false>, rows8_avx2<T, false>, nullptr, nullptr
#else
#define KVB_AVX2(T) nullptr, nullptr, nullptr, nullptr
#endif
  static const TypeKernels table[] = {
      {kQ4_0, row_portable<TQ4_0>, KVB_AVX2(TQ4_0)},
      {kQ4_1, row_portable<TQ4_1>, KVB_AVX2(TQ4_1)},
      {kQ5_0, row_portable<TQ5_0>, KVB_AVX2(TQ5_0)},
      {kQ8_0, row_portable<TQ8_0>, KVB_AVX2(TQ8_0)},
      {kQ4_K, row_portable<TQK45<false>>, KVB_AVX2(TQK45<false>)},
      {kQ5_K, row_portable<TQK45<true>>, KVB_AVX2(TQK45<true>)},
      {kQ6_K, row_portable<TQ6_K>, KVB_AVX2(TQ6_K)},
  };
#undef KVB_AVX2
  for (const TypeKernels& t : table) {
    if (t.type == type) return &t;
  }
  return nullptr;
}

Isa isa_of(QPath path) {
  switch (path) {
    case QPath::kAvx512: return Isa::kAvx512;
    case QPath::kAvx2: return Isa::kAvx2;
    case QPath::kPortable: return Isa::kPortable;
    case QPath::kAuto: break;
  }
  return active_isa();
}

// The kernels `path` runs (an error for a path this build or CPU lacks): AVX-512 VNNI where the
// build has it and the path is avx512, else AVX2 for any SIMD path, else portable.
Isa kernels_for(QPath path) {
  KVB_CHECK(qpath_supported(path)) << "the " << qpath_name(path)
                                   << " path of the quantized products is not available here";
  const Isa isa = isa_of(path);
#if defined(KVB_QMATMUL_VNNI)
  if (isa == Isa::kAvx512) return Isa::kAvx512;
#endif
#if defined(KVB_QMATMUL_AVX2)
  if (isa != Isa::kPortable) return Isa::kAvx2;
#endif
  return Isa::kPortable;
}

}  // namespace

bool qmatmul_supports(uint32_t ggml_type) { return kernels_of(ggml_type) != nullptr; }

Isa qpath_kernels(QPath path) { return kernels_for(path); }

const char* qmatmul_type_names() { return "Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K"; }

bool qpath_supported(QPath path) {
  if (path == QPath::kAuto || path == QPath::kPortable) return true;
  const Isa want = isa_of(path);
  if (static_cast<int>(want) > static_cast<int>(active_isa())) return false;
  for (Isa a : available_isas()) {
    if (a == want) return true;
  }
  return false;
}

const char* qpath_name(QPath path) {
  switch (path) {
    case QPath::kAuto: return "auto";
    case QPath::kAvx512: return "avx512";
    case QPath::kAvx2: return "avx2";
    case QPath::kPortable: return "portable";
  }
  return "?";
}

size_t qrow_bytes(uint32_t ggml_type, int k) {
  size_t bytes = 0, elems = 0;
  KVB_CHECK(qmatmul_supports(ggml_type) && ggml_block_info(ggml_type, &bytes, &elems))
      << "the quantized products take " << qmatmul_type_names() << ", not "
      << ggml_type_name(ggml_type);
  KVB_CHECK(k > 0 && static_cast<size_t>(k) % elems == 0)
      << ggml_type_name(ggml_type) << " rows hold a multiple of " << elems << " elements, not " << k;
  return static_cast<size_t>(k) / elems * bytes;
}

namespace {

// One block of 32, element by element: a float max, one division, one multiply and a rounding to
// nearest even per element.
void quantize_block_portable(const float* v, Q8Act& o) {
  float amax = 0;
  for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(v[l]));
  o.d = amax / 127.0f;
  const float id = o.d != 0 ? 1.0f / o.d : 0.0f;
  int sum = 0;
  for (int l = 0; l < 32; ++l) {
    const int q = static_cast<int>(std::nearbyint(v[l] * id));
    o.q[l] = static_cast<int8_t>(std::min(127, std::max(-127, q)));
    sum += o.q[l];
  }
  o.sum = sum;
}

#if defined(KVB_QMATMUL_AVX2)
// The same operations eight at a time: the max is exact in any order, the division and the
// products are IEEE's, and vroundps rounds to nearest even as nearbyint does in the default mode.
void quantize_block_avx2(const float* v, Q8Act& o) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 x[4];
  __m256 m = _mm256_setzero_ps();
  for (int c = 0; c < 4; ++c) {
    x[c] = _mm256_loadu_ps(v + 8 * c);
    m = _mm256_max_ps(_mm256_andnot_ps(sign, x[c]), m);  // a NaN is skipped, as std::max's
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  const float amax = _mm_cvtss_f32(h);
  o.d = amax / 127.0f;
  const __m256 id = _mm256_set1_ps(o.d != 0 ? 1.0f / o.d : 0.0f);
  __m256i q[4];
  for (int c = 0; c < 4; ++c) {
    const __m256 r =
        _mm256_round_ps(_mm256_mul_ps(x[c], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q[c] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(r), _mm256_set1_epi32(-127)),
                            _mm256_set1_epi32(127));
  }
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  o.sum = hsum_i32(s);
  // int32 -> int8 in element order: the packs interleave 128-bit halves, the permute restores.
  const __m256i p16a = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
  const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
  const __m256i ordered =
      _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.q), ordered);
}
#endif

}  // namespace

void quantize_q8_act(const float* x, int n, int k, Q8Act* xq, QPath path) {
  KVB_CHECK(k > 0 && k % 32 == 0) << "quantized activations come in blocks of 32, not " << k;
  KVB_CHECK(qpath_supported(path)) << "the " << qpath_name(path) << " path is not available here";
  const int nb = k / 32;
  const int64_t blocks = static_cast<int64_t>(n) * nb;
#if defined(KVB_QMATMUL_AVX2)
  const bool simd = kernels_for(path) != Isa::kPortable;
#else
  const bool simd = false;
#endif
  // Blocks are independent: any split over threads gives the same bits.
#pragma omp parallel for schedule(static) if (blocks >= 4096)
  for (int64_t i = 0; i < blocks; ++i) {
    const float* v = x + 32 * i;
    Q8Act& o = xq[i];
#if defined(KVB_QMATMUL_AVX2)
    if (simd) {
      quantize_block_avx2(v, o);
      continue;
    }
#endif
    (void)simd;
    quantize_block_portable(v, o);
  }
}

void qmatmul(float* y, const Q8Act* xq, const void* w, uint32_t ggml_type, const float* bias,
             int n, int k, int m, QPath path) {
  const size_t row_bytes = qrow_bytes(ggml_type, k);
  KVB_CHECK(k % 32 == 0 && n >= 0 && m >= 0) << "qmatmul: bad shape n " << n << ", k " << k
                                             << ", m " << m;
  const TypeKernels* t = kernels_of(ggml_type);
  const Isa kernels = kernels_for(path);
  const RowFn row = kernels == Isa::kAvx512 ? t->vnni
                    : kernels == Isa::kAvx2 ? t->avx2
                                            : t->portable;
  const Rows8Fn rows8 = kernels == Isa::kAvx512 ? t->vnni_rows8
                        : kernels == Isa::kAvx2 ? t->avx2_rows8
                                                : nullptr;
  count_dispatch(SimdKernel::kQMatmul, kernels);
  const int nb32 = k / 32;
  const auto* wb = static_cast<const uint8_t*>(w);
  // Groups of eight rows of w (the last group may be shorter), split over threads; each output
  // is its own row's sequence, whatever the group, the path or the thread.
  const int groups = (m + 7) / 8;
  // Q6_K's prefill tiles subtract its offset of 32 per half block: each activation block's sums
  // of its first and second 16 quants, computed once for every group.
  std::vector<int32_t> halves;
  if (rows8 && ggml_type == kQ6_K && n > 4) {  // rows8_avx2's prefill tiles (n > kTile)
    halves.resize(static_cast<size_t>(n) * nb32 * 2);
    for (size_t i = 0; i < static_cast<size_t>(n) * nb32; ++i) {
      int32_t lo = 0, hi = 0;
      for (int l = 0; l < 16; ++l) {
        lo += xq[i].q[l];
        hi += xq[i].q[l + 16];
      }
      halves[2 * i] = lo;
      halves[2 * i + 1] = hi;
    }
  }
  const int32_t* hv = halves.empty() ? nullptr : halves.data();
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(m) * k >= (1 << 16))
  for (int gi = 0; gi < groups; ++gi) {
    const int j0 = gi * 8, rows = std::min(8, m - j0);
    const uint8_t* wr = wb + static_cast<size_t>(j0) * row_bytes;
    float* yr = y + j0;
    if (rows8 && rows == 8) {
      rows8(wr, row_bytes, xq, hv, nb32, n, yr, m, /*prefetch=*/true);
    } else {
      for (int i = 0; i < n; ++i) {
        for (int r = 0; r < rows; ++r) {
          yr[static_cast<size_t>(i) * m + r] = row(wr + r * row_bytes, xq + size_t(i) * nb32, nb32);
        }
      }
    }
    if (bias) {
      for (int i = 0; i < n; ++i) {
        for (int r = 0; r < rows; ++r) yr[static_cast<size_t>(i) * m + r] += bias[j0 + r];
      }
    }
  }
}

}  // namespace kvb::kernels::cpu
