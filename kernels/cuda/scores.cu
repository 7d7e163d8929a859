// H2O score accumulation on the device: one thread per (KV head, slot), the group's rows in order.
#include "kernels/cuda/scores.h"

#include "kernels/cuda/runtime.h"
#include "kernels/policies/policy.h"

namespace kvb::kernels::cuda {
namespace {

__global__ void accumulate_kernel(float* scores, int ld, const int32_t* lengths,
                                  const float* col_sums, int stride, int group, bool max,
                                  int* flag) {
  const int h = blockIdx.y;
  const int len = lengths[h];
  if (len < 0 || len > ld || len > stride) {
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicOr(flag, 1);
    return;
  }
  const float* rows = col_sums + static_cast<size_t>(h) * group * stride;  // [group, stride]
  for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < len; s += gridDim.x * blockDim.x) {
    float acc = rows[s];
    for (int g = 1; g < group; ++g) {
      const float v = rows[static_cast<size_t>(g) * stride + s];
      acc = max ? (acc < v ? v : acc) : acc + v;  // std::max(acc, v), NaN handling included
    }
    scores[static_cast<size_t>(h) * ld + s] += max ? acc : acc / static_cast<float>(group);
  }
}

const char* describe(int) { return "a head length is outside [0, min(ld, stats_stride)]"; }

}  // namespace

void accumulate_scores(float* scores, int ld, const int32_t* lengths, const float* col_sums,
                       int stats_stride, int num_kv_heads, int group, policies::GqaReduce how,
                       cudaStream_t stream) {
  KVB_CHECK(num_kv_heads >= 0 && group >= 1 && ld >= 0 && stats_stride >= 0)
      << "cuda::accumulate_scores: num_kv_heads = " << num_kv_heads << ", group = " << group
      << ", ld = " << ld << ", stats_stride = " << stats_stride;
  if (num_kv_heads == 0) return;
  KVB_CHECK(scores != nullptr && lengths != nullptr && col_sums != nullptr)
      << "cuda::accumulate_scores: null pointer";
  KVB_CHECK(how == policies::GqaReduce::kMean || how == policies::GqaReduce::kMax)
      << "cuda::accumulate_scores: unknown reduction " << static_cast<int>(how);
  const unsigned blocks_x = grid_for(static_cast<size_t>(ld), 256) > 64u ? 64u : grid_for(ld, 256);
  DeviceErrorFlag flag(stream);
  accumulate_kernel<<<dim3(blocks_x, num_kv_heads), 256, 0, stream>>>(
      scores, ld, lengths, col_sums, stats_stride, group, how == policies::GqaReduce::kMax,
      flag.flag());
  KVB_CUDA_CHECK_LAUNCH();
  flag.check("cuda::accumulate_scores", describe);
}

}  // namespace kvb::kernels::cuda
