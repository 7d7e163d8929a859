// Dequantization of ggml block formats to f32 (CPU reference; the CUDA twin shares the signature).
// Block layouts follow ggml-quants.c / ggml-common.h: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL (32
// elements per block), Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS (256-element super-blocks), plus F16
// and BF16. Not supported: Q8_1 and Q8_K (ggml's dot-product intermediates, which published GGUFs
// do not contain) and the grid-based IQ1/IQ2/IQ3 types.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvb::kernels::cpu {

// Bytes per block and elements per block of a ggml type id; returns false for unsupported types.
bool ggml_block_info(uint32_t type, size_t* block_bytes, size_t* block_elems);

// Name of a ggml type id ("Q4_K"; ids of ggml types we cannot dequantize still get their name),
// or "unknown" for ids ggml does not define. kvb::formats::ggml_type_name forwards here.
const char* ggml_type_name(uint32_t type);

// Comma-separated names of the types dequantize() accepts, for error messages.
const char* supported_type_names();

// Dequantizes n elements (a multiple of the block size) of type `type` from src to dst.
// src: [n / block_elems * block_bytes] bytes; dst: [n] floats. Throws kvb::Error on bad type/n.
// Results are bit-identical to ggml's dequantize_row_* (and to gguf-py's numpy dequantize): all
// products are exact in f32. Large inputs are split over OpenMP threads by blocks.
void dequantize(uint32_t type, const void* src, float* dst, size_t n);

// The index of the first block of n elements of `type` at src (as dequantize() reads them) that
// holds a non-finite f16 scale (d, and m or dmin where the type has one), or for F32, F16 and BF16
// the first non-finite element; -1 when there is none. A finite scale dequantizes to finite
// values in every supported type, so a damaged file shows here before its NaNs reach a matmul.
// Throws kvb::Error on a bad type or n, as dequantize().
int64_t first_nonfinite_block(uint32_t type, const void* src, size_t n);

float fp16_to_f32(uint16_t h);  // exact, incl. subnormals, inf and NaN payloads
float bf16_to_f32(uint16_t h);

}  // namespace kvb::kernels::cpu
