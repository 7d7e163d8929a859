// A small random-weight Llama-shaped GGUF for the tensor-parallel tests (issue "Multi-GPU
// workers"): 8 KV heads (so tensor parallelism of 1, 2, 4 and 8 divides it), 16 query heads
// (GQA groups of 2), F32 tensors from a fixed seed, vocabulary 512 so that stories260K's
// tok512.bin tokenizes for it (it carries no tokenizer metadata). The weights are scaled so that
// attention is peaked rather than uniform: policies then see distinct scores.
// Header-only, test code.
#pragma once

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

// Writes the model to `path`; returns false when the file cannot be written.
inline bool write_random_llama_gguf(const std::string& path, const RandomLlamaShape& s = {},
                                    uint64_t seed = 8) {
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
  const float in_scale = std::sqrt(3.0f / s.dim);  // unit-variance outputs for unit-rms inputs
  int t = 0;
  w.add_tensor("token_embd.weight", {D, V}, kF32, tp_model_tensor(seed, t++, D * V, 1.7f));
  for (int l = 0; l < s.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    w.add_tensor(b + "attn_norm.weight", {D}, kF32, tp_model_ones(D));
    // Peaked attention: q and k with gain 1.6 each (logits of about unit^2 * 2.5 spread).
    w.add_tensor(b + "attn_q.weight", {D, QD}, kF32,
                 tp_model_tensor(seed, t++, D * QD, 1.6f * in_scale));
    w.add_tensor(b + "attn_k.weight", {D, KVD}, kF32,
                 tp_model_tensor(seed, t++, D * KVD, 1.6f * in_scale));
    w.add_tensor(b + "attn_v.weight", {D, KVD}, kF32,
                 tp_model_tensor(seed, t++, D * KVD, in_scale));
    w.add_tensor(b + "attn_output.weight", {QD, D}, kF32,
                 tp_model_tensor(seed, t++, QD * D, std::sqrt(3.0f / QD)));
    w.add_tensor(b + "ffn_norm.weight", {D}, kF32, tp_model_ones(D));
    w.add_tensor(b + "ffn_gate.weight", {D, H}, kF32, tp_model_tensor(seed, t++, D * H, in_scale));
    w.add_tensor(b + "ffn_up.weight", {D, H}, kF32, tp_model_tensor(seed, t++, D * H, in_scale));
    w.add_tensor(b + "ffn_down.weight", {H, D}, kF32,
                 tp_model_tensor(seed, t++, H * D, std::sqrt(3.0f / H)));
  }
  w.add_tensor("output_norm.weight", {D}, kF32, tp_model_ones(D));
  w.add_tensor("output.weight", {D, V}, kF32, tp_model_tensor(seed, t++, D * V, 2.0f * in_scale));
  return GgufWriter::write_file(path, w.bytes());
}

}  // namespace kvb::testing
