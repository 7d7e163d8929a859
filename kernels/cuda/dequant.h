// Dequantization of ggml block formats to f32, CUDA twin of kernels/cpu/dequant.h (F32, F16,
// BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS).
// Bit-identical to the CPU reference: every product is exact in f32, so only the final +m / -m
// rounds, on both sides.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvb::kernels::cuda {
// src: device bytes [n / block_elems * block_bytes]; dst: device [n] floats. Type and n are
// validated on the host (cpu::ggml_block_info); throws kvb::Error on a bad type or n.
void dequantize(uint32_t type, const void* src, float* dst, size_t n, cudaStream_t stream = 0);
}  // namespace kvb::kernels::cuda
