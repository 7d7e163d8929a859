// Products with quantized weights in their ggml blocks (qmatmul.h): the per-type integer dot
// products of one 32-element block, on the portable path (the contract written out) and with AVX2
// integer instructions (unsigned weights x signed activations: maddubs, then madd into eight int32
// lanes), and the fixed float accumulation per output that both share.
#include "kernels/cpu/qmatmul.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#define KVB_QMATMUL_AVX2 1
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

float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_f32(h);
}

// The block's (scale, min) pair j of a K-quant's 12 packed bytes.
void k_scale_min(const uint8_t* scales, int j, int* sc, int* mn) {
  uint8_t s, m;
  get_scale_min_k4(j, scales, &s, &m);
  *sc = s;
  *mn = m;
}

// ---- portable: the contract's integer sums, element by element -------------------------------

// One row's dot product: w points at the row's first block, a at the activation row, nb32 = k/32.
using RowFn = float (*)(const uint8_t* w, const Q8Act* a, int nb32);

float row_q4_0_portable(const uint8_t* w, const Q8Act* a, int nb32) {
  float acc = 0;
  for (int b = 0; b < nb32; ++b, w += sizeof(BlockQ4_0)) {
    const uint8_t* qs = w + 2;
    int isum = 0;
    for (int l = 0; l < 16; ++l) {
      isum += ((qs[l] & 15) - 8) * a[b].q[l] + ((qs[l] >> 4) - 8) * a[b].q[l + 16];
    }
    acc = std::fma(f16(w) * a[b].d, static_cast<float>(isum), acc);
  }
  return acc;
}

float row_q4_1_portable(const uint8_t* w, const Q8Act* a, int nb32) {
  float acc = 0;
  for (int b = 0; b < nb32; ++b, w += sizeof(BlockQ4_1)) {
    const uint8_t* qs = w + 4;
    int isum = 0;
    for (int l = 0; l < 16; ++l) isum += (qs[l] & 15) * a[b].q[l] + (qs[l] >> 4) * a[b].q[l + 16];
    acc = std::fma(f16(w) * a[b].d, static_cast<float>(isum), acc);
    acc = std::fma(f16(w + 2) * a[b].d, static_cast<float>(a[b].sum), acc);
  }
  return acc;
}

float row_q5_0_portable(const uint8_t* w, const Q8Act* a, int nb32) {
  float acc = 0;
  for (int b = 0; b < nb32; ++b, w += sizeof(BlockQ5_0)) {
    uint32_t qh;
    std::memcpy(&qh, w + 2, 4);
    const uint8_t* qs = w + 6;
    int isum = 0;
    for (int l = 0; l < 16; ++l) {
      const int lo = (qs[l] & 15) | static_cast<int>(((qh >> l) & 1) << 4);
      const int hi = (qs[l] >> 4) | static_cast<int>(((qh >> (l + 16)) & 1) << 4);
      isum += (lo - 16) * a[b].q[l] + (hi - 16) * a[b].q[l + 16];
    }
    acc = std::fma(f16(w) * a[b].d, static_cast<float>(isum), acc);
  }
  return acc;
}

float row_q8_0_portable(const uint8_t* w, const Q8Act* a, int nb32) {
  float acc = 0;
  for (int b = 0; b < nb32; ++b, w += sizeof(BlockQ8_0)) {
    const int8_t* qs = reinterpret_cast<const int8_t*>(w + 2);
    int isum = 0;
    for (int l = 0; l < 32; ++l) isum += qs[l] * a[b].q[l];
    acc = std::fma(f16(w) * a[b].d, static_cast<float>(isum), acc);
  }
  return acc;
}

// Q4_K and Q5_K: sub-block j (32 elements) of a super-block; `high` is Q5_K's qh or nullptr.
template <bool kFive>
float row_qk45_portable(const uint8_t* w, const Q8Act* a, int nb32) {
  constexpr size_t kBytes = kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  float acc = 0;
  for (int sb = 0; sb < nb32 / 8; ++sb, w += kBytes) {
    const float d = f16(w), dmin = f16(w + 2);
    const uint8_t* scales = w + 4;
    const uint8_t* qh = kFive ? w + 16 : nullptr;
    const uint8_t* qs = kFive ? w + 48 : w + 16;
    for (int j = 0; j < 8; ++j) {
      const Q8Act& x = a[sb * 8 + j];
      const uint8_t* q = qs + 32 * (j / 2);
      int isum = 0;
      for (int l = 0; l < 32; ++l) {
        int v = j % 2 == 0 ? (q[l] & 15) : (q[l] >> 4);
        if (kFive) v |= ((qh[l] >> j) & 1) << 4;
        isum += v * x.q[l];
      }
      int sc, mn;
      k_scale_min(scales, j, &sc, &mn);
      acc = std::fma(d * static_cast<float>(sc) * x.d, static_cast<float>(isum), acc);
      acc = std::fma(-(dmin * static_cast<float>(mn) * x.d), static_cast<float>(x.sum), acc);
    }
  }
  return acc;
}

float row_q6_k_portable(const uint8_t* w, const Q8Act* a, int nb32) {
  float acc = 0;
  for (int sb = 0; sb < nb32 / 8; ++sb, w += sizeof(BlockQ6_K)) {
    const float d = f16(w + 208);
    const int8_t* scales = reinterpret_cast<const int8_t*>(w + 192);
    for (int j = 0; j < 8; ++j) {
      const Q8Act& x = a[sb * 8 + j];
      const int h = j / 4, g = j % 4;
      const uint8_t* ql = w + 64 * h + (g % 2 == 1 ? 32 : 0);
      const uint8_t* qh = w + 128 + 32 * h;
      const int8_t* sc = scales + 8 * h + 2 * g;
      int half[2] = {0, 0};
      for (int l = 0; l < 32; ++l) {
        const int lo4 = g < 2 ? (ql[l] & 15) : (ql[l] >> 4);
        const int v = (lo4 | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
        half[l / 16] += v * x.q[l];
      }
      const int isum = sc[0] * half[0] + sc[1] * half[1];
      acc = std::fma(d * x.d, static_cast<float>(isum), acc);
    }
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

// Eight int32 lanes, lane k = sum of bytes 4k..4k+3 of w (unsigned, <= 63) x a (signed): no
// int16 saturation (2 x 63 x 128 < 32767).
inline __m256i dot_u8s8(__m256i w, __m256i a) {
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

float row_q4_0_avx2(const uint8_t* w, const Q8Act* a, int nb32) {
  float acc = 0;
  for (int b = 0; b < nb32; ++b, w += sizeof(BlockQ4_0)) {
    const int isum = hsum_i32(dot_u8s8(nibbles16(w + 2), load_act(a[b]))) - 8 * a[b].sum;
    acc = std::fma(f16(w) * a[b].d, static_cast<float>(isum), acc);
  }
  return acc;
}

float row_q4_1_avx2(const uint8_t* w, const Q8Act* a, int nb32) {
  float acc = 0;
  for (int b = 0; b < nb32; ++b, w += sizeof(BlockQ4_1)) {
    const int isum = hsum_i32(dot_u8s8(nibbles16(w + 4), load_act(a[b])));
    acc = std::fma(f16(w) * a[b].d, static_cast<float>(isum), acc);
    acc = std::fma(f16(w + 2) * a[b].d, static_cast<float>(a[b].sum), acc);
  }
  return acc;
}

float row_q5_0_avx2(const uint8_t* w, const Q8Act* a, int nb32) {
  float acc = 0;
  for (int b = 0; b < nb32; ++b, w += sizeof(BlockQ5_0)) {
    uint32_t qh;
    std::memcpy(&qh, w + 2, 4);
    const __m256i q = _mm256_or_si256(nibbles16(w + 6), bits_to_0x10(qh));
    const int isum = hsum_i32(dot_u8s8(q, load_act(a[b]))) - 16 * a[b].sum;
    acc = std::fma(f16(w) * a[b].d, static_cast<float>(isum), acc);
  }
  return acc;
}

float row_q8_0_avx2(const uint8_t* w, const Q8Act* a, int nb32) {
  float acc = 0;
  for (int b = 0; b < nb32; ++b, w += sizeof(BlockQ8_0)) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2));
    // |q| as unsigned (128 for -128) times a with q's sign: pairs <= 2 x 128 x 127 < 32767.
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(load_act(a[b]), q));
    const int isum = hsum_i32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
    acc = std::fma(f16(w) * a[b].d, static_cast<float>(isum), acc);
  }
  return acc;
}

template <bool kFive>
float row_qk45_avx2(const uint8_t* w, const Q8Act* a, int nb32) {
  constexpr size_t kBytes = kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  const __m256i low4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
  float acc = 0;
  for (int sb = 0; sb < nb32 / 8; ++sb, w += kBytes) {
    const float d = f16(w), dmin = f16(w + 2);
    const uint8_t* scales = w + 4;
    const uint8_t* qs = kFive ? w + 48 : w + 16;
    __m256i qh = _mm256_setzero_si256();
    if (kFive) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16));
    for (int j = 0; j < 8; ++j) {
      const Q8Act& x = a[sb * 8 + j];
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (j / 2)));
      __m256i q = _mm256_and_si256(j % 2 == 0 ? raw : _mm256_srli_epi16(raw, 4), low4);
      if (kFive) {
        const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j)), one);
        q = _mm256_or_si256(q, _mm256_slli_epi16(hb, 4));
      }
      const int isum = hsum_i32(dot_u8s8(q, load_act(x)));
      int sc, mn;
      k_scale_min(scales, j, &sc, &mn);
      acc = std::fma(d * static_cast<float>(sc) * x.d, static_cast<float>(isum), acc);
      acc = std::fma(-(dmin * static_cast<float>(mn) * x.d), static_cast<float>(x.sum), acc);
    }
  }
  return acc;
}

float row_q6_k_avx2(const uint8_t* w, const Q8Act* a, int nb32) {
  const __m256i low4 = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3), ones = _mm256_set1_epi8(1);
  float acc = 0;
  for (int sb = 0; sb < nb32 / 8; ++sb, w += sizeof(BlockQ6_K)) {
    const float d = f16(w + 208);
    const int8_t* scales = reinterpret_cast<const int8_t*>(w + 192);
    for (int j = 0; j < 8; ++j) {
      const Q8Act& x = a[sb * 8 + j];
      const int h = j / 4, g = j % 4;
      const __m256i ql = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(w + 64 * h + (g % 2 == 1 ? 32 : 0)));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 128 + 32 * h));
      const __m256i lo = _mm256_and_si256(g < 2 ? ql : _mm256_srli_epi16(ql, 4), low4);
      const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g)), three);
      const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));  // 0..63
      const __m256i act = load_act(x);
      // Lanes 0-3 cover elements 0..15, lanes 4-7 elements 16..31: sum (q - 32) a per lane.
      const __m256i lanes = _mm256_sub_epi32(dot_u8s8(q, act),
                                             _mm256_slli_epi32(dot_u8s8(ones, act), 5));
      const int8_t* sc = scales + 8 * h + 2 * g;
      const __m256i scv = _mm256_setr_epi32(sc[0], sc[0], sc[0], sc[0], sc[1], sc[1], sc[1], sc[1]);
      const int isum = hsum_i32(_mm256_mullo_epi32(lanes, scv));
      acc = std::fma(d * x.d, static_cast<float>(isum), acc);
    }
  }
  return acc;
}

#endif  // KVB_QMATMUL_AVX2

struct TypeKernels {
  uint32_t type;
  RowFn portable;
  RowFn avx2;
};

const TypeKernels* kernels_of(uint32_t type) {
#if defined(KVB_QMATMUL_AVX2)
#define KVB_AVX2(f) f
#else
#define KVB_AVX2(f) nullptr
#endif
  static const TypeKernels table[] = {
      {kQ4_0, row_q4_0_portable, KVB_AVX2(row_q4_0_avx2)},
      {kQ4_1, row_q4_1_portable, KVB_AVX2(row_q4_1_avx2)},
      {kQ5_0, row_q5_0_portable, KVB_AVX2(row_q5_0_avx2)},
      {kQ8_0, row_q8_0_portable, KVB_AVX2(row_q8_0_avx2)},
      {kQ4_K, row_qk45_portable<false>, KVB_AVX2(row_qk45_avx2<false>)},
      {kQ5_K, row_qk45_portable<true>, KVB_AVX2(row_qk45_avx2<true>)},
      {kQ6_K, row_q6_k_portable, KVB_AVX2(row_q6_k_avx2)},
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

// Whether `path` runs the AVX2 kernels (an error for a path this build or CPU lacks).
bool use_avx2(QPath path) {
  KVB_CHECK(qpath_supported(path)) << "the " << qpath_name(path)
                                   << " path of the quantized products is not available here";
#if defined(KVB_QMATMUL_AVX2)
  return isa_of(path) != Isa::kPortable;
#else
  return false;
#endif
}

}  // namespace

bool qmatmul_supports(uint32_t ggml_type) { return kernels_of(ggml_type) != nullptr; }

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

void quantize_q8_act(const float* x, int n, int k, Q8Act* xq, QPath path) {
  KVB_CHECK(k > 0 && k % 32 == 0) << "quantized activations come in blocks of 32, not " << k;
  KVB_CHECK(qpath_supported(path)) << "the " << qpath_name(path) << " path is not available here";
  // One loop for every path: a float max, one division, one multiply and a rounding per element
  // are the same bits in any instruction set.
  const int nb = k / 32;
  for (int i = 0; i < n; ++i) {
    for (int b = 0; b < nb; ++b) {
      const float* v = x + static_cast<size_t>(i) * k + 32 * b;
      Q8Act& o = xq[static_cast<size_t>(i) * nb + b];
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
  }
}

void qmatmul(float* y, const Q8Act* xq, const void* w, uint32_t ggml_type, const float* bias,
             int n, int k, int m, QPath path) {
  const size_t row_bytes = qrow_bytes(ggml_type, k);
  KVB_CHECK(k % 32 == 0 && n >= 0 && m >= 0) << "qmatmul: bad shape n " << n << ", k " << k
                                             << ", m " << m;
  const TypeKernels* t = kernels_of(ggml_type);
  const bool avx2 = use_avx2(path);
  const RowFn row = avx2 ? t->avx2 : t->portable;
  count_dispatch(SimdKernel::kQMatmul, avx2 ? Isa::kAvx2 : Isa::kPortable);
  const int nb32 = k / 32;
  const auto* wb = static_cast<const uint8_t*>(w);
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(m) * k >= (1 << 16))
  for (int j = 0; j < m; ++j) {
    const uint8_t* wr = wb + static_cast<size_t>(j) * row_bytes;
    for (int i = 0; i < n; ++i) {
      const float v = row(wr, xq + static_cast<size_t>(i) * nb32, nb32);
      y[static_cast<size_t>(i) * m + j] = bias ? v + bias[j] : v;
    }
  }
}

}  // namespace kvb::kernels::cpu
