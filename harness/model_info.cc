// read_model_info: shape and size from a model file's header only, through the loaders' own
// header checks (workers/formats/model_header.h), so that what validate accepts and reports is
// what the engine will load.
#include "harness/model_info.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "common/error.h"
#include "workers/formats/gguf.h"
#include "workers/formats/hf_config.h"
#include "kernels/formats/safetensors.h"
#include "workers/formats/model_header.h"
#include "workers/tokenizer/jinja_chat_template.h"

namespace kvb::harness {
namespace {

// The loader's own header checks (workers/formats/model_header.h), so that what validate
// accepts the sweep can load; then the sizes only validate reports.
void fill_from_config(const engine::ModelConfig& c, ModelInfo& info) {
  info.format = c.format;
  info.arch = c.arch;
  info.name = c.name;
  info.dim = c.dim;
  info.hidden_dim = c.hidden_dim;
  info.num_layers = c.num_layers;
  info.num_heads = c.num_heads;
  info.num_kv_heads = c.num_kv_heads;
  info.head_dim = c.head_dim;
  info.vocab_size = c.vocab_size;
  info.max_seq_len = c.max_seq_len;
  info.tied_embeddings = c.tied_embeddings;
  info.global_layers = c.global_layers();
  for (int w : c.window) info.max_window = std::max(info.max_window, w);
}

// The model's chat template `tmpl` ("" if none), from `source`, named `origin` in errors.
void check_chat_template(const std::string& tmpl, const std::string& source,
                         const std::string& origin, ModelInfo& info) {
  if (tmpl.empty()) return;
  info.chat_template = source;
  try {
    // Parsed, and rendered on one user turn as chat tasks use it (bos/eos left undefined: the
    // tokenizer is not loaded here), so validate refuses a template that cannot serve them.
    tokenizer::JinjaChatTemplate(tmpl, "", "", origin).render({{"user", "x"}}, true);
  } catch (const Error& e) {
    info.chat_template_error = e.what();
  }
}

void read_gguf(const std::string& path, ModelInfo& info) {
  std::unique_ptr<formats::GgufFile> g = formats::GgufFile::open(path);
  fill_from_config(engine::read_gguf_config(*g), info);
  check_chat_template(g->get_string_or("tokenizer.chat_template", ""),
                      "GGUF tokenizer.chat_template", path + ": tokenizer.chat_template", info);
  std::map<uint32_t, uint64_t> bytes_by_type;
  for (const auto& t : g->tensors()) {
    info.num_params += t.num_elements;
    bytes_by_type[t.type] += t.num_bytes;
  }
  uint64_t most = 0;
  for (const auto& [type, bytes] : bytes_by_type) {
    if (bytes > most) {
      most = bytes;
      info.weight_type = formats::ggml_type_name(type);
    }
  }
}

// A Hugging Face checkpoint folder: config.json and the safetensors headers (no data read); the
// size is the shards' bytes, the weight type the dtype holding most of them.
void read_hf(const std::string& dir, ModelInfo& info) {
  std::unique_ptr<formats::SafetensorsSet> st = formats::SafetensorsSet::open_dir(dir);
  fill_from_config(engine::read_hf_config(dir, *st), info);
  check_chat_template(engine::read_hf_tokenizer_config(dir).chat_template,
                      "tokenizer_config.json / chat_template.jinja",
                      dir + ": the chat template (tokenizer_config.json or chat_template.jinja)",
                      info);
  std::map<std::string, uint64_t> bytes_by_type;
  for (const auto& f : st->files()) {
    info.file_bytes += f->file_size();
    for (const auto& t : f->tensors()) {
      if (st->find_tensor(t.name) != &t) continue;  // not in the index's weight_map
      info.num_params += t.num_elements;
      bytes_by_type[t.dtype] += t.end - t.begin;
    }
  }
  uint64_t most = 0;
  for (const auto& [type, bytes] : bytes_by_type) {
    if (bytes > most) {
      most = bytes;
      info.weight_type = type;
    }
  }
}

void read_llama2c(const std::string& path, ModelInfo& info) {
  const engine::Llama2cHeader h = engine::read_llama2c_header(path);
  fill_from_config(h.config, info);
  info.weight_type = "F32";
  info.num_params = h.num_params;
}

}  // namespace

ModelInfo read_model_info(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    KVB_USAGE_CHECK(std::filesystem::exists(std::filesystem::path(path) / "config.json", ec))
        << "model '" << path << "' is a directory without config.json; give a model file "
        << "(.gguf or .bin) or a Hugging Face checkpoint folder";
    ModelInfo info;
    info.path = path;
    read_hf(path, info);
    return info;
  }
  KVB_USAGE_CHECK(std::filesystem::is_regular_file(path, ec))
      << "model file '" << path << "' does not exist or is not a file";
  std::ifstream in(path, std::ios::binary);
  KVB_USAGE_CHECK(in.good()) << "cannot open model file '" << path << "': " << std::strerror(errno);
  ModelInfo info;
  info.path = path;
  info.file_bytes = std::filesystem::file_size(path);
  char magic[4] = {0, 0, 0, 0};
  in.read(magic, 4);
  KVB_CHECK(in.gcount() == 4) << path << ": file too short to be a model (" << info.file_bytes
                              << " bytes)";
  if (std::memcmp(magic, "GGUF", 4) == 0) {
    read_gguf(path, info);
  } else {
    read_llama2c(path, info);
  }
  return info;
}

}  // namespace kvb::harness
