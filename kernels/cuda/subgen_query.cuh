// The body of SubGen's query estimator on the device, shared by cuda::subgen_query (one query,
// a host-described sketch; subgen_estimator.cu) and the engine's batched form over a layer's
// device sketches and cache rows (cuda::subgen_query_heads; subgen_sketch.cu), so that both
// compute the same arithmetic and the parity cases of the first cover the second.
#pragma once

#include <cstdint>

#include "kernels/cuda/kv_elem.cuh"

namespace kvb::kernels::cuda::subgen_detail {

constexpr int kQueryThreads = 256;

// cpu::dot (kernels/cpu/vec.h): 8 interleaved partial sums, then ((0+4)+(1+5))+((2+6)+(3+7)).
// The lane updates are FMAs: GCC contracts cpu::dot's `acc += a * b` on FMA hardware (it does
// with -march=native on x86-64; a build without FMA would round the product first). b widens
// from the cache's element type exactly (kv_load), as the host rows the CPU reads are widened.
template <typename T>
__device__ float dot8(const float* a, const T* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
#pragma unroll
    for (int l = 0; l < 8; ++l) acc[l] = fmaf(a[i + l], kv_load(b + i + l), acc[l]);
  }
  for (int l = 0; i < n; ++i, ++l) acc[l] = fmaf(a[i], kv_load(b + i), acc[l]);
  return __fadd_rn(__fadd_rn(__fadd_rn(acc[0], acc[4]), __fadd_rn(acc[1], acc[5])),
                   __fadd_rn(__fadd_rn(acc[2], acc[6]), __fadd_rn(acc[3], acc[7])));
}

// One query against one sketch plus exact tokens (the rows of T: float, or the bf16 cache's).
struct QueryIn {
  const float* q = nullptr;  // [d]
  float* out = nullptr;      // [d]
  int d = 0;
  float scale = 0;
  const float* m_keys = nullptr;    // [s, d]
  const float* m_values = nullptr;  // [s, d]
  int s = 0;
  double mu = 0;
  const float* samples = nullptr;   // [clusters, t, d]
  const int64_t* counts = nullptr;  // [clusters]
  int clusters = 0;
  int t = 0;
  const float* exact_bias = nullptr;  // [n_exact], nullable
  int n_exact = 0;
};

// The CPU formula in the CPU's order (cpu::subgen_query): logits in f32, then per-slot weights
// (mu / (s |v|^2) e^{l - c} for M, e^{l - c} otherwise), tau summed serially, z per output
// dimension over the slots in order. Run by a whole block of kQueryThreads threads; logit and
// weight: this block's scratch of s + clusters * t + n_exact entries each.
template <typename T>
__device__ void query_block(const QueryIn& a, const T* exact_keys, const T* exact_values,
                            float* logit, double* weight) {
  const int d = a.d, n_samples = a.clusters * a.t;
  const int total = a.s + n_samples + a.n_exact;
  __shared__ float part[kQueryThreads];
  __shared__ double tau_shared;
  // Logits: M's slots, the cluster samples, the exact tokens (with their bias).
  float mine = -INFINITY;
  for (int j = threadIdx.x; j < total; j += kQueryThreads) {
    float l;
    if (j < a.s) {
      l = __fmul_rn(dot8(a.q, a.m_keys + static_cast<size_t>(j) * d, d), a.scale);
    } else if (j < a.s + n_samples) {
      l = __fmul_rn(dot8(a.q, a.samples + static_cast<size_t>(j - a.s) * d, d), a.scale);
    } else {
      const int e = j - a.s - n_samples;
      l = __fmul_rn(dot8(a.q, exact_keys + static_cast<size_t>(e) * d, d), a.scale);
      if (a.exact_bias) l = __fadd_rn(l, a.exact_bias[e]);
    }
    logit[j] = l;
    mine = mine < l ? l : mine;  // std::max(c, l): a NaN logit never becomes the shift
  }
  part[threadIdx.x] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    float c = -INFINITY;
    for (int t = 0; t < kQueryThreads; ++t) c = c < part[t] ? part[t] : c;
    part[0] = c;
  }
  __syncthreads();
  const double c = part[0];
  // Per-slot factors: M's weight mu / (s |v|^2) e^{l - c} (0 for a zero value), else e^{l - c}.
  for (int j = threadIdx.x; j < total; j += kQueryThreads) {
    const double e = exp(static_cast<double>(logit[j]) - c);
    if (j < a.s) {
      const float* v = a.m_values + static_cast<size_t>(j) * d;
      double sq = 0;
      for (int x = 0; x < d; ++x) sq = __dadd_rn(sq, __dmul_rn(v[x], static_cast<double>(v[x])));
      weight[j] = sq > 0 ? __dmul_rn(a.mu / (static_cast<double>(a.s) * sq), e) : 0.0;
    } else {
      weight[j] = e;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double tau = 0;
    for (int i = 0; i < a.clusters; ++i) {
      double sum = 0;
      for (int j = 0; j < a.t; ++j) sum += weight[a.s + i * a.t + j];
      tau = __dadd_rn(tau, __dmul_rn(static_cast<double>(a.counts[i]) / a.t, sum));
    }
    for (int j = 0; j < a.n_exact; ++j) tau += weight[a.s + n_samples + j];
    tau_shared = tau;
  }
  __syncthreads();
  const double tau = tau_shared;
  const bool zero = !(tau > 0) || isinf(tau);
  for (int x = threadIdx.x; x < d; x += kQueryThreads) {
    if (zero) {
      a.out[x] = 0.0f;
      continue;
    }
    double z = 0;
    for (int j = 0; j < a.s; ++j) {  // a zero value's weight is 0 and adds exactly 0
      const double v = a.m_values[static_cast<size_t>(j) * d + x];
      z = __dadd_rn(z, __dmul_rn(weight[j], v));
    }
    for (int j = 0; j < a.n_exact; ++j) {
      const double v = kv_load(exact_values + static_cast<size_t>(j) * d + x);
      z = __dadd_rn(z, __dmul_rn(weight[a.s + n_samples + j], v));
    }
    a.out[x] = static_cast<float>(z / tau);
  }
  // The scratch and the shared arrays are reused by the caller's next query.
  __syncthreads();
}

}  // namespace kvb::kernels::cuda::subgen_detail
