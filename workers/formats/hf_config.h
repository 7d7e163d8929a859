// A Hugging Face checkpoint folder's configuration: config.json -> engine::ModelConfig for the
// families the GGUF path runs (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
// Qwen3ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM), with transformers' defaults for absent
// keys, every tensor the loader reads checked for presence, shape and dtype in the safetensors
// headers (no data read), and the tokenizer_config.json facts (special tokens, add_bos_token, chat
// template). Shared by the loader (workers/formats/model_load_hf.cc) and `kvbench validate` /
// `inspect` (harness/model_info.cc), as model_header.h is for GGUF. Errors are kvb::Error naming
// the file and the key; unsupported choices (an architecture, a rope_scaling type) are usage
// errors that list what is supported.
#pragma once

#include <string>
#include <vector>

#include "workers/engine/model.h"
#include "kernels/formats/safetensors.h"

namespace kvb::engine {

// One per-layer tensor of the checkpoint and where the loader puts it: HF name, PyTorch shape
// ([out, in] for projections, which is LayerWeights' row-major [out, in] as it is), and whether
// the stored value is Gemma's w of an RMSNorm that multiplies by (1 + w) (the engine, like the
// GGUF files, holds 1 + w).
struct HfTensorSpec {
  std::string name;
  std::vector<uint64_t> shape;
  std::vector<float> LayerWeights::*field;
  bool add_one = false;
  // A fused tensor (Phi-3's qkv_proj, gate_up_proj): its rows go, in order, split_rows[i] rows
  // to split[i] (`field` unused); empty for an ordinary tensor.
  std::vector<std::vector<float> LayerWeights::*> split = {};
  std::vector<uint64_t> split_rows = {};
};
std::vector<HfTensorSpec> hf_layer_tensors(const ModelConfig& c, int layer);
// Model-level tensors: "model.embed_tokens.weight" [vocab, dim], "model.norm.weight" [dim]
// (1 + w for Gemma), "lm_head.weight" [vocab, dim] unless tie_word_embeddings.
bool hf_norms_add_one(const ModelConfig& c);

// config.json of `dir`, validated, with every tensor checked in `weights`. c.format is "hf",
// c.name the folder's name.
ModelConfig read_hf_config(const std::string& dir, const formats::SafetensorsSet& weights);

// tokenizer_config.json (absent: all defaults) and chat_template.jinja beside it.
struct HfTokenizerConfig {
  bool present = false;
  std::string bos_token;  // "" if none
  std::string eos_token;
  bool add_bos_token = false;
  std::string chat_template;         // the Jinja text, "" if none (kept for rendering later)
  std::string chat_template_source;  // "tokenizer_config.json chat_template", ...
};
HfTokenizerConfig read_hf_tokenizer_config(const std::string& dir);

}  // namespace kvb::engine
