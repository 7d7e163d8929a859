// Policy scoring on the device, one thread per (KV head, slot), the group's rows in order: H2O's
// accumulated attention and Scissorhands' below-threshold history bits.
#include <algorithm>

#include "kernels/cuda/runtime.h"
#include "kernels/cuda/scores.h"

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

// Grid (ceil(max_len / 256), num_kv_heads): one thread per slot of one KV head.
__global__ void history_bits_kernel(HistoryBitsArgs a, int group) {
  const int h = blockIdx.y, s = blockIdx.x * blockDim.x + threadIdx.x;
  const int len = a.kv.lengths[h];
  if (s >= len) return;
  const int before = len - a.n_new, unrecorded = a.n_new - a.last_w;
  const uint64_t window = a.history == 64 ? ~uint64_t{0} : (uint64_t{1} << a.history) - 1;
  uint64_t b = s < before ? a.bits[static_cast<size_t>(h) * a.ld + s] : 0;
  b = unrecorded >= a.history ? 0 : (b << unrecorded) & window;
  const int32_t* pos = a.kv.positions + a.kv.offsets[h];
  for (int j = 0; j < a.last_w; ++j) {
    const int i = unrecorded + j, visible = before + i + 1;
    uint64_t below = 0;
    if (s < visible) {
      const float* rows = a.last_probs + (static_cast<size_t>(h) * group * a.last_w + j) * a.stride;
      float acc = rows[s];  // cpu::reduce_gqa, kMean
      for (int g = 1; g < group; ++g)
        acc = acc + rows[static_cast<size_t>(g) * a.last_w * a.stride + s];
      const float p = acc / static_cast<float>(group);
      const float threshold =
          1.0f / static_cast<float>(a.inv_position ? pos[before + i] + 1 : visible);
      below = p < threshold ? 1 : 0;
    }
    b = ((b << 1) | below) & window;
  }
  a.bits[static_cast<size_t>(h) * a.ld + s] = b;
}

}  // namespace

void accumulate_scores(float* scores, int ld, const int32_t* lengths, const float* col_sums,
                       int stats_stride, int num_kv_heads, int group, cpu::GqaReduce how,
                       cudaStream_t stream) {
  KVB_CHECK(num_kv_heads >= 0 && group >= 1 && ld >= 0 && stats_stride >= 0)
      << "cuda::accumulate_scores: num_kv_heads = " << num_kv_heads << ", group = " << group
      << ", ld = " << ld << ", stats_stride = " << stats_stride;
  if (num_kv_heads == 0) return;
  KVB_CHECK(scores != nullptr && lengths != nullptr && col_sums != nullptr)
      << "cuda::accumulate_scores: null pointer";
  KVB_CHECK(how == cpu::GqaReduce::kMean || how == cpu::GqaReduce::kMax)
      << "cuda::accumulate_scores: unknown reduction " << static_cast<int>(how);
  const unsigned blocks_x = grid_for(static_cast<size_t>(ld), 256) > 64u ? 64u : grid_for(ld, 256);
  DeviceErrorFlag flag(stream);
  accumulate_kernel<<<dim3(blocks_x, num_kv_heads), 256, 0, stream>>>(
      scores, ld, lengths, col_sums, stats_stride, group, how == cpu::GqaReduce::kMax,
      flag.flag());
  KVB_CUDA_CHECK_LAUNCH();
  flag.check("cuda::accumulate_scores", describe);
}

void scissorhands_update_bits(const HistoryBitsArgs& a, cudaStream_t stream) {
  const DeviceLayerKvView& kv = a.kv;
  KVB_CHECK(kv.num_kv_heads > 0 && a.num_heads > 0 && a.num_heads % kv.num_kv_heads == 0)
      << "cuda::scissorhands_update_bits: num_heads " << a.num_heads << ", num_kv_heads "
      << kv.num_kv_heads;
  KVB_CHECK(a.history >= 1 && a.history <= 64)
      << "cuda::scissorhands_update_bits: history " << a.history << " outside [1, 64]";
  KVB_CHECK(a.n_new >= 1 && a.last_w >= 1 && a.last_w <= a.n_new)
      << "cuda::scissorhands_update_bits: last_w " << a.last_w << ", n_new " << a.n_new;
  KVB_CHECK(a.bits != nullptr && a.last_probs != nullptr && kv.positions != nullptr &&
            kv.host_lengths != nullptr)
      << "cuda::scissorhands_update_bits: null pointer";
  int max_len = 0;
  for (int h = 0; h < kv.num_kv_heads; ++h) {
    const int len = kv.host_lengths[h];
    KVB_CHECK(len >= a.n_new && len <= a.ld && len <= a.stride)
        << "cuda::scissorhands_update_bits: head " << h << " length " << len << " (n_new "
        << a.n_new << ", ld " << a.ld << ", stride " << a.stride << ")";
    max_len = std::max(max_len, len);
  }
  history_bits_kernel<<<dim3((max_len + 255) / 256, kv.num_kv_heads), 256, 0, stream>>>(
      a, a.num_heads / kv.num_kv_heads);
  KVB_CUDA_CHECK_LAUNCH();
}

}  // namespace kvb::kernels::cuda
