// A small random-weight Llama-shaped GGUF for the tensor-parallel tests (issue "Multi-GPU
// workers"): 8 KV heads (so tensor parallelism of 1, 2, 4 and 8 divides it), 16 query heads
// (GQA groups of 2), F32 tensors from a fixed seed, vocabulary 512 so that stories260K's
// tok512.bin tokenizes for it (it carries no tokenizer metadata). The weights are scaled so that
// attention is peaked rather than uniform: policies then see distinct scores.
// Header-only, test code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gguf_writer.h"

namespace kvb::testing {

struct RandomLlamaShape {
  int dim = 128, hidden_dim = 256, layers = 4, heads = 16, kv_heads = 8, vocab = 512;
  int context = 512;
};

inline uint64_t tp_model_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [-a, a] from (seed, tensor index, element index): reproducible on every platform.
inline std::vector<uint8_t> tp_model_tensor(uint64_t seed, int tensor, size_t n, float a) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = tp_model_mix(tp_model_mix(seed ^ (static_cast<uint64_t>(tensor) << 40)) ^ i);
    v[i] = a * (2.0f * static_cast<float>(r >> 40) / static_cast<float>(1ull << 24) - 1.0f);
  }
  std::vector<uint8_t> bytes(n * sizeof(float));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

inline std::vector<uint8_t> tp_model_ones(size_t n) {
  std::vector<float> v(n, 1.0f);
  std::vector<uint8_t> bytes(n * sizeof(float));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

// Q8_0 blocks (ggml: an f16 scale d, then 32 int8 q; x = d q) of f32 values given as bytes, n a
// multiple of 32. d is the power of two at or above amax / 127, so its f16 bits are exact.
inline std::vector<uint8_t> tp_model_q8_0(const std::vector<uint8_t>& f32_bytes) {
  const size_t n = f32_bytes.size() / sizeof(float);
  std::vector<float> v(n);
  std::memcpy(v.data(), f32_bytes.data(), f32_bytes.size());
  std::vector<uint8_t> out;
  for (size_t b = 0; b < n; b += 32) {
    float amax = 0;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    const int e =
        std::clamp(static_cast<int>(std::ceil(std::log2(std::max(amax, 1e-30f) / 127))), -14, 15);
    const float d = std::ldexp(1.0f, e);
    const uint16_t h = static_cast<uint16_t>((e + 15) << 10);
    out.push_back(static_cast<uint8_t>(h & 0xff));
    out.push_back(static_cast<uint8_t>(h >> 8));
    for (size_t i = b; i < b + 32; ++i) {
      out.push_back(static_cast<uint8_t>(
          static_cast<int8_t>(std::clamp(std::lround(v[i] / d), -127L, 127L))));
    }
  }
  return out;
}

// Writes the model to `path`; returns false when the file cannot be written. q8_0: the
// matrices, the embedding and the (untied) classifier in Q8_0 blocks (norms stay F32).
inline bool write_random_llama_gguf(const std::string& path, const RandomLlamaShape& s = {},
                                    uint64_t seed = 8, bool q8_0 = false) {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", "random-llama-8kv");
  w.add_scalar<uint32_t>("llama.embedding_length", GgufWriter::kU32, s.dim);
  w.add_scalar<uint32_t>("llama.feed_forward_length", GgufWriter::kU32, s.hidden_dim);
  w.add_scalar<uint32_t>("llama.block_count", GgufWriter::kU32, s.layers);
  w.add_scalar<uint32_t>("llama.attention.head_count", GgufWriter::kU32, s.heads);
  w.add_scalar<uint32_t>("llama.attention.head_count_kv", GgufWriter::kU32, s.kv_heads);
  w.add_scalar<uint32_t>("llama.context_length", GgufWriter::kU32, s.context);
  w.add_scalar<float>("llama.attention.layer_norm_rms_epsilon", GgufWriter::kF32, 1e-5f);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  const uint64_t D = s.dim, H = s.hidden_dim, V = s.vocab;
  const uint64_t QD = D, KVD = D / s.heads * s.kv_heads;
  const uint32_t kF32 = 0;
  // A matrix's tensor: F32, or Q8_0 (type 8) blocks of the same values.
  const auto matrix = [&](const std::string& name, std::vector<uint64_t> dims,
                          std::vector<uint8_t> f32) {
    if (q8_0) return w.add_tensor(name, dims, 8, tp_model_q8_0(f32));
    w.add_tensor(name, dims, kF32, f32);
  };
  const float in_scale = std::sqrt(3.0f / s.dim);  // unit-variance outputs for unit-rms inputs
  int t = 0;
  matrix("token_embd.weight", {D, V}, tp_model_tensor(seed, t++, D * V, 1.7f));
  for (int l = 0; l < s.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    w.add_tensor(b + "attn_norm.weight", {D}, kF32, tp_model_ones(D));
    // Peaked attention: q and k with gain 1.6 each (logits of about unit^2 * 2.5 spread).
    matrix(b + "attn_q.weight", {D, QD}, tp_model_tensor(seed, t++, D * QD, 1.6f * in_scale));
    matrix(b + "attn_k.weight", {D, KVD}, tp_model_tensor(seed, t++, D * KVD, 1.6f * in_scale));
    matrix(b + "attn_v.weight", {D, KVD}, tp_model_tensor(seed, t++, D * KVD, in_scale));
    matrix(b + "attn_output.weight", {QD, D},
           tp_model_tensor(seed, t++, QD * D, std::sqrt(3.0f / QD)));
    w.add_tensor(b + "ffn_norm.weight", {D}, kF32, tp_model_ones(D));
    matrix(b + "ffn_gate.weight", {D, H}, tp_model_tensor(seed, t++, D * H, in_scale));
    matrix(b + "ffn_up.weight", {D, H}, tp_model_tensor(seed, t++, D * H, in_scale));
    matrix(b + "ffn_down.weight", {H, D}, tp_model_tensor(seed, t++, H * D, std::sqrt(3.0f / H)));
  }
  w.add_tensor("output_norm.weight", {D}, kF32, tp_model_ones(D));
  matrix("output.weight", {D, V}, tp_model_tensor(seed, t++, D * V, 2.0f * in_scale));
  return GgufWriter::write_file(path, w.bytes());
}

}  // namespace kvb::testing
