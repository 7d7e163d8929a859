// A model's configuration from its file header alone, with every check the loaders make before
// reading weights: shared by the loaders (workers/formats/model_load.cc, workers/formats/llama2c.cc)
// and by `kvbench validate` (harness/model_info.cc), so that a file validate accepts is one the
// sweep can load. No tensor data is read. Errors are kvb::Error naming the file and the key,
// tensor or header field (usage errors for unsupported choices such as an architecture).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "workers/engine/model.h"
#include "workers/formats/gguf.h"

namespace kvb::engine {

// GGUF (Llama, Qwen2): <arch>.* metadata (sizes in range, heads divide, head_dim even, rope
// dimension in (0, head_dim] and even, rms_epsilon and rope.freq_base finite and positive, rope
// scaling none or linear with a finite positive factor), and every tensor the loader reads
// present with the shape it expects (ggml order). vocab_size and tied_embeddings are set.
ModelConfig read_gguf_config(const formats::GgufFile& g);

// RoPE scaling shared by the GGUF and Hugging Face readers (hf_config.cc), so that both paths
// compute the same frequencies. YaRN: per-dimension divisors of the unscaled frequencies
// (RopeParams::freq_factors) for `factor` over an original context `orig` (transformers'
// _compute_yarn_parameters); its cos/sin factor 0.1 ln(factor) + 1 (1 for factor <= 1). LongRoPE:
// the cos/sin factor sqrt(1 + ln(context / original) / ln(original)) (1 when context <= original).
std::vector<float> yarn_freq_factors(const kernels::cpu::RopeParams& r, float factor, int orig,
                                     double beta_fast, double beta_slow);
float yarn_attn_factor(float factor);
float longrope_attn_factor(int context, int original);

// llama2.c version-0 checkpoint: the 7-int32 header in range and the file size it implies.
struct Llama2cHeader {
  ModelConfig config;
  uint64_t file_bytes = 0;
  bool freq_tables = false;  // the legacy rope tables sit between the weights and wcls
  uint64_t num_params = 0;   // f32 weights the file holds (the rope tables not counted)
};
Llama2cHeader read_llama2c_header(const std::string& path);

}  // namespace kvb::engine
