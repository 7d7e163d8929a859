// read_model_info: shape and size from a model file's header only. The keys and the llama2.c
// size formula follow the loaders (workers/engine/model_load.cc, workers/formats/llama2c.cc), so
// what validate reports is what the engine will load.
#include "harness/model_info.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "common/error.h"
#include "workers/formats/gguf.h"

namespace kvb::harness {
namespace {

std::string file_name(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

void read_gguf(const std::string& path, ModelInfo& info) {
  std::unique_ptr<formats::GgufFile> g = formats::GgufFile::open(path);
  info.format = "gguf";
  info.arch = g->get_string("general.architecture");
  info.name = g->get_string_or("general.name", file_name(path));
  const std::string p = info.arch + ".";
  info.dim = static_cast<int>(g->get_int(p + "embedding_length"));
  info.hidden_dim = static_cast<int>(g->get_int_or(p + "feed_forward_length", 0));
  info.num_layers = static_cast<int>(g->get_int(p + "block_count"));
  info.num_heads = static_cast<int>(g->get_int(p + "attention.head_count"));
  info.num_kv_heads =
      static_cast<int>(g->get_int_or(p + "attention.head_count_kv", info.num_heads));
  info.max_seq_len = static_cast<int>(g->get_int_or(p + "context_length", 2048));
  KVB_CHECK(info.dim > 0 && info.num_layers > 0 && info.num_heads > 0 && info.num_kv_heads > 0 &&
            info.num_heads % info.num_kv_heads == 0 && info.max_seq_len > 0)
      << path << ": implausible " << p << "* metadata (embedding_length " << info.dim
      << ", block_count " << info.num_layers << ", head_count " << info.num_heads
      << ", head_count_kv " << info.num_kv_heads << ", context_length " << info.max_seq_len << ")";
  info.head_dim =
      static_cast<int>(g->get_int_or(p + "attention.key_length", info.dim / info.num_heads));
  std::map<uint32_t, uint64_t> bytes_by_type;
  info.tied_embeddings = true;
  for (const auto& t : g->tensors()) {
    info.num_params += t.num_elements;
    if (t.name == "output.weight") info.tied_embeddings = false;
    bytes_by_type[t.type] += t.num_bytes;
    if (t.name == "token_embd.weight" && t.dims.size() == 2) {
      info.vocab_size = static_cast<int>(t.dims[1]);
    }
  }
  uint64_t most = 0;
  for (const auto& [type, bytes] : bytes_by_type) {
    if (bytes > most) {
      most = bytes;
      info.weight_type = formats::ggml_type_name(type);
    }
  }
}

void read_llama2c(const std::string& path, std::ifstream& in, ModelInfo& info) {
  int32_t hdr[7];
  in.seekg(0);
  in.read(reinterpret_cast<char*>(hdr), sizeof(hdr));
  KVB_CHECK(in.gcount() == static_cast<std::streamsize>(sizeof(hdr)))
      << path << ": file too short for a llama2.c header (" << info.file_bytes << " bytes)";
  info.format = "llama2c";
  info.arch = "llama";
  info.name = file_name(path);
  info.weight_type = "F32";
  info.dim = hdr[0];
  const int64_t hidden = hdr[1];
  info.num_layers = hdr[2];
  info.num_heads = hdr[3];
  info.num_kv_heads = hdr[4];
  const bool tied = hdr[5] > 0;
  info.tied_embeddings = tied;
  const int64_t vocab = tied ? hdr[5] : -static_cast<int64_t>(hdr[5]);
  info.max_seq_len = hdr[6];
  auto in_range = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  KVB_CHECK(in_range(info.dim, 1, 65536) && in_range(hidden, 1, 1 << 20) &&
            in_range(info.num_layers, 1, 1024) && in_range(info.num_heads, 1, 1024) &&
            in_range(info.num_kv_heads, 1, info.num_heads) && in_range(vocab, 1, 1 << 22) &&
            in_range(info.max_seq_len, 1, 1 << 24) && info.dim % info.num_heads == 0 &&
            info.num_heads % info.num_kv_heads == 0)
      << path << ": neither GGUF nor a llama2.c checkpoint (header dim=" << info.dim
      << " hidden_dim=" << hidden << " n_layers=" << info.num_layers
      << " n_heads=" << info.num_heads << " n_kv_heads=" << info.num_kv_heads
      << " vocab_size=" << hdr[5] << " seq_len=" << info.max_seq_len << ")";
  info.vocab_size = static_cast<int>(vocab);
  info.head_dim = info.dim / info.num_heads;
  info.hidden_dim = static_cast<int>(hidden);
  // The tensors of llama2.c's legacy export, in file order (see load_llama2c).
  const uint64_t D = info.dim, H = hidden, L = info.num_layers, V = vocab;
  const uint64_t KVD = static_cast<uint64_t>(info.num_kv_heads) * info.head_dim;
  info.num_params = V * D + L * D + L * D * D + 2 * L * KVD * D + L * D * D + L * D +
                    3 * L * H * D + D + (tied ? 0 : V * D);
  KVB_CHECK(info.file_bytes >= sizeof(hdr) + 4 * info.num_params)
      << path << ": truncated llama2.c checkpoint: the header needs "
      << sizeof(hdr) + 4 * info.num_params << " bytes, the file has " << info.file_bytes;
}

}  // namespace

ModelInfo read_model_info(const std::string& path) {
  std::error_code ec;
  KVB_USAGE_CHECK(!std::filesystem::is_directory(path, ec))
      << "model '" << path << "' is a directory; give the model file in it";
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
    read_llama2c(path, in, info);
  }
  return info;
}

}  // namespace kvb::harness
