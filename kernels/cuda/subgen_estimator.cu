// SubGen's estimator on the device: logits, then per-slot weights, then z per output dimension
// and tau in the CPU's summation orders (kernels/cpu/subgen_estimator.cc subgen_query; the body
// is subgen_query.cuh's, shared with the engine's batched form).
#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "kernels/cuda/subgen_estimator.h"
#include "kernels/cuda/subgen_query.cuh"

namespace kvb::kernels::cuda {
namespace {

using subgen_detail::kQueryThreads;

__global__ void __launch_bounds__(kQueryThreads)
    subgen_query_kernel(SubgenQueryArgs a, float* logit, double* weight) {
  const SubgenSketchView& sk = a.sketch;
  subgen_detail::QueryIn in;
  in.q = a.q;
  in.out = a.out;
  in.d = a.head_dim;
  in.scale = a.scale;
  in.m_keys = sk.m_keys;
  in.m_values = sk.m_values;
  in.s = sk.s;
  in.mu = sk.mu;
  in.samples = sk.samples;
  in.counts = sk.counts;
  in.clusters = sk.clusters;
  in.t = sk.t;
  in.exact_bias = a.exact_bias;
  in.n_exact = a.n_exact;
  subgen_detail::query_block(in, a.exact_keys, a.exact_values, logit, weight);
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
  subgen_query_kernel<<<1, kQueryThreads, 0, stream>>>(a, logit, weight);
  KVB_CUDA_CHECK_LAUNCH();
}

}  // namespace kvb::kernels::cuda
