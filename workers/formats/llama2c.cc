// llama2.c checkpoint loader ("legacy" version-0 format written by llama2.c's export.py):
// header of 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a
// negative vocab_size means an untied classifier follows), then f32 tensors in a fixed order.
// Reference: karpathy/llama2.c run.c read_checkpoint / memory_map_weights.
#include <cstdint>
#include <cstring>
#include <fstream>

#include "common/error.h"
#include "workers/engine/model.h"
#include "workers/formats/model_header.h"
#include "workers/formats/model_load.h"

namespace kvb::engine {
namespace {

class Reader {
 public:
  Reader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    KVB_USAGE_CHECK(in_.good()) << "cannot open model file '" << path << "': "
                                << std::strerror(errno);
    in_.seekg(0, std::ios::end);
    size_ = static_cast<uint64_t>(in_.tellg());
    in_.seekg(0);
  }
  uint64_t size() const { return size_; }
  uint64_t offset() const { return offset_; }
  void read(void* dst, uint64_t bytes, const char* what) {
    KVB_CHECK(offset_ + bytes <= size_)
        << path_ << ": truncated llama2.c checkpoint: " << what << " needs " << bytes
        << " bytes at offset " << offset_ << " but the file has " << size_ << " bytes";
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(bytes));
    KVB_CHECK(in_.good()) << path_ << ": read error at offset " << offset_;
    offset_ += bytes;
  }
  std::vector<float> floats(uint64_t count, const char* what) {
    std::vector<float> v(count);
    read(v.data(), count * sizeof(float), what);
    return v;
  }

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t size_ = 0;
  uint64_t offset_ = 0;
};

// Splits a stacked [L, rows, cols] tensor into per-layer vectors.
void split_layers(const std::vector<float>& all, int layers, size_t per_layer,
                  std::vector<LayerWeights>& out, std::vector<float> LayerWeights::*field) {
  for (int l = 0; l < layers; ++l) {
    auto begin = all.begin() + static_cast<std::ptrdiff_t>(l * per_layer);
    (out[l].*field).assign(begin, begin + static_cast<std::ptrdiff_t>(per_layer));
  }
}

}  // namespace

std::unique_ptr<Model> load_llama2c(const std::string& path) {
  // Header and file size checked before anything is allocated (shared with kvbench validate).
  const Llama2cHeader h = read_llama2c_header(path);
  auto model = std::make_unique<Model>();
  ModelConfig& c = model->config;
  c = h.config;
  Reader r(path);
  int32_t hdr[7];
  r.read(hdr, sizeof(hdr), "header");
  KVB_CHECK(r.size() == h.file_bytes) << path << ": file size changed while loading";
  const uint64_t D = c.dim, H = c.hidden_dim, L = c.num_layers, V = c.vocab_size;
  const uint64_t KVD = static_cast<uint64_t>(c.num_kv_heads) * c.head_dim;
  const uint64_t S = c.max_seq_len, HD = c.head_dim;
  const uint64_t freq_tables = 4 * S * HD;  // two tables of S * HD/2 floats (legacy, unused)

  model->path = path;
  model->token_embedding = r.floats(V * D, "token_embedding");
  model->layers.resize(L);
  split_layers(r.floats(L * D, "rms_att"), L, D, model->layers, &LayerWeights::attn_norm);
  split_layers(r.floats(L * D * D, "wq"), L, D * D, model->layers, &LayerWeights::wq);
  split_layers(r.floats(L * KVD * D, "wk"), L, KVD * D, model->layers, &LayerWeights::wk);
  split_layers(r.floats(L * KVD * D, "wv"), L, KVD * D, model->layers, &LayerWeights::wv);
  split_layers(r.floats(L * D * D, "wo"), L, D * D, model->layers, &LayerWeights::wo);
  split_layers(r.floats(L * D, "rms_ffn"), L, D, model->layers, &LayerWeights::ffn_norm);
  split_layers(r.floats(L * H * D, "w1"), L, H * D, model->layers, &LayerWeights::w_gate);
  split_layers(r.floats(L * D * H, "w2"), L, D * H, model->layers, &LayerWeights::w_down);
  split_layers(r.floats(L * H * D, "w3"), L, H * D, model->layers, &LayerWeights::w_up);
  model->final_norm = r.floats(D, "rms_final");
  if (!c.tied_embeddings) {
    if (h.freq_tables) {
      std::vector<float> skip(S * HD);
      r.read(skip.data(), freq_tables, "freq_cis");
    }
    model->output = r.floats(V * D, "wcls");
  }
  return model;
}

}  // namespace kvb::engine
