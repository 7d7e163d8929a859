// Hugging Face checkpoint folder -> Model: config.json through read_hf_config (every key and
// tensor checked before any data is read), then the safetensors tensors one at a time, converted
// to f32 (F32, F16, BF16), so that peak host memory is the f32 weights plus one conversion chunk.
// Tensor names: transformers' model.embed_tokens / model.layers.N.* / model.norm / lm_head
// (workers/formats/hf_config.h). Q/K rows are unpermuted (RopeStyle::kNeox); Gemma's RMSNorm
// weights are stored as w and become the 1 + w the engine multiplies by; Phi-3's fused qkv_proj
// and gate_up_proj are split by rows into wq/wk/wv and w_gate/w_up.
#include <filesystem>

#include "common/error.h"
#include "workers/engine/model.h"
#include "workers/formats/model_load.h"
#include "workers/formats/hf_config.h"
#include "kernels/formats/safetensors.h"

namespace kvb::engine {

std::unique_ptr<Model> load_hf_model(const std::string& dir) {
  std::unique_ptr<formats::SafetensorsSet> st = formats::SafetensorsSet::open_dir(dir);
  auto model = std::make_unique<Model>();
  ModelConfig& c = model->config;
  c = read_hf_config(dir, *st);
  model->path = dir;
  const uint64_t D = c.dim, V = c.vocab_size;
  const bool add_one = hf_norms_add_one(c);
  auto plus_one = [](std::vector<float> w) {
    for (float& x : w) x += 1.0f;
    return w;
  };
  model->token_embedding = st->load_f32("model.embed_tokens.weight", {V, D});
  model->layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    for (const HfTensorSpec& t : hf_layer_tensors(c, l)) {
      std::vector<float> w = st->load_f32(t.name, t.shape);
      if (!t.split.empty()) {  // fused rows, split in order (shapes checked by read_hf_config)
        const uint64_t cols = t.shape[1];
        uint64_t row = 0;
        for (size_t i = 0; i < t.split.size(); ++i) {
          model->layers[l].*t.split[i] = std::vector<float>(
              w.begin() + row * cols, w.begin() + (row + t.split_rows[i]) * cols);
          row += t.split_rows[i];
        }
        continue;
      }
      model->layers[l].*t.field = t.add_one ? plus_one(std::move(w)) : std::move(w);
    }
  }
  model->final_norm = st->load_f32("model.norm.weight", {D});
  if (add_one) model->final_norm = plus_one(std::move(model->final_norm));
  if (!c.tied_embeddings) model->output = st->load_f32("lm_head.weight", {V, D});
  return model;
}

}  // namespace kvb::engine
