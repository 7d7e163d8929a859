// SubGen's estimator on the device: logits, then per-slot weights, then z per output dimension
// and tau in the CPU's summation orders (kernels/cpu/subgen_estimator.cc subgen_query).
#include "kernels/cuda/subgen_estimator.h"

#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// cpu::dot (kernels/cpu/vec.h): 8 interleaved partial sums, then ((0+4)+(1+5))+((2+6)+(3+7)).
// The lane updates are FMAs: GCC contracts cpu::dot's `acc += a * b` on FMA hardware (it does
// with -march=native on x86-64; a build without FMA would round the product first).
__device__ float dot8(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
#pragma unroll
    for (int l = 0; l < 8; ++l) acc[l] = fmaf(a[i + l], b[i + l], acc[l]);
  }
  for (int l = 0; i < n; ++i, ++l) acc[l] = fmaf(a[i], b[i], acc[l]);
  return __fadd_rn(__fadd_rn(__fadd_rn(acc[0], acc[4]), __fadd_rn(acc[1], acc[5])),
                   __fadd_rn(__fadd_rn(acc[2], acc[6]), __fadd_rn(acc[3], acc[7])));
}

__global__ void __launch_bounds__(kThreads)
    subgen_query_kernel(SubgenQueryArgs a, float* logit, double* weight) {
  const SubgenSketchView& sk = a.sketch;
  const int d = a.head_dim, n_samples = sk.clusters * sk.t;
  const int total = sk.s + n_samples + a.n_exact;
  __shared__ float part[kThreads];
  __shared__ double tau_shared;
  // Logits: M's slots, the cluster samples, the exact tokens (with their bias).
  float mine = -INFINITY;
  for (int j = threadIdx.x; j < total; j += kThreads) {
    float l;
    if (j < sk.s) {
      l = __fmul_rn(dot8(a.q, sk.m_keys + static_cast<size_t>(j) * d, d), a.scale);
    } else if (j < sk.s + n_samples) {
      l = __fmul_rn(dot8(a.q, sk.samples + static_cast<size_t>(j - sk.s) * d, d), a.scale);
    } else {
      const int e = j - sk.s - n_samples;
      l = __fmul_rn(dot8(a.q, a.exact_keys + static_cast<size_t>(e) * d, d), a.scale);
      if (a.exact_bias) l = __fadd_rn(l, a.exact_bias[e]);
    }
    logit[j] = l;
    mine = mine < l ? l : mine;  // std::max(c, l): a NaN logit never becomes the shift
  }
  part[threadIdx.x] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    float c = -INFINITY;
    for (int t = 0; t < kThreads; ++t) c = c < part[t] ? part[t] : c;
    part[0] = c;
  }
  __syncthreads();
  const double c = part[0];
  // Per-slot factors: M's weight mu / (s |v|^2) e^{l - c} (0 for a zero value), else e^{l - c}.
  for (int j = threadIdx.x; j < total; j += kThreads) {
    const double e = exp(static_cast<double>(logit[j]) - c);
    if (j < sk.s) {
      const float* v = sk.m_values + static_cast<size_t>(j) * d;
      double sq = 0;
      for (int x = 0; x < d; ++x) sq = __dadd_rn(sq, __dmul_rn(v[x], static_cast<double>(v[x])));
      weight[j] = sq > 0 ? __dmul_rn(sk.mu / (static_cast<double>(sk.s) * sq), e) : 0.0;
    } else {
      weight[j] = e;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double tau = 0;
    for (int i = 0; i < sk.clusters; ++i) {
      double sum = 0;
      for (int j = 0; j < sk.t; ++j) sum += weight[sk.s + i * sk.t + j];
      tau = __dadd_rn(tau, __dmul_rn(static_cast<double>(sk.counts[i]) / sk.t, sum));
    }
    for (int j = 0; j < a.n_exact; ++j) tau += weight[sk.s + n_samples + j];
    tau_shared = tau;
  }
  __syncthreads();
  const double tau = tau_shared;
  const bool zero = !(tau > 0) || isinf(tau);
  for (int x = threadIdx.x; x < d; x += kThreads) {
    if (zero) {
      a.out[x] = 0.0f;
      continue;
    }
    double z = 0;
    for (int j = 0; j < sk.s; ++j) {  // a zero value's weight is 0 and adds exactly 0
      const double v = sk.m_values[static_cast<size_t>(j) * d + x];
      z = __dadd_rn(z, __dmul_rn(weight[j], v));
    }
    for (int j = 0; j < a.n_exact; ++j) {
      const double v = a.exact_values[static_cast<size_t>(j) * d + x];
      z = __dadd_rn(z, __dmul_rn(weight[sk.s + n_samples + j], v));
    }
    a.out[x] = static_cast<float>(z / tau);
  }
}

}  // namespace

void subgen_query(const SubgenQueryArgs& a, cudaStream_t stream) {
  const SubgenSketchView& sk = a.sketch;
  KVB_CHECK(a.head_dim > 0 && sk.s >= 0 && sk.clusters >= 0 && a.n_exact >= 0)
      << "cuda::subgen_query: head_dim = " << a.head_dim << ", s = " << sk.s
      << ", clusters = " << sk.clusters << ", n_exact = " << a.n_exact;
  KVB_CHECK(sk.clusters == 0 || sk.t >= 1) << "cuda::subgen_query: t = " << sk.t;
  KVB_CHECK(a.q != nullptr && a.out != nullptr) << "cuda::subgen_query: null q or out";
  KVB_CHECK(sk.s == 0 || (sk.m_keys != nullptr && sk.m_values != nullptr))
      << "cuda::subgen_query: reservoir without arrays";
  KVB_CHECK(sk.clusters == 0 || (sk.samples != nullptr && sk.counts != nullptr))
      << "cuda::subgen_query: clusters without arrays";
  KVB_CHECK(a.n_exact == 0 || (a.exact_keys != nullptr && a.exact_values != nullptr))
      << "cuda::subgen_query: exact tokens without arrays";
  const int64_t total =
      static_cast<int64_t>(sk.s) + static_cast<int64_t>(sk.clusters) * sk.t + a.n_exact;
  KVB_CHECK(total <= INT32_MAX) << "cuda::subgen_query: " << total << " logits";
  StreamScratch scratch(static_cast<size_t>(total) * (sizeof(double) + sizeof(float)) + 8, stream);
  double* weight = scratch.as<double>();
  float* logit = reinterpret_cast<float*>(weight + total);
  subgen_query_kernel<<<1, kThreads, 0, stream>>>(a, logit, weight);
  KVB_CUDA_CHECK_LAUNCH();
}

}  // namespace kvb::kernels::cuda
