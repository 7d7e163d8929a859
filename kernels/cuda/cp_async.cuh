// cp.async (global -> shared copies that do not wait) for the kernels that pipeline K/V tiles
// through shared memory (attention_decode_stream.cu, attention_decode_mma.cu). Needs compute
// capability 8.0; the kernels' plans refuse older devices. Internal to the kernels.
#pragma once

namespace kvb::kernels::cuda {

// 16-byte copy; src_bytes 0 writes zeros (rows past a chunk: a readable address, zeros landed).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes)
               : "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most n of this thread's committed groups are still in flight.
template <int n>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n) : "memory");
#endif
}

}  // namespace kvb::kernels::cuda
