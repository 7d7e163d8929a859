// A model's shape and size read from its file header without loading weights: GGUF header,
// metadata and tensor infos (GgufFile::open reads no tensor data), or the 7-int32 llama2.c
// header. Used by `kvbench validate` and the sweep to check budgets against the context and to
// estimate memory before any rank loads a model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/policies/policy.h"

namespace kvb::harness {

struct ModelInfo {
  std::string path;
  std::string format;       // "gguf", "llama2c" or "hf" (a checkpoint folder)
  std::string arch;         // "llama", "qwen2", ... (llama2.c: "llama")
  std::string name;         // general.name, or the file name
  std::string weight_type;  // the tensor type holding most bytes ("Q4_1", "F32", "BF16")
  int dim = 0;
  int hidden_dim = 0;  // feed_forward_length (0 if a GGUF does not say)
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_seq_len = 0;  // the context length the model was trained for
  uint64_t file_bytes = 0;  // a folder: its safetensors files
  uint64_t num_params = 0;  // GGUF: sum of tensor elements; llama2.c: from the header
  bool tied_embeddings = false;  // the classifier is the embedding (no output.weight)
  // Layers with global attention, and the largest sliding window (0: none). A model whose every
  // layer slides (Mistral v0.1, Phi-3 with a window below the context) has no layer for an
  // eviction policy to act on (POLICIES.md "Sliding-window layers"): only `full` runs on it.
  int global_layers = 0;
  int max_window = 0;
  // Where the model's chat template comes from ("GGUF tokenizer.chat_template", or a folder's
  // tokenizer_config.json / chat_template.jinja), or "none" (no
  // template, or a llama2.c checkpoint): tasks that wrap prompts in the chat template cannot run
  // on "none". chat_template_error: why the template cannot be used ("" if it parses as Jinja).
  std::string chat_template = "none";
  std::string chat_template_error;

  policies::ModelShape shape() const {
    return {num_layers, num_heads, num_kv_heads, head_dim, max_seq_len, max_window > 0};
  }
  // KV-cache bytes per cached token over all layers (keys and values, f32 as the CPU engine
  // stores them).
  uint64_t kv_bytes_per_token() const {
    return 2ull * num_layers * num_kv_heads * head_dim * sizeof(float);
  }
  // Bytes of the weights once dequantized to f32 at load (DESIGN.md "Model and engine").
  uint64_t f32_weight_bytes() const { return num_params * sizeof(float); }
  // f32 weight bytes one rank of a tensor-parallel group of `degree` holds: the embedding, the
  // classifier and the norms are replicated (engine/tensor_parallel.h), the rest is split.
  uint64_t f32_weight_bytes_per_rank(int degree) const {
    const uint64_t replicated =
        static_cast<uint64_t>(vocab_size) * dim * (tied_embeddings ? 1 : 2) +
        static_cast<uint64_t>(dim) * (2 * num_layers + 1);
    const uint64_t split = num_params > replicated ? num_params - replicated : 0;
    return (replicated + split / std::max(1, degree)) * sizeof(float);
  }
};

// Reads the header (a directory: a Hugging Face checkpoint folder's config.json and safetensors
// headers; a file: format by magic bytes, as engine::load_model does). Throws a usage error if
// the file is missing, and kvb::Error naming the file if the header is malformed or truncated.
ModelInfo read_model_info(const std::string& path);

}  // namespace kvb::harness
