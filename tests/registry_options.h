// The options a test gives a registered policy when it runs every entry of the registry
// (policies::policy_registry()): none, except for policies that cannot be made without one.
// `python` needs its script: the example H2O (attention sums, per-head keep), so a registry loop
// runs a Python scorer through the same path as the native ones. `duo_attention` needs a pattern
// folder for the model's shape: duo_patterns writes one (scores made up per (layer, head), sink 4,
// recent 16) and half the heads stream. `qfilter` needs filters for the model's shape:
// qfilter_filters writes a safetensors file of made-up ones. `finch` takes the question as its
// window, which a raw prompt lacks: window_size 4 (the prompt's last 4 tokens). One place for
// this knowledge: a new policy with a required option adds its line here.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace kvb::testing_registry {

// A DuoAttention pattern folder (full_attention_heads.tsv, config.json) for `layers` x `kv_heads`
// in the temporary folder; its path.
inline std::string duo_patterns(int layers, int kv_heads) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("kvb_duo_" + std::to_string(::getpid()) + "_" +
                                   std::to_string(layers) + "x" + std::to_string(kv_heads));
  fs::create_directories(dir);
  std::ofstream tsv(dir / "full_attention_heads.tsv");
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < kv_heads; ++h) {
      tsv << (h ? "\t" : "") << ((l * 7 + h * 3) % 10) / 10.0;
    }
    tsv << "\n";
  }
  std::ofstream(dir / "config.json") << R"({"sink_size": 4, "recent_size": 16})";
  return dir.string();
}

// A Q-Filters file (model.safetensors with q_filters [layers, kv_heads, head_dim], F32) of made-up
// filters in the temporary folder; its path. Entry i is sin(0.37 i + 0.1) + 0.05 (layer, head
// and channel all matter).
inline std::string qfilter_filters(int layers, int kv_heads, int head_dim) {
  namespace fs = std::filesystem;
  const fs::path path =
      fs::temp_directory_path() / ("kvb_qfilt_" + std::to_string(::getpid()) + "_" +
                                   std::to_string(layers) + "x" + std::to_string(kv_heads) + "x" +
                                   std::to_string(head_dim) + ".safetensors");
  const size_t n = static_cast<size_t>(layers) * kv_heads * head_dim;
  const std::string header = "{\"q_filters\":{\"dtype\":\"F32\",\"shape\":[" +
                             std::to_string(layers) + "," + std::to_string(kv_heads) + "," +
                             std::to_string(head_dim) + "],\"data_offsets\":[0," +
                             std::to_string(n * 4) + "]}}";
  std::ofstream f(path, std::ios::binary);
  const uint64_t len = header.size();
  for (int b = 0; b < 8; ++b) f.put(static_cast<char>((len >> (8 * b)) & 0xff));
  f << header;
  for (size_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 0.1) + 0.05);
    f.write(reinterpret_cast<const char*>(&v), sizeof v);
  }
  return path.string();
}

// layers, kv_heads, head_dim: the model's (duo_attention's patterns are per layer and KV head,
// qfilter's filters per layer, KV head and channel; without them these policies get none here,
// and the caller adds them once it knows the model).
inline std::map<std::string, std::string> required_options(const std::string& policy,
                                                           int layers = 0, int kv_heads = 0,
                                                           int head_dim = 0) {
  if (policy == "python") return {{"file", std::string(KVB_EXAMPLES_DIR) + "/policies/h2o.py"}};
  if (policy == "finch") return {{"window_size", "4"}};
  if (policy == "duo_attention" && layers > 0) {
    return {{"patterns", duo_patterns(layers, kv_heads)}, {"head_compression_ratio", "0.5"}};
  }
  if (policy == "qfilter" && layers > 0 && head_dim > 0) {
    return {{"filters", qfilter_filters(layers, kv_heads, head_dim)}};
  }
  return {};
}

// Whether `policy` needs options that depend on the model's shape (required_options with it).
inline bool needs_model_options(const std::string& policy) {
  return policy == "duo_attention" || policy == "qfilter";
}

}  // namespace kvb::testing_registry
