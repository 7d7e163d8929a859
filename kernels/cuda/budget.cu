// Ada-KV's global top-k over the heads of a layer on the device (twin of cpu/budget's
// global_topk_counts). Keys: score key << 32 | position mapped to an order-preserving uint32;
// equal keys (same score and position in several heads) go to the lower heads first.
#include "kernels/cuda/budget.h"

#include "kernels/cuda/runtime.h"
#include "kernels/cuda/select_common.cuh"

namespace kvb::kernels::cuda {
namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ uint64_t entry_key(const RaggedScores& s, int h, int j) {
  const size_t at = static_cast<size_t>(h) * s.ld + j;
  const int32_t pos = s.positions ? s.positions[at] : j;
  return (static_cast<uint64_t>(detail::order_key(s.scores[at])) << 32) |
         (static_cast<uint32_t>(pos) ^ 0x80000000u);
}

__global__ void __launch_bounds__(kThreads)
    global_topk_kernel(RaggedScores s, int k, int32_t* counts, int* flag) {
  __shared__ detail::RadixShared radix;
  __shared__ int total, gt, eq;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  int mine = 0;
  bool bad = false;
  for (int h = threadIdx.x; h < s.num_heads; h += blockDim.x) {
    const int len = s.lengths[h];
    bad |= len < 0 || len > s.ld;
    mine += len;
  }
  atomicAdd(&total, mine);
  if (__syncthreads_or(bad)) {
    if (threadIdx.x == 0 && flag != nullptr) atomicOr(flag, 1);
    return;
  }
  const int take = min(k, total);
  if (take <= 0 || take >= total) {
    for (int h = threadIdx.x; h < s.num_heads; h += blockDim.x) {
      counts[h] = take <= 0 ? 0 : s.lengths[h];
    }
    return;
  }
  // Candidate i is entry (i / ld, i % ld), valid below its head's length.
  const int m = s.num_heads * s.ld;
  const uint64_t threshold = detail::block_kth_largest(
      [&](int i, bool* ok) {
        const int h = i / s.ld, j = i % s.ld;
        *ok = j < s.lengths[h];
        return *ok ? entry_key(s, h, j) : 0;
      },
      m, take, radix);
  // Every entry above the k-th is in; the rest of `take` goes to the entries equal to it, lower
  // heads first (the CPU's total order ends with the head). Count all of the first kind before
  // handing out ties, so that a later head's entries above the threshold keep their room.
  if (threadIdx.x == 0) gt = 0;
  __syncthreads();
  int above = 0;
  for (int i = threadIdx.x; i < m; i += blockDim.x) {
    const int h = i / s.ld, j = i % s.ld;
    above += j < s.lengths[h] && entry_key(s, h, j) > threshold ? 1 : 0;
  }
  atomicAdd(&gt, above);
  __syncthreads();
  int ties_left = take - gt;  // block-uniform: every thread computes the same values below
  __syncthreads();            // gt read by all before thread 0 resets it
  for (int h = 0; h < s.num_heads; ++h) {
    if (threadIdx.x == 0) gt = eq = 0;
    __syncthreads();
    int g = 0, e = 0;
    for (int j = threadIdx.x; j < s.lengths[h]; j += blockDim.x) {
      const uint64_t key = entry_key(s, h, j);
      g += key > threshold ? 1 : 0;
      e += key == threshold ? 1 : 0;
    }
    atomicAdd(&gt, g);
    atomicAdd(&eq, e);
    __syncthreads();
    const int from_eq = min(eq, ties_left);
    if (threadIdx.x == 0) counts[h] = gt + from_eq;
    ties_left -= from_eq;
    __syncthreads();  // gt/eq read by all before thread 0 resets them
  }
}

const char* describe(int) { return "a head length is outside [0, ld]"; }

// The host checks of both entry points; false: nothing to do.
bool check_args(const RaggedScores& s, int32_t* counts) {
  KVB_CHECK(s.num_heads >= 0 && s.ld >= 0)
      << "cuda::global_topk_counts: num_heads = " << s.num_heads << ", ld = " << s.ld;
  if (s.num_heads == 0) return false;
  KVB_CHECK(s.lengths != nullptr && counts != nullptr && (s.scores != nullptr || s.ld == 0))
      << "cuda::global_topk_counts: null pointer";
  KVB_CHECK(static_cast<int64_t>(s.num_heads) * s.ld <= INT32_MAX)
      << "cuda::global_topk_counts: " << s.num_heads << " x " << s.ld << " entries";
  return true;
}

}  // namespace

void global_topk_counts(const RaggedScores& s, int k, int32_t* counts, cudaStream_t stream) {
  if (!check_args(s, counts)) return;
  DeviceErrorFlag flag(stream);
  global_topk_kernel<<<1, kThreads, 0, stream>>>(s, k, counts, flag.flag());
  KVB_CUDA_CHECK_LAUNCH();
  flag.check("cuda::global_topk_counts", describe);
}

void global_topk_counts_unchecked(const RaggedScores& s, int k, int32_t* counts,
                                  cudaStream_t stream) {
  if (!check_args(s, counts)) return;
  global_topk_kernel<<<1, kThreads, 0, stream>>>(s, k, counts, nullptr);
  KVB_CUDA_CHECK_LAUNCH();
}

}  // namespace kvb::kernels::cuda
