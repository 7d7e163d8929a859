// Greedy k-center on the device, one block per problem: each step updates every point's distance
// to its nearest centre (threads over points) and picks the farthest non-centre by a block
// argmax. A batch of independent problems (a layer's heads) runs as one launch, grid = problems.
#include "kernels/cuda/kcenter.h"

#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {

constexpr int kThreads = 1024;

// Squared L2 in double in increasing coordinate order, s = fma(d, d, s): cpu::kcenter's bits
// (its distances fuse every square into the sum on every path: kernels/cpu/kcenter.cc).
__device__ double squared_distance(const float* a, const float* b, int dim) {
  double s = 0;
  for (int i = 0; i < dim; ++i) {
    const double d = __dsub_rn(static_cast<double>(a[i]), static_cast<double>(b[i]));
    s = __fma_rn(d, d, s);
  }
  return s;
}

// Larger distance wins; equal distances: the lower index. -1 is "none".
__device__ bool farther(double da, int a, double db, int b) {
  if (b < 0) return a >= 0;
  if (a < 0) return false;
  return da > db || (da == db && a < b);
}

// Per-point scratch of one problem, [n] each: distance to the nearest centre, that centre,
// the point's rank among the centres (prefix count of centres before it), centre flag.
struct PointScratch {
  double* dist;
  int32_t* nearest;
  int32_t* rank;
  uint8_t* is_centre;
};

// The greedy loop of one problem (args.n >= 1, args.k >= 1), run by the whole block: the only
// copy of it (cpu::kcenter_greedy's algorithm and tie rules); the outputs depend on nothing but
// this problem's inputs.
__device__ void kcenter_block(const KCenterArgs& args, int32_t* centres, int32_t* assignment,
                              int32_t* cluster_sizes, PointScratch s) {
  __shared__ double best_d[kThreads / 32];
  __shared__ int best_i[kThreads / 32];
  __shared__ int chosen;
  const int n = args.n;
  const int m = min(max(args.k, 0), n);  // kcenter_count
  double* dist = s.dist;
  int32_t* nearest = s.nearest;
  int32_t* rank = s.rank;
  uint8_t* is_centre = s.is_centre;
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

// One launch's problems, by value (a kernel argument): block b runs p[b] on the batch scratch's
// entries [first[b], first[b] + p[b].args.n).
struct KCenterBatch {
  KCenterProblem p[kMaxKCenterBatch];
  int64_t first[kMaxKCenterBatch];
};
// The 4 KiB kernel-argument limit every driver accepts (CUDA 12.1+ drivers take 32 KiB on
// Volta and later; not relied on).
static_assert(sizeof(KCenterBatch) + sizeof(PointScratch) <= 4096,
              "kMaxKCenterBatch problems must fit a kernel argument");

__global__ void __launch_bounds__(kThreads)
    kcenter_batch_kernel(KCenterBatch batch, PointScratch all) {
  const KCenterProblem& pr = batch.p[blockIdx.x];
  const int64_t f = batch.first[blockIdx.x];
  const PointScratch s{all.dist + f, all.nearest + f, all.rank + f, all.is_centre + f};
  kcenter_block(pr.args, pr.centres, pr.assignment, pr.cluster_sizes, s);
}

// kcenter_greedy_batch, its messages naming `who`.
int run_batch(std::span<const KCenterProblem> problems, const char* who, cudaStream_t stream) {
  size_t points = 0;
  for (size_t i = 0; i < problems.size(); ++i) {
    const KCenterProblem& p = problems[i];
    const KCenterArgs& a = p.args;
    KVB_CHECK(a.n >= 0 && a.dim >= 0 && a.ld >= a.dim)
        << who << ": problem " << i << " of " << problems.size() << ": n = " << a.n
        << ", dim = " << a.dim << ", ld = " << a.ld;
    if (kcenter_count(a) == 0) continue;
    KVB_CHECK(a.keys != nullptr && p.centres != nullptr)
        << who << ": problem " << i << " of " << problems.size() << " (n = " << a.n
        << ", k = " << a.k << "): null " << (a.keys == nullptr ? "keys" : "centres");
    points += static_cast<size_t>(a.n);
  }
  if (points == 0) return 0;  // every problem chooses no centre: no CUDA call
  // One scratch for the batch, the arrays back to back (doubles first: aligned).
  StreamScratch scratch(points * (sizeof(double) + 2 * sizeof(int32_t) + 1), stream);
  PointScratch all;
  all.dist = scratch.as<double>();
  all.nearest = reinterpret_cast<int32_t*>(all.dist + points);
  all.rank = all.nearest + points;
  all.is_centre = reinterpret_cast<uint8_t*>(all.rank + points);
  KCenterBatch batch;
  int in_batch = 0, launches = 0;
  int64_t first = 0;
  auto launch = [&] {
    kcenter_batch_kernel<<<in_batch, kThreads, 0, stream>>>(batch, all);
    KVB_CUDA_CHECK_LAUNCH();
    ++launches;
    in_batch = 0;
  };
  for (const KCenterProblem& p : problems) {
    if (kcenter_count(p.args) == 0) continue;
    batch.p[in_batch] = p;
    batch.first[in_batch] = first;
    first += p.args.n;
    if (++in_batch == kMaxKCenterBatch) launch();
  }
  if (in_batch > 0) launch();
  return launches;
}

}  // namespace

int kcenter_greedy_batch(std::span<const KCenterProblem> problems, cudaStream_t stream) {
  return run_batch(problems, "cuda::kcenter_greedy_batch", stream);
}

int kcenter_greedy(const KCenterArgs& args, int32_t* centres, int32_t* assignment,
                   int32_t* cluster_sizes, cudaStream_t stream) {
  KCenterProblem p;
  p.args = args;
  p.centres = centres;
  p.assignment = assignment;
  p.cluster_sizes = cluster_sizes;
  run_batch({&p, 1}, "cuda::kcenter_greedy", stream);
  return kcenter_count(args);
}

}  // namespace kvb::kernels::cuda
