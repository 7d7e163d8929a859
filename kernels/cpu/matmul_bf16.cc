// matmul_bf16 (matmul_bf16.h): bf16 weights widened to f32 by a 16-bit shift, then matmul's
// summation order (16 lanes of fused multiply-adds in increasing p, the fixed tree). Decode
// (n == 1) runs its own register tiles, picked at run time (AVX-512 1x16, AVX2 1x4, portable:
// the CPU's widest, or the one KVB_ISA forces, isa.h); so do a few rows on AVX-512 (4x4 tiles, 2 <=
// n < 16); otherwise panels of w are widened into per-thread f32 scratch and matmul runs on them,
// whose contract makes each output's bits independent of the panel split. AVX-512 BF16 (vdpbf16ps)
// is not used: it would round x to bf16 and pair the products, so the result would no longer equal
// the f32 reference on the rounded weights; decode streams w from memory, where the shift costs
// nothing.
#include "kernels/cpu/matmul_bf16.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVB_BF16_X86 1
#include <immintrin.h>
#define KVB_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define KVB_TARGET_AVX2 __attribute__((target("avx2,fma")))
#endif

#include "common/error.h"
#include "kernels/cpu/aligned_scratch.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_tree.h"

namespace kvb::kernels::cpu {

void round_to_bf16(const float* src, size_t count, uint16_t* dst) {
  for (size_t i = 0; i < count; ++i) dst[i] = bf16_from_f32(src[i]);
}

namespace {

using detail::kLanes;        // matmul's lane split of k (matmul_tree.h)
using detail::reduce_lanes;  // matmul's fixed tree over the 16 lane sums

// One output of decode, scalar; x: [k] f32, w: [k] bf16.
float dot_portable(const float* x, const uint16_t* w, int k) {
  float a[kLanes] = {};
  for (int p = 0; p < k; ++p) a[p % kLanes] = std::fma(x[p], f32_from_bf16(w[p]), a[p % kLanes]);
  return reduce_lanes(a);
}

// Outputs [j0, j1) of the decode row; x: [k], w: [m, k], out: [j1 - j0].
void decode_portable(const float* x, const uint16_t* w, int k, int j0, int j1, float* out) {
  for (int j = j0; j < j1; ++j) out[j - j0] = dot_portable(x, w + static_cast<size_t>(j) * k, k);
}

#if defined(KVB_BF16_X86)
KVB_TARGET_AVX512 inline __m512 widen16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// GCC 12 warns that _mm512_undefined_ps (inside _mm512_shuffle_f32x4 and _mm512_permutexvar_ps)
// is uninitialized once inlined: a false positive (GCC PR 105593, fixed in GCC 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
using detail::reduce16;  // matmul's tree over 16 lane vectors (matmul_tree.h)

// Outputs [j0, j1) 16 at a time, one zmm of lane sums each (acc[c] is a[c] of reduce16, i.e.
// r = c % 4, column c / 4). Edge tiles repeat the last row and drop its outputs.
KVB_TARGET_AVX512 void decode_avx512(const float* x, const uint16_t* w, int k, int j0, int j1,
                                     float* out) {
  const __mmask16 tail = static_cast<__mmask16>((1u << (k % kLanes)) - 1u);
  const int kfull = k - k % kLanes;
  for (int jt = j0; jt < j1; jt += 16) {
    const uint16_t* wr[16];  // [k] each
    for (int c = 0; c < 16; ++c) wr[c] = w + static_cast<size_t>(std::min(jt + c, j1 - 1)) * k;
    __m512 acc[16];
    for (int c = 0; c < 16; ++c) acc[c] = _mm512_setzero_ps();
    for (int p = 0; p < kfull; p += kLanes) {
      const __m512 xv = _mm512_loadu_ps(x + p);
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c) {
        _mm_prefetch(reinterpret_cast<const char*>(wr[c] + p + static_cast<size_t>(16) * k),
                     _MM_HINT_T0);
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[c] + p));
        acc[c] = _mm512_fmadd_ps(xv, widen16(h), acc[c]);
      }
    }
    if (tail) {  // lanes past k keep their sums (not +0*0: that would turn -0 into +0)
      const __m512 xv = _mm512_maskz_loadu_ps(tail, x + kfull);
      for (int c = 0; c < 16; ++c) {
        const __m256i h = _mm256_maskz_loadu_epi16(tail, wr[c] + kfull);
        acc[c] = _mm512_mask3_fmadd_ps(xv, widen16(h), acc[c], tail);
      }
    }
    // reduce16's position 4 * (c % 4) + c / 4 holds output c.
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512 s = _mm512_permutexvar_ps(idx, reduce16(acc));
    const int cols = std::min(16, j1 - jt);
    _mm512_mask_storeu_ps(out + (jt - j0), static_cast<__mmask16>((1u << cols) - 1u), s);
  }
}
// A few rows (decode of a batch, 2 <= n < 16): rows [0, n) of x times outputs [j0, j1), 4 x 4
// tiles with one zmm per output (acc[r + 4c], reduce16 leaves them [4, 4] row-major); each w
// row is read from memory once and from cache ceil(n / 4) times. Edge tiles repeat the last
// row of x / w and drop those outputs. y: [n, m].
KVB_TARGET_AVX512 void rows_avx512(const float* x, const uint16_t* w, int n, int k, int m, int j0,
                                   int j1, float* y) {
  const __mmask16 tail = static_cast<__mmask16>((1u << (k % kLanes)) - 1u);
  const int kfull = k - k % kLanes;
  for (int i0 = 0; i0 < n; i0 += 4) {
    const float* xr[4];
    for (int r = 0; r < 4; ++r) xr[r] = x + static_cast<size_t>(std::min(i0 + r, n - 1)) * k;
    for (int jt = j0; jt < j1; jt += 4) {
      const uint16_t* wr[4];
      for (int c = 0; c < 4; ++c) wr[c] = w + static_cast<size_t>(std::min(jt + c, j1 - 1)) * k;
      __m512 acc[16];
#pragma GCC unroll 16
      for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
      for (int p = 0; p < kfull; p += kLanes) {
        __m512 wv[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          wv[c] = widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[c] + p)));
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          const __m512 xv = _mm512_loadu_ps(xr[r] + p);
#pragma GCC unroll 4
          for (int c = 0; c < 4; ++c) acc[r + 4 * c] = _mm512_fmadd_ps(xv, wv[c], acc[r + 4 * c]);
        }
      }
      if (tail) {
        __m512 wv[4];
        for (int c = 0; c < 4; ++c) wv[c] = widen16(_mm256_maskz_loadu_epi16(tail, wr[c] + kfull));
        for (int r = 0; r < 4; ++r) {
          const __m512 xv = _mm512_maskz_loadu_ps(tail, xr[r] + kfull);
          for (int c = 0; c < 4; ++c) {
            acc[r + 4 * c] = _mm512_mask3_fmadd_ps(xv, wv[c], acc[r + 4 * c], tail);
          }
        }
      }
      alignas(64) float out[16];  // [4, 4] row-major
      _mm512_store_ps(out, reduce16(acc));
      const int rows = std::min(4, n - i0), cols = std::min(4, j1 - jt);
      for (int r = 0; r < rows; ++r) {
        std::memcpy(y + static_cast<size_t>(i0 + r) * m + jt, out + 4 * r, cols * sizeof(float));
      }
    }
  }
}
#pragma GCC diagnostic pop

KVB_TARGET_AVX2 inline __m256 widen8(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Outputs [j0, j1) 4 at a time, two ymm (lanes 0..7, 8..15) per output.
KVB_TARGET_AVX2 void decode_avx2(const float* x, const uint16_t* w, int k, int j0, int j1,
                                 float* out) {
  constexpr int C = 4;
  const int kfull = k - k % kLanes;
  alignas(32) float xt[kLanes] = {};        // x's tail, zero past k
  alignas(32) uint16_t wt[C][kLanes] = {};  // w rows' tails
  std::memcpy(xt, x + kfull, (k - kfull) * sizeof(float));
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int jt = j0; jt < j1; jt += C) {
    const uint16_t* wr[C];
    for (int c = 0; c < C; ++c) wr[c] = w + static_cast<size_t>(std::min(jt + c, j1 - 1)) * k;
    __m256 acc[2][C];
    for (int c = 0; c < C; ++c) acc[0][c] = acc[1][c] = _mm256_setzero_ps();
    for (int p = 0; p < kfull; p += kLanes) {
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256 xv = _mm256_loadu_ps(x + p + 8 * h);
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
          const __m128i wh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr[c] + p + 8 * h));
          acc[h][c] = _mm256_fmadd_ps(xv, widen8(wh), acc[h][c]);
        }
      }
    }
    if (kfull < k) {
      for (int c = 0; c < C; ++c) std::memcpy(wt[c], wr[c] + kfull, (k - kfull) * sizeof(uint16_t));
      for (int h = 0; h < 2; ++h) {
        const __m256 live =
            _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(k - kfull - 8 * h), lane));
        const __m256 xv = _mm256_load_ps(xt + 8 * h);
        for (int c = 0; c < C; ++c) {
          const __m128i wh = _mm_load_si128(reinterpret_cast<const __m128i*>(wt[c] + 8 * h));
          acc[h][c] = _mm256_blendv_ps(acc[h][c], _mm256_fmadd_ps(xv, widen8(wh), acc[h][c]), live);
        }
      }
    }
    const int cols = std::min(C, j1 - jt);
    for (int c = 0; c < cols; ++c) {
      alignas(32) float lanes[kLanes];
      _mm256_store_ps(lanes, acc[0][c]);
      _mm256_store_ps(lanes + 8, acc[1][c]);
      out[jt - j0 + c] = reduce_lanes(lanes);
    }
  }
}
#endif  // KVB_BF16_X86

Bf16Path resolve(Bf16Path path) {
  if (path == Bf16Path::kAuto) return bf16_auto_path();
  KVB_CHECK(bf16_path_supported(path))
      << "matmul_bf16: path " << bf16_path_name(path) << " is not supported on this CPU"
      << (isa_forced() ? std::string(" under KVB_ISA=") + isa_name(active_isa()) : "");
  return path;
}

using Scratch = AlignedScratch;  // aligned_scratch.h

void decode(float* y, const float* x, const uint16_t* w, const float* bias, int k, int m,
            Bf16Path path) {
  // Chunks of 64 outputs (a multiple of every tile's width) spread over the threads.
  constexpr int kChunk = 64;
  const int chunks = (m + kChunk - 1) / kChunk;
  const bool parallel = chunks > 1 && 2.0 * k * m >= 1.0e5 && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (parallel)
  for (int ch = 0; ch < chunks; ++ch) {
    const int j0 = ch * kChunk, j1 = std::min(m, j0 + kChunk);
    switch (path) {
#if defined(KVB_BF16_X86)
      case Bf16Path::kAvx512:
        decode_avx512(x, w, k, j0, j1, y + j0);
        break;
      case Bf16Path::kAvx2:
        decode_avx2(x, w, k, j0, j1, y + j0);
        break;
#endif
      default:
        decode_portable(x, w, k, j0, j1, y + j0);
        break;
    }
    if (bias != nullptr) {
      for (int j = j0; j < j1; ++j) y[j] += bias[j];
    }
  }
}

#if defined(KVB_BF16_X86)
// 2 <= n < 16 on AVX-512: rows_avx512 over chunks of 64 outputs spread over the threads.
void few_rows_avx512(float* y, const float* x, const uint16_t* w, const float* bias, int n, int k,
                     int m) {
  constexpr int kChunk = 64;
  const int chunks = (m + kChunk - 1) / kChunk;
  const bool parallel =
      chunks > 1 && 2.0 * n * static_cast<double>(k) * m >= 1.0e5 && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (parallel)
  for (int ch = 0; ch < chunks; ++ch) {
    const int j0 = ch * kChunk, j1 = std::min(m, j0 + kChunk);
    rows_avx512(x, w, n, k, m, j0, j1, y);
    if (bias != nullptr) {
      for (int i = 0; i < n; ++i) {
        for (int j = j0; j < j1; ++j) y[static_cast<size_t>(i) * m + j] += bias[j];
      }
    }
  }
}
#endif

// n > 1: panels of `panel` rows of w widened into f32 scratch, each multiplied by all of x with
// matmul (one thread per panel; matmul runs serially inside the parallel region).
void batched(float* y, const float* x, const uint16_t* w, const float* bias, int n, int k, int m) {
  // matmul's own panel width (64 rows of w, while a panel stays <= 1 MiB of f32 in L2), so that x
  // streams past w as often as on the f32 path.
  const int panel = std::max(16, std::min(64, (262144 / std::max(k, 1)) / 16 * 16));
  const int panels = (m + panel - 1) / panel;
  const bool parallel =
      panels > 1 && 2.0 * n * static_cast<double>(k) * m >= 1.0e5 && !omp_in_parallel();
  // x once in a 64-byte aligned copy when matmul would otherwise copy its row blocks for every
  // panel (matmul packs an operand that is misaligned or whose k is not a multiple of 16).
  thread_local Scratch x_buf;
  const float* xa = x;
  if (k % kLanes == 0 && reinterpret_cast<uintptr_t>(x) % 64 != 0) {
    float* copy = x_buf.get(static_cast<size_t>(n) * k);
    std::memcpy(copy, x, static_cast<size_t>(n) * k * sizeof(float));
    xa = copy;
  }
#pragma omp parallel if (parallel)
  {
    thread_local Scratch w_buf, y_buf;
#pragma omp for schedule(static)
    for (int pi = 0; pi < panels; ++pi) {
      const int j0 = pi * panel, cols = std::min(panel, m - j0);
      float* wf = w_buf.get(static_cast<size_t>(cols) * k);  // [cols, k]
      const uint16_t* src = w + static_cast<size_t>(j0) * k;
      for (size_t i = 0; i < static_cast<size_t>(cols) * k; ++i) wf[i] = f32_from_bf16(src[i]);
      float* yp = y_buf.get(static_cast<size_t>(n) * cols);  // [n, cols]
      matmul(yp, xa, wf, bias != nullptr ? bias + j0 : nullptr, n, k, cols);
      for (int i = 0; i < n; ++i) {
        std::memcpy(y + static_cast<size_t>(i) * m + j0, yp + static_cast<size_t>(i) * cols,
                    cols * sizeof(float));
      }
    }
  }
}

}  // namespace

bool bf16_path_supported(Bf16Path path) {
  // A forced KVB_ISA allows no path wider than itself (a run as on a CPU without the rest).
  const auto allowed = [](Isa isa) { return !isa_forced() || active_isa() >= isa; };
  switch (path) {
    case Bf16Path::kAuto:
    case Bf16Path::kPortable:
      return true;
#if defined(KVB_BF16_X86)
    case Bf16Path::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && allowed(Isa::kAvx512);
    case Bf16Path::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && allowed(Isa::kAvx2);
#endif
    default:
      return false;
  }
}

Bf16Path bf16_auto_path() {
  static const Bf16Path best = bf16_path_supported(Bf16Path::kAvx512) ? Bf16Path::kAvx512
                               : bf16_path_supported(Bf16Path::kAvx2) ? Bf16Path::kAvx2
                                                                      : Bf16Path::kPortable;
  return best;
}

const char* bf16_path_name(Bf16Path path) {
  switch (path) {
    case Bf16Path::kAuto:
      return "auto";
    case Bf16Path::kAvx512:
      return "avx512";
    case Bf16Path::kAvx2:
      return "avx2";
    case Bf16Path::kPortable:
      return "portable";
  }
  return "?";
}

void matmul_bf16(float* y, const float* x, const uint16_t* w, const float* bias, int n, int k,
                 int m, Bf16Path path) {
  KVB_CHECK(n >= 0 && k >= 0 && m >= 0)
      << "matmul_bf16: bad shape n=" << n << " k=" << k << " m=" << m;
  KVB_CHECK(n == 0 || m == 0 || (y != nullptr && (k == 0 || (x != nullptr && w != nullptr))))
      << "matmul_bf16: null pointer";
  const Bf16Path p = resolve(path);
  if (n == 0 || m == 0) return;
  if (n == 1) {
    count_dispatch(SimdKernel::kMatmulBf16, p == Bf16Path::kAvx512 ? Isa::kAvx512
                                            : p == Bf16Path::kAvx2 ? Isa::kAvx2
                                                                   : Isa::kPortable);
    decode(y, x, w, bias, k, m, p);
#if defined(KVB_BF16_X86)
  } else if (n < 16 && p == Bf16Path::kAvx512) {
    count_dispatch(SimdKernel::kMatmulBf16, Isa::kAvx512);
    few_rows_avx512(y, x, w, bias, n, k, m);
#endif
  } else {
    batched(y, x, w, bias, n, k, m);
  }
}

}  // namespace kvb::kernels::cpu
