// Model loading: format detection by magic, and the GGUF -> Model mapping for the Llama, Qwen2
// and Qwen3 families (llama.cpp tensor names blk.N.attn_q.weight etc.; metadata keys <arch>.*;
// Qwen3 adds blk.N.attn_q_norm.weight / attn_k_norm.weight, llama.cpp's LLM_ARCH_QWEN3).
#include <cstring>
#include <fstream>

#include "common/error.h"
#include "workers/engine/model.h"
#include "workers/formats/gguf.h"

namespace kvb::engine {
namespace {

const char* const kSupportedArchs[] = {"llama", "qwen2", "qwen3"};

std::string supported_archs() {
  std::string s;
  for (const char* a : kSupportedArchs) s += (s.empty() ? "" : ", ") + std::string(a);
  return s;
}

}  // namespace

size_t Model::num_parameters() const {
  size_t n = token_embedding.size() + final_norm.size() + output.size();
  for (const auto& l : layers) {
    n += l.attn_norm.size() + l.wq.size() + l.wk.size() + l.wv.size() + l.bq.size() +
         l.bk.size() + l.bv.size() + l.q_norm.size() + l.k_norm.size() + l.wo.size() +
         l.ffn_norm.size() + l.w_gate.size() + l.w_up.size() + l.w_down.size();
  }
  return n;
}

std::unique_ptr<Model> load_gguf_model(const std::string& path) {
  std::shared_ptr<formats::GgufFile> g = formats::GgufFile::open(path);
  const std::string arch = g->get_string("general.architecture");
  bool supported = false;
  for (const char* a : kSupportedArchs) supported |= arch == a;
  KVB_USAGE_CHECK(supported) << path << ": unsupported architecture '" << arch
                             << "' (key general.architecture); supported: "
                             << supported_archs();
  auto model = std::make_unique<Model>();
  ModelConfig& c = model->config;
  c.arch = arch;
  c.format = "gguf";
  c.name = g->get_string_or("general.name", path.substr(path.find_last_of('/') + 1));
  const std::string p = arch + ".";
  c.dim = static_cast<int>(g->get_int(p + "embedding_length"));
  c.hidden_dim = static_cast<int>(g->get_int(p + "feed_forward_length"));
  c.num_layers = static_cast<int>(g->get_int(p + "block_count"));
  c.num_heads = static_cast<int>(g->get_int(p + "attention.head_count"));
  c.num_kv_heads = static_cast<int>(g->get_int_or(p + "attention.head_count_kv", c.num_heads));
  c.max_seq_len = static_cast<int>(g->get_int_or(p + "context_length", 2048));
  c.norm_eps = static_cast<float>(g->get_float_or(p + "attention.layer_norm_rms_epsilon", 1e-5));
  auto positive = [&](int v, const std::string& key, int hi) {
    KVB_CHECK(v > 0 && v <= hi) << path << ": metadata " << key << " = " << v
                                << " is out of range (1.." << hi << ")";
  };
  positive(c.dim, p + "embedding_length", 1 << 16);
  positive(c.hidden_dim, p + "feed_forward_length", 1 << 20);
  positive(c.num_layers, p + "block_count", 1024);
  positive(c.num_heads, p + "attention.head_count", 1024);
  positive(c.num_kv_heads, p + "attention.head_count_kv", c.num_heads);
  positive(c.max_seq_len, p + "context_length", 1 << 24);
  KVB_CHECK(c.num_heads % c.num_kv_heads == 0)
      << path << ": head_count " << c.num_heads << " is not a multiple of head_count_kv "
      << c.num_kv_heads;
  c.head_dim = static_cast<int>(g->get_int_or(p + "attention.key_length", c.dim / c.num_heads));
  KVB_CHECK(c.head_dim > 0 && c.head_dim <= 1024 && c.head_dim % 2 == 0)
      << path << ": head dimension " << c.head_dim << " unsupported";
  c.qkv_bias = arch == "qwen2";
  c.qk_norm = arch == "qwen3";
  c.rope.style = arch == "llama" ? kernels::cpu::RopeStyle::kNorm : kernels::cpu::RopeStyle::kNeox;
  c.rope.theta = static_cast<float>(g->get_float_or(p + "rope.freq_base", 10000.0));
  c.rope.rot_dim = static_cast<int>(g->get_int_or(p + "rope.dimension_count", c.head_dim));
  KVB_CHECK(c.rope.rot_dim > 0 && c.rope.rot_dim <= c.head_dim && c.rope.rot_dim % 2 == 0)
      << path << ": " << p << "rope.dimension_count = " << c.rope.rot_dim << " (head_dim "
      << c.head_dim << ")";
  const std::string scaling = g->get_string_or(p + "rope.scaling.type", "none");
  if (scaling == "linear") {
    c.rope.linear_scale = static_cast<float>(g->get_float(p + "rope.scaling.factor"));
    KVB_CHECK(c.rope.linear_scale > 0) << path << ": rope.scaling.factor must be positive";
  } else {
    KVB_USAGE_CHECK(scaling == "none") << path << ": " << p << "rope.scaling.type '" << scaling
                                       << "' is not supported (supported: none, linear)";
  }
  if (g->find_tensor("rope_freqs.weight")) {
    c.rope.freq_factors =
        g->load_f32("rope_freqs.weight", {static_cast<uint64_t>(c.rope.rot_dim / 2)});
  }

  const formats::GgufTensorInfo* emb = g->find_tensor("token_embd.weight");
  KVB_CHECK(emb && emb->dims.size() == 2) << path << ": tensor token_embd.weight missing or not 2-D";
  c.vocab_size = static_cast<int>(emb->dims[1]);
  const uint64_t D = c.dim, H = c.hidden_dim, V = c.vocab_size;
  const uint64_t QD = static_cast<uint64_t>(c.num_heads) * c.head_dim;
  const uint64_t KVD = static_cast<uint64_t>(c.num_kv_heads) * c.head_dim;
  model->path = path;
  model->token_embedding = g->load_f32("token_embd.weight", {D, V});
  model->layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LayerWeights& w = model->layers[l];
    w.attn_norm = g->load_f32(b + "attn_norm.weight", {D});
    w.wq = g->load_f32(b + "attn_q.weight", {D, QD});
    w.wk = g->load_f32(b + "attn_k.weight", {D, KVD});
    w.wv = g->load_f32(b + "attn_v.weight", {D, KVD});
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
    w.wo = g->load_f32(b + "attn_output.weight", {QD, D});
    w.ffn_norm = g->load_f32(b + "ffn_norm.weight", {D});
    w.w_gate = g->load_f32(b + "ffn_gate.weight", {D, H});
    w.w_up = g->load_f32(b + "ffn_up.weight", {D, H});
    w.w_down = g->load_f32(b + "ffn_down.weight", {H, D});
  }
  model->final_norm = g->load_f32("output_norm.weight", {D});
  if (g->find_tensor("output.weight")) {
    model->output = g->load_f32("output.weight", {D, V});
  }
  c.tied_embeddings = model->output.empty();
  model->gguf = std::move(g);
  return model;
}

std::unique_ptr<Model> load_model(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KVB_USAGE_CHECK(in.good()) << "cannot open model file '" << path << "': " << std::strerror(errno);
  char magic[4] = {0, 0, 0, 0};
  in.read(magic, 4);
  KVB_CHECK(in.gcount() == 4) << path << ": file too short to be a model (" << in.gcount()
                              << " bytes)";
  if (std::memcmp(magic, "GGUF", 4) == 0) return load_gguf_model(path);
  return load_llama2c(path);
}

}  // namespace kvb::engine
