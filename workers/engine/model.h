// A transformer model in memory: configuration and f32 weights (dequantized at load, so every
// policy sees the same quantization noise). Loaded from a llama2.c checkpoint, a GGUF file or a
// Hugging Face checkpoint folder (config.json + safetensors).
// Supported families: Llama (incl. SmolLM2, stories260K), Qwen2 (QKV bias), Qwen3 (per-head
// RMSNorm of Q and K before RoPE, head_dim independent of dim / num_heads) and Gemma 3 (Qwen3's
// q/k norm plus embeddings scaled by sqrt(dim), post-attention and post-MLP norms, a GELU-tanh
// gated MLP, and sliding-window layers with their own RoPE base beside the global ones), Mistral
// (Llama with a sliding window on every layer) and Phi-3 (fused QKV and gate/up, LongRoPE);
// YaRN and LongRoPE scaling become per-dimension frequency factors plus a cos/sin factor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/rope.h"

namespace kvb::formats {
class GgufFile;
}

namespace kvb::engine {

// The MLP's gate activation: SwiGLU (Llama, Qwen) or GeGLU with tanh-approximated GELU (Gemma).
enum class FfnAct { kSilu, kGeluTanh };

struct ModelConfig {
  std::string arch;          // "llama", "qwen2", "qwen3", "gemma3", "phi3"
  std::string name;          // general.name or the file name
  std::string format;        // "gguf", "llama2c" or "hf"
  int dim = 0;               // embedding_length
  int hidden_dim = 0;        // feed_forward_length
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;          // attention.key_length; need not be dim / num_heads (Qwen3)
  int vocab_size = 0;
  int max_seq_len = 0;       // context_length the model was trained for
  float norm_eps = 1e-5f;
  bool qkv_bias = false;
  bool qk_norm = false;      // Qwen3: RMSNorm over each Q and K head (weight [head_dim])
  bool tied_embeddings = false;
  kernels::cpu::RopeParams rope;
  // How `rope` was derived, for kvbench inspect: "none", "linear", "yarn" or "longrope";
  // rope_original_context: rope.scaling.original_context_length (yarn, longrope; else 0);
  // rope_factor_set: which LongRoPE tensor the run uses ("long" or "short"; else empty). The
  // frequencies themselves live in rope.freq_factors and rope.attn_factor.
  std::string rope_scaling = "none";
  int rope_original_context = 0;
  std::string rope_factor_set;
  // Phi-3: Q, K and V in one tensor blk.N.attn_qkv.weight and gate and up in blk.N.ffn_up.weight
  // (gate first), split at load into wq/wk/wv and w_gate/w_up.
  bool fused_qkv = false;
  bool fused_gate_up = false;
  // Gemma 3. embed_scale multiplies the token embeddings (sqrt(dim); the tied classifier reads
  // them unscaled). post_norms: RMSNorm of the attention and MLP outputs before each residual add
  // (LayerWeights::post_attn_norm, post_ffn_norm). attn_scale: the softmax scale (0: the usual
  // 1 / sqrt(head_dim)).
  float embed_scale = 1.0f;
  bool post_norms = false;
  FfnAct ffn_act = FfnAct::kSilu;
  float attn_scale = 0.0f;
  // Sliding-window layers: window[l] > 0 is the number of most recent positions (the query's own
  // included) a query of layer l sees, and those layers rotate with rope_local; 0 or an empty
  // vector: global attention with `rope`. POLICIES.md "Sliding-window layers": the window is
  // the layer's cache, and eviction policies act on the global layers only. rope_local with
  // rot_dim 0 (Mistral, Phi-3: one window for every layer) means the sliding layers rotate with
  // `rope` too.
  std::vector<int> window;
  kernels::cpu::RopeParams rope_local;

  bool sliding(int layer) const { return !window.empty() && window[layer] > 0; }
  bool has_sliding_layers() const {
    for (int w : window) {
      if (w > 0) return true;
    }
    return false;
  }
  const kernels::cpu::RopeParams& rope_of(int layer) const {
    return sliding(layer) && rope_local.rot_dim > 0 ? rope_local : rope;
  }
  int global_layers() const {
    int n = 0;
    for (int l = 0; l < num_layers; ++l) n += sliding(l) ? 0 : 1;
    return n;
  }
  float softmax_scale() const;
};

struct LayerWeights {
  std::vector<float> attn_norm;  // [dim]
  std::vector<float> wq;         // [num_heads * head_dim, dim]
  std::vector<float> wk;         // [num_kv_heads * head_dim, dim]
  std::vector<float> wv;         // [num_kv_heads * head_dim, dim]
  std::vector<float> bq, bk, bv; // [out] when qkv_bias, else empty
  std::vector<float> q_norm;     // [head_dim] when qk_norm, else empty; shared by all Q heads
  std::vector<float> k_norm;     // [head_dim] when qk_norm, else empty; shared by all K heads
  std::vector<float> wo;         // [dim, num_heads * head_dim]
  std::vector<float> ffn_norm;   // [dim]
  std::vector<float> w_gate;     // [hidden_dim, dim]
  std::vector<float> w_up;       // [hidden_dim, dim]
  std::vector<float> w_down;     // [dim, hidden_dim]
  std::vector<float> post_attn_norm;  // [dim] when post_norms (Gemma), else empty
  std::vector<float> post_ffn_norm;   // [dim] when post_norms, else empty
};

// A model file's tensors as it stores them (a GGUF file's ggml blocks), for an engine that
// computes on them (--dtype native). Implemented by the loader (workers/formats), which sits
// above the engine.
class StoredTensors {
 public:
  virtual ~StoredTensors() = default;
  struct Info {
    uint32_t type = 0;            // ggml type id
    std::vector<uint64_t> dims;   // ggml order: dims[0] is the row length
    uint64_t num_bytes = 0;
  };
  // False when the file has no tensor of that name.
  virtual bool info(const std::string& name, Info* out) const = 0;
  // Bytes [first, first + count) of the tensor as stored (a range of rows: no copy of the
  // whole tensor is ever resident beside it); throws naming the tensor when absent or when the
  // range leaves it.
  virtual std::vector<uint8_t> bytes(const std::string& name, uint64_t first,
                                     uint64_t count) const = 0;
};

struct Model {
  ModelConfig config;
  std::string path;
  std::vector<float> token_embedding;  // [vocab_size, dim]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;       // [dim]
  std::vector<float> output;           // [vocab_size, dim]; empty when tied to the embedding
  std::shared_ptr<formats::GgufFile> gguf;  // kept for tokenizer metadata; null otherwise
  std::shared_ptr<const StoredTensors> stored;  // a GGUF model's tensors as stored; null otherwise
  // Loaded for --dtype native (load_model's native_blocks): each matrix and the embedding whose
  // stored type the quantized product takes (kernels/cpu/qmatmul.h qmatmul_supports) was left in
  // its blocks, so its f32 vector above is empty and only an engine that reads `stored` (the CPU
  // backend under DType::kNative) can run the model. blocks_only_params counts their weights.
  bool native_blocks = false;
  size_t blocks_only_params = 0;

  const float* output_weight() const {
    return output.empty() ? token_embedding.data() : output.data();
  }
  size_t num_parameters() const;
};

// Usage error when `policy` is not "full" and no layer of the model is global: every layer
// slides, the window alone bounds the cache, and eviction policies act on global layers only
// (POLICIES.md "Sliding-window layers"), so the policy would run exactly as full under its name.
// `model` names the model in the message.
void require_policy_layers(const std::string& policy, const std::string& model, int global_layers,
                           int max_window);

}  // namespace kvb::engine
