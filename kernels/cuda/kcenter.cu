// Greedy k-center on the device, one block: each step updates every point's distance to its
// nearest centre (threads over points) and picks the farthest non-centre by a block argmax.
#include "kernels/cuda/kcenter.h"

#include <algorithm>

#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {

constexpr int kThreads = 1024;

// Squared L2 in double in increasing coordinate order, no FMA: cpu::kcenter's bits.
__device__ double squared_distance(const float* a, const float* b, int dim) {
  double s = 0;
  for (int i = 0; i < dim; ++i) {
    const double d = __dsub_rn(static_cast<double>(a[i]), static_cast<double>(b[i]));
    s = __dadd_rn(s, __dmul_rn(d, d));
  }
  return s;
}

// Larger distance wins; equal distances: the lower index. -1 is "none".
__device__ bool farther(double da, int a, double db, int b) {
  if (b < 0) return a >= 0;
  if (a < 0) return false;
  return da > db || (da == db && a < b);
}

__global__ void __launch_bounds__(kThreads)
    kcenter_kernel(KCenterArgs args, int m, int32_t* centres, double* dist, int32_t* nearest,
                   uint8_t* is_centre, int32_t* rank, int32_t* assignment, int32_t* cluster_sizes) {
  __shared__ double best_d[kThreads / 32];
  __shared__ int best_i[kThreads / 32];
  __shared__ int chosen;
  const int n = args.n;
  auto point = [&](int j) { return args.keys + static_cast<size_t>(j) * args.ld; };
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    dist[j] = squared_distance(point(j), point(0), args.dim);
    nearest[j] = 0;
    is_centre[j] = j == 0;
  }
  __syncthreads();
  for (int c = 1; c < m; ++c) {
    double bd = 0;
    int bi = -1;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      if (!is_centre[j] && farther(dist[j], j, bd, bi)) {
        bd = dist[j];
        bi = j;
      }
    }
    for (int o = 16; o > 0; o /= 2) {
      const double od = __shfl_xor_sync(0xffffffffu, bd, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (farther(od, oi, bd, bi)) {
        bd = od;
        bi = oi;
      }
    }
    if (threadIdx.x % 32 == 0) {
      best_d[threadIdx.x / 32] = bd;
      best_i[threadIdx.x / 32] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double d0 = best_d[0];
      int i0 = best_i[0];
      for (int w = 1; w < kThreads / 32; ++w) {
        if (farther(best_d[w], best_i[w], d0, i0)) {
          d0 = best_d[w];
          i0 = best_i[w];
        }
      }
      chosen = i0;
      is_centre[i0] = 1;
    }
    __syncthreads();
    const int far = chosen;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const double d = squared_distance(point(j), point(far), args.dim);
      if (d < dist[j] || (d == dist[j] && far < nearest[j])) {
        dist[j] = d;
        nearest[j] = far;
      }
    }
    __syncthreads();
  }
  // Centres in increasing index order and each point's centre rank: a serial prefix over the
  // flags (n is at most a head's cache length; this runs once per call).
  if (threadIdx.x == 0) {
    int r = 0;
    for (int j = 0; j < n; ++j) {
      rank[j] = r;
      if (is_centre[j]) centres[r++] = j;
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    if (is_centre[j]) nearest[j] = j;  // a centre belongs to itself
  }
  __syncthreads();
  if (cluster_sizes != nullptr) {
    for (int c = threadIdx.x; c < m; c += blockDim.x) cluster_sizes[c] = 0;
  }
  __syncthreads();
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    if (assignment != nullptr) assignment[j] = nearest[j];
    if (cluster_sizes != nullptr) atomicAdd(&cluster_sizes[rank[nearest[j]]], 1);
  }
}

}  // namespace

int kcenter_greedy(const KCenterArgs& args, int32_t* centres, int32_t* assignment,
                   int32_t* cluster_sizes, cudaStream_t stream) {
  const int n = args.n;
  KVB_CHECK(n >= 0 && args.dim >= 0 && args.ld >= args.dim)
      << "cuda::kcenter_greedy: n = " << n << ", dim = " << args.dim << ", ld = " << args.ld;
  const int m = std::min(std::max(args.k, 0), n);
  if (m == 0) return 0;
  KVB_CHECK(args.keys != nullptr && centres != nullptr) << "cuda::kcenter_greedy: null pointer";
  const size_t np = static_cast<size_t>(n);
  StreamScratch scratch(np * (sizeof(double) + 2 * sizeof(int32_t) + 1), stream);
  double* dist = scratch.as<double>();
  int32_t* nearest = reinterpret_cast<int32_t*>(dist + np);
  int32_t* rank = nearest + np;
  uint8_t* is_centre = reinterpret_cast<uint8_t*>(rank + np);
  kcenter_kernel<<<1, kThreads, 0, stream>>>(args, m, centres, dist, nearest, is_centre, rank,
                                             assignment, cluster_sizes);
  KVB_CUDA_CHECK_LAUNCH();
  return m;
}

}  // namespace kvb::kernels::cuda
