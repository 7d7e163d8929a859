// kvb_gguf_tensor_sha FILE: one line per tensor, "name type elements sha256", the hash taken over
// the little-endian f32 values kvbench's GGUF reader dequantizes the tensor to. The peer check
// scripts/check_gguf_types.py compares these lines with the same hash of gguf-py's values.
#include <cstdio>
#include <exception>
#include <string_view>

#include "common/sha256.h"
#include "workers/formats/gguf.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kvb_gguf_tensor_sha FILE.gguf\n");
    return 2;
  }
  try {
    const auto file = kvb::formats::GgufFile::open(argv[1]);
    for (const kvb::formats::GgufTensorInfo& t : file->tensors()) {
      const std::vector<float> v = file->load_f32(t.name);  // x86-64: already little-endian
      const std::string_view bytes(reinterpret_cast<const char*>(v.data()), v.size() * 4);
      std::printf("%s %s %zu %s\n", t.name.c_str(), kvb::formats::ggml_type_name(t.type), v.size(),
                  kvb::sha256_hex(bytes).c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvb_gguf_tensor_sha: %s\n", e.what());
    return 1;
  }
  return 0;
}
