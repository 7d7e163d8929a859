// Deterministic top-k / argmin on the device (twin of cpu/select): one block per row; the k-th
// largest rank key by radix select, then the keys at or above it in index order.
#include "kernels/cuda/select.h"

#include <algorithm>

#include "kernels/cuda/runtime.h"
#include "kernels/cuda/select_common.cuh"

namespace kvb::kernels::cuda {
namespace {

using detail::rank_key;

constexpr int kThreads = 512;

// Row r: candidates are indices [begin, end) (end = lengths[r] when lengths != nullptr) with
// eligible[i] != 0 (nullable: all); k = k_rows[r] or k_all. Writes the selection to
// out + r * out_ld and its size to counts[r] (nullable).
struct TopkParams {
  const float* scores;
  int ld;
  const int32_t* lengths;
  int begin, end;
  const uint8_t* eligible;
  const int32_t* k_rows;
  int k_all;
  int32_t* out;
  int out_ld;
  int32_t* counts;
};

__global__ void __launch_bounds__(kThreads) topk_kernel(TopkParams p) {
  __shared__ detail::RadixShared radix;
  __shared__ detail::ScanShared scan;
  __shared__ int valid_total;
  const int r = blockIdx.x;
  const float* row = p.scores + static_cast<size_t>(r) * p.ld;
  const int begin = p.begin, end = p.lengths ? p.lengths[r] : p.end, m = end - begin;
  const int k = p.k_rows ? p.k_rows[r] : p.k_all;
  int32_t* out = p.out + static_cast<size_t>(r) * p.out_ld;
  auto eligible = [&](int i) { return p.eligible == nullptr || p.eligible[begin + i] != 0; };
  int valid = m;
  if (p.eligible != nullptr) {
    if (threadIdx.x == 0) valid_total = 0;
    __syncthreads();
    int mine = 0;
    for (int i = threadIdx.x; i < m; i += blockDim.x) mine += eligible(i) ? 1 : 0;
    atomicAdd(&valid_total, mine);
    __syncthreads();
    valid = valid_total;
  }
  const int take = max(0, min(k, valid));
  if (take == 0) {
    if (p.counts && threadIdx.x == 0) p.counts[r] = 0;
    return;
  }
  // take == valid: everything eligible; otherwise keys at or above the take-th largest.
  uint64_t threshold = 0;
  if (take < valid) {
    threshold = detail::block_kth_largest(
        [&](int i, bool* ok) {
          *ok = eligible(i);
          return rank_key(row[begin + i], begin + i);
        },
        m, take, radix);
  }
  const int written = detail::block_ordered_compact(
      [&](int i) { return eligible(i) && rank_key(row[begin + i], begin + i) >= threshold; }, m,
      begin, out, scan);
  if (p.counts && threadIdx.x == 0) p.counts[r] = written;
}

__global__ void check_lengths_kernel(const int32_t* lengths, int rows, int ld, int* flag) {
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
    if (lengths[r] < 0 || lengths[r] > ld) atomicOr(flag, 1);
  }
}

const char* describe_lengths(int) { return "a row length is outside [0, ld]"; }

// One block per row: the minimum rank key among eligible j < n_row; out[r] its index or -1.
__global__ void __launch_bounds__(kThreads)
    argmin_kernel(const float* scores, int ld, const int32_t* n_rows, int n_all,
                  const uint8_t* eligible, int32_t* out) {
  __shared__ unsigned long long best[kThreads / 32];
  const int r = blockIdx.x;
  const float* row = scores + static_cast<size_t>(r) * ld;
  const int n = n_rows ? min(n_rows[r], ld) : n_all;
  unsigned long long mine = ~0ull;  // no candidate; a real key never has all bits set
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    if (eligible != nullptr && !eligible[i]) continue;
    mine = min(mine, static_cast<unsigned long long>(rank_key(row[i], i)));
  }
  for (int o = 16; o > 0; o /= 2) mine = min(mine, __shfl_xor_sync(0xffffffffu, mine, o));
  if (threadIdx.x % 32 == 0) best[threadIdx.x / 32] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long b = best[0];
    for (int w = 1; w < kThreads / 32; ++w) b = min(b, best[w]);
    out[r] = b == ~0ull ? -1 : static_cast<int32_t>(b & 0xffffffffu);
  }
}

void run_topk(const TopkParams& p, int rows, cudaStream_t stream) {
  topk_kernel<<<rows, kThreads, 0, stream>>>(p);
  KVB_CUDA_CHECK_LAUNCH();
}

int topk_one(const float* scores, const uint8_t* eligible, int begin, int end, int k, int32_t* out,
             cudaStream_t stream) {
  const int m = end - begin;
  if (k <= 0 || m == 0) return 0;
  KVB_CHECK(scores != nullptr && out != nullptr) << "cuda::select_topk: null pointer";
  if (eligible == nullptr) {
    run_topk({scores, 0, nullptr, begin, end, nullptr, nullptr, k, out, 0, nullptr}, 1, stream);
    return std::min(k, m);
  }
  StreamScratch count(sizeof(int32_t), stream);
  run_topk({scores, 0, nullptr, begin, end, eligible, nullptr, k, out, 0, count.as<int32_t>()}, 1,
           stream);
  int32_t written = 0;
  KVB_CUDA_CHECK(cudaMemcpyAsync(&written, count.as<int32_t>(), sizeof written,
                                 cudaMemcpyDeviceToHost, stream));
  KVB_CUDA_CHECK(cudaStreamSynchronize(stream));
  return written;
}

}  // namespace

int select_topk(const float* scores, int n, int k, int32_t* out, cudaStream_t stream) {
  KVB_CHECK(n >= 0) << "cuda::select_topk: n = " << n;
  return topk_one(scores, nullptr, 0, n, k, out, stream);
}

int select_topk_range(const float* scores, int begin, int end, int k, int32_t* out,
                      cudaStream_t stream) {
  KVB_CHECK(0 <= begin && begin <= end)
      << "cuda::select_topk_range: [" << begin << ", " << end << ")";
  return topk_one(scores, nullptr, begin, end, k, out, stream);
}

int select_topk_masked(const float* scores, const uint8_t* eligible, int n, int k, int32_t* out,
                       cudaStream_t stream) {
  KVB_CHECK(n >= 0) << "cuda::select_topk_masked: n = " << n;
  return topk_one(scores, eligible, 0, n, k, out, stream);
}

void select_topk_rows(const float* scores, int rows, int ld, const int32_t* lengths,
                      const int32_t* k, int32_t* out, int32_t* counts, cudaStream_t stream) {
  KVB_CHECK(rows >= 0 && ld >= 0) << "cuda::select_topk_rows: rows = " << rows << ", ld = " << ld;
  if (rows == 0) return;
  KVB_CHECK(lengths != nullptr && k != nullptr && out != nullptr && counts != nullptr &&
            (scores != nullptr || ld == 0))
      << "cuda::select_topk_rows: null pointer";
  DeviceErrorFlag flag(stream);
  check_lengths_kernel<<<grid_for(rows, 256), 256, 0, stream>>>(lengths, rows, ld, flag.flag());
  KVB_CUDA_CHECK_LAUNCH();
  flag.check("cuda::select_topk_rows", describe_lengths);
  run_topk({scores, ld, lengths, 0, 0, nullptr, k, 0, out, ld, counts}, rows, stream);
}

int select_argmin(const float* scores, const uint8_t* eligible, int n, cudaStream_t stream) {
  KVB_CHECK(n >= 0) << "cuda::select_argmin: n = " << n;
  if (n == 0) return -1;
  KVB_CHECK(scores != nullptr) << "cuda::select_argmin: null scores";
  StreamScratch result(sizeof(int32_t), stream);
  argmin_kernel<<<1, kThreads, 0, stream>>>(scores, 0, nullptr, n, eligible, result.as<int32_t>());
  KVB_CUDA_CHECK_LAUNCH();
  int32_t index = -1;
  KVB_CUDA_CHECK(
      cudaMemcpyAsync(&index, result.as<int32_t>(), sizeof index, cudaMemcpyDeviceToHost, stream));
  KVB_CUDA_CHECK(cudaStreamSynchronize(stream));
  return index;
}

void select_argmin_rows(const float* scores, int rows, int ld, const int32_t* n, int32_t* out,
                        cudaStream_t stream) {
  KVB_CHECK(rows >= 0 && ld >= 0) << "cuda::select_argmin_rows: rows = " << rows << ", ld = " << ld;
  if (rows == 0) return;
  KVB_CHECK(n != nullptr && out != nullptr && (scores != nullptr || ld == 0))
      << "cuda::select_argmin_rows: null pointer";
  argmin_kernel<<<rows, kThreads, 0, stream>>>(scores, ld, n, 0, nullptr, out);
  KVB_CUDA_CHECK_LAUNCH();
}

}  // namespace kvb::kernels::cuda
