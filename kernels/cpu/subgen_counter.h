// SubGen's counter-based coins (kernels/cpu/subgen_estimator.h), in a header that both the CPU
// reference and its CUDA twins compile: one definition, so the device draws the host's bits.
// Under nvcc the functions are __host__ __device__; for the host compiler they are plain inline
// functions (integer arithmetic and one exact conversion: no rounding choice to differ).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KVB_HOST_DEVICE __host__ __device__
#else
#define KVB_HOST_DEVICE
#endif

namespace kvb::kernels::cpu {

// splitmix64's finalizer (Steele, Lea, Flood 2014): a bijective 64-bit mix.
KVB_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A uniform double in [0, 1) that depends only on the counter (seed, layer, head, step, slot):
// no generator state, so any draw can be made in any order, on any thread or device, and give the
// same bits. 53 random mantissa bits (the conversion and the scaling by 2^-53 are exact).
KVB_HOST_DEVICE inline double counter_uniform(uint64_t seed, uint32_t layer, uint32_t head,
                                              uint64_t step, uint64_t slot) {
  uint64_t h = mix64(seed);
  h = mix64(h ^ ((static_cast<uint64_t>(layer) << 32) | head));
  h = mix64(h ^ step);
  h = mix64(h ^ slot);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

}  // namespace kvb::kernels::cpu
