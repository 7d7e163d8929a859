// Model loading: format detection by magic, and the GGUF -> Model mapping for the Llama, Qwen2,
// Qwen3, Gemma 3 and Phi-3 families (llama.cpp tensor names blk.N.attn_q.weight etc.; metadata
// keys <arch>.*; Qwen3 and Gemma 3 add blk.N.attn_q_norm.weight / attn_k_norm.weight, Gemma 3
// blk.N.post_attention_norm.weight / post_ffw_norm.weight; Phi-3's fused blk.N.attn_qkv.weight
// and blk.N.ffn_up.weight are split here, its LongRoPE factor set is loaded here).
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "kernels/cpu/qmatmul.h"
#include "workers/engine/model.h"
#include "workers/formats/model_load.h"
#include "kernels/formats/file_io.h"
#include "workers/formats/gguf.h"
#include "workers/formats/model_header.h"

namespace kvb::engine {
namespace {
// A GGUF file's tensors as stored (Model::stored).
class GgufStoredTensors final : public StoredTensors {
 public:
  explicit GgufStoredTensors(std::shared_ptr<formats::GgufFile> g) : g_(std::move(g)) {}
  bool info(const std::string& name, Info* out) const override {
    const formats::GgufTensorInfo* t = g_->find_tensor(name);
    if (!t) return false;
    *out = {t->type, t->dims, t->num_bytes};
    return true;
  }
  std::vector<uint8_t> bytes(const std::string& name, uint64_t first,
                             uint64_t count) const override {
    return g_->load_raw(name, first, count);
  }

 private:
  std::shared_ptr<formats::GgufFile> g_;
};
}  // namespace

std::unique_ptr<Model> load_gguf_model(const std::string& path, bool native_blocks) {
  std::shared_ptr<formats::GgufFile> g = formats::GgufFile::open(path);
  // Metadata, shapes and every tensor's presence, checked without reading data (shared with
  // kvbench validate: workers/formats/model_header.h).
  auto model = std::make_unique<Model>();
  ModelConfig& c = model->config;
  c = read_gguf_config(*g);
  const uint64_t half = static_cast<uint64_t>(c.rope.rot_dim / 2);
  if (g->find_tensor("rope_freqs.weight")) {
    c.rope.freq_factors = g->load_f32("rope_freqs.weight", {half});
  }
  if (!c.rope_factor_set.empty()) {  // LongRoPE: the set read_gguf_config chose for the run
    c.rope.freq_factors = g->load_f32("rope_factors_" + c.rope_factor_set + ".weight", {half});
    for (size_t i = 0; i < c.rope.freq_factors.size(); ++i) {
      const float f = c.rope.freq_factors[i];
      KVB_CHECK(std::isfinite(f) && f > 0)
          << path << ": rope_factors_" << c.rope_factor_set << ".weight[" << i << "] = " << f
          << " is not a finite positive frequency divisor";
    }
  }
  const uint64_t D = c.dim, H = c.hidden_dim, V = c.vocab_size;
  const uint64_t QD = static_cast<uint64_t>(c.num_heads) * c.head_dim;
  const uint64_t KVD = static_cast<uint64_t>(c.num_kv_heads) * c.head_dim;
  model->path = path;
  model->native_blocks = native_blocks;
  // A matrix's f32 weights, or nothing when it stays in its blocks (native_blocks: the CPU
  // backend reads those from Model::stored, so the resident set holds the file's bytes once).
  const auto matrix = [&](const std::string& name, const std::vector<uint64_t>& dims) {
    const formats::GgufTensorInfo* t = g->find_tensor(name);
    if (native_blocks && t && kernels::cpu::qmatmul_supports(t->type)) {
      KVB_CHECK(t->dims == dims) << path << ": tensor '" << name << "' has the wrong shape";
      model->blocks_only_params += static_cast<size_t>(t->num_elements);
      return std::vector<float>();
    }
    return g->load_f32(name, dims);
  };
  model->token_embedding = matrix("token_embd.weight", {D, V});
  model->layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LayerWeights& w = model->layers[l];
    w.attn_norm = g->load_f32(b + "attn_norm.weight", {D});
    if (c.fused_qkv) {
      // [QD + 2 KVD rows, D]: Q's rows, then K's, then V's (llama.cpp's phi3 views).
      const std::vector<float> qkv = matrix(b + "attn_qkv.weight", {D, QD + 2 * KVD});
      if (!qkv.empty()) {
        w.wq.assign(qkv.begin(), qkv.begin() + QD * D);
        w.wk.assign(qkv.begin() + QD * D, qkv.begin() + (QD + KVD) * D);
        w.wv.assign(qkv.begin() + (QD + KVD) * D, qkv.end());
      }
    } else {
      w.wq = matrix(b + "attn_q.weight", {D, QD});
      w.wk = matrix(b + "attn_k.weight", {D, KVD});
      w.wv = matrix(b + "attn_v.weight", {D, KVD});
    }
    if (c.qkv_bias) {
      w.bq = g->load_f32(b + "attn_q.bias", {QD});
      w.bk = g->load_f32(b + "attn_k.bias", {KVD});
      w.bv = g->load_f32(b + "attn_v.bias", {KVD});
    }
    if (c.qk_norm) {
      const uint64_t hd = c.head_dim;
      w.q_norm = g->load_f32(b + "attn_q_norm.weight", {hd});
      w.k_norm = g->load_f32(b + "attn_k_norm.weight", {hd});
    }
    w.wo = matrix(b + "attn_output.weight", {QD, D});
    w.ffn_norm = g->load_f32(b + "ffn_norm.weight", {D});
    if (c.fused_gate_up) {
      // [2H rows, D]: the gate's rows first (transformers' Phi3MLP chunk(2); ggml_swiglu's halves).
      const std::vector<float> gate_up = matrix(b + "ffn_up.weight", {D, 2 * H});
      if (!gate_up.empty()) {
        w.w_gate.assign(gate_up.begin(), gate_up.begin() + H * D);
        w.w_up.assign(gate_up.begin() + H * D, gate_up.end());
      }
    } else {
      w.w_gate = matrix(b + "ffn_gate.weight", {D, H});
      w.w_up = matrix(b + "ffn_up.weight", {D, H});
    }
    w.w_down = matrix(b + "ffn_down.weight", {H, D});
    if (c.post_norms) {
      w.post_attn_norm = g->load_f32(b + "post_attention_norm.weight", {D});
      w.post_ffn_norm = g->load_f32(b + "post_ffw_norm.weight", {D});
    }
  }
  model->final_norm = g->load_f32("output_norm.weight", {D});
  if (!c.tied_embeddings) model->output = matrix("output.weight", {D, V});
  model->stored = std::make_shared<GgufStoredTensors>(g);
  model->gguf = std::move(g);
  return model;
}

std::unique_ptr<Model> load_model(const std::string& path, bool native_blocks) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return load_hf_model(path);
  formats::regular_file_size(path, "model file");  // a FIFO would block the open below
  std::ifstream in(path, std::ios::binary);
  KVB_USAGE_CHECK(in.good()) << "cannot open model file '" << path << "': " << std::strerror(errno);
  char magic[4] = {0, 0, 0, 0};
  in.read(magic, 4);
  KVB_CHECK(in.gcount() == 4) << path << ": file too short to be a model (" << in.gcount()
                              << " bytes)";
  if (std::memcmp(magic, "GGUF", 4) == 0) return load_gguf_model(path, native_blocks);
  return load_llama2c(path);
}

}  // namespace kvb::engine
