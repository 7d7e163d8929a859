// The options a test gives a registered policy when it runs every entry of the registry
// (policies::policy_registry()): none, except for policies that cannot be made without one.
// `python` needs its script: the example H2O (attention sums, per-head keep), so a registry loop
// runs a Python scorer through the same path as the native ones. `duo_attention` needs a pattern
// folder for the model's shape: duo_patterns writes one (scores made up per (layer, head), sink 4,
// recent 16) and half the heads stream. One place for this knowledge: a new policy with a required
// option adds its line here.
#pragma once

#include <unistd.h>

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

// layers, kv_heads: the model's (duo_attention's patterns are per layer and KV head; without
// them duo_attention gets none here, and the caller adds them once it knows the model).
inline std::map<std::string, std::string> required_options(const std::string& policy,
                                                           int layers = 0, int kv_heads = 0) {
  if (policy == "python") return {{"file", std::string(KVB_EXAMPLES_DIR) + "/policies/h2o.py"}};
  if (policy == "duo_attention" && layers > 0) {
    return {{"patterns", duo_patterns(layers, kv_heads)}, {"head_compression_ratio", "0.5"}};
  }
  return {};
}

}  // namespace kvb::testing_registry
