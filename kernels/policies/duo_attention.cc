// `duo_attention` (kvpress DuoAttentionPress; Xiao et al. 2024, "DuoAttention: Efficient
// Long-Context LLM Inference with Retrieval and Streaming Heads"; kernels/policies/README.md
// "kvpress's presses"): the heads are split by the authors' published per-head scores into
// retrieval heads, which keep the whole prompt, and streaming heads, which keep its first
// sink_size and last recent_size tokens. The scores are read from the folder the option
// `patterns` names, as the DuoAttention repository publishes them per model
// (attn_patterns/<model>/full_attention_heads.tsv, one row per layer and one tab-separated column
// per KV head, and config.json with sink_size and recent_size); kvbench never downloads them. The
// round(heads x head_compression_ratio) lowest-scoring heads of the model stream (Python's round,
// halves to even; equal scores: the lower (layer, head) first). After the prompt only, as kvpress
// (no decode eviction); kv_budget does not decide.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "common/error.h"
#include "common/file_io.h"
#include "kernels/policies/policies.h"

namespace kvb::policies {
namespace {

struct DuoPatterns {
  int sink = 0, recent = 0;
  std::vector<double> scores;  // [layers * kv_heads], clipped to [0, 1]
};

std::string read_small_file(const std::string& path, const std::string& what) {
  require_regular_file(path, what, "give the DuoAttention pattern folder's own file");
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  KVB_USAGE_CHECK(ec || size <= (64u << 20))
      << what << " '" << path << "' is over 64 MiB (" << size << " bytes); DuoAttention's files "
      << "are a few KiB";
  std::ifstream in(path, std::ios::binary);
  KVB_USAGE_CHECK(in.good()) << what << " '" << path
                             << "' cannot be opened; give the folder of the DuoAttention "
                                "authors' attn_patterns/<model> (full_attention_heads.tsv, "
                                "config.json)";
  std::ostringstream s;
  s << in.rdbuf();
  KVB_USAGE_CHECK(s.str().size() <= (64u << 20)) << what << " '" << path << "' is over 64 MiB";
  return s.str();
}

DuoPatterns load_patterns(const std::string& dir, int layers, int kv_heads) {
  const std::string where = "policy duo_attention: patterns=" + dir;
  KVB_USAGE_CHECK(!dir.empty())
      << "policy duo_attention needs the option patterns=DIR, the folder of the DuoAttention "
         "authors' published head scores for this model (attn_patterns/<model> of "
         "github.com/mit-han-lab/duo-attention: full_attention_heads.tsv and config.json); "
         "kvbench does not download them";
  std::error_code ec;  // a symbolic link loop or an unreadable path is no folder, not a throw
  KVB_USAGE_CHECK(std::filesystem::is_directory(dir, ec))
      << where << " is not a folder; give the folder holding full_attention_heads.tsv and "
      << "config.json";
  DuoPatterns p;
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(read_small_file(config_path, "DuoAttention config"));
  } catch (const nlohmann::json::exception& e) {
    KVB_USAGE_FAIL() << config_path << " is not JSON: " << e.what();
  }
  auto size_of = [&](const char* key) {
    KVB_USAGE_CHECK(config.is_object() && config.contains(key) &&
                    config.at(key).is_number_integer() && config.at(key).get<int64_t>() >= 0 &&
                    config.at(key).get<int64_t>() <= (1 << 30))
        << config_path << " must give " << key << " as a non-negative integer (DuoAttention's "
        << "config.json has sink_size and recent_size)";
    return static_cast<int>(config.at(key).get<int64_t>());
  };
  p.sink = size_of("sink_size");
  p.recent = size_of("recent_size");
  const std::string tsv_path = (std::filesystem::path(dir) / "full_attention_heads.tsv").string();
  std::istringstream tsv(read_small_file(tsv_path, "DuoAttention head scores"));
  int row = 0;
  for (std::string line; std::getline(tsv, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // np.loadtxt skips these
    ++row;
    KVB_USAGE_CHECK(row <= layers)
        << tsv_path << " has more than " << layers << " rows; the model has " << layers
        << " layers (one row per layer): patterns of another model?";
    std::istringstream cells(line);
    int col = 0;
    for (std::string cell; std::getline(cells, cell, '\t');) {
      ++col;
      char* end = nullptr;
      const double v = std::strtod(cell.c_str(), &end);
      KVB_USAGE_CHECK(!cell.empty() && end == cell.c_str() + cell.size() && std::isfinite(v))
          << tsv_path << ":" << row << ": column " << col << " '" << cell
          << "' is not a finite number";
      p.scores.push_back(std::clamp(v, 0.0, 1.0));  // kvpress clips to [0, 1]
    }
    KVB_USAGE_CHECK(col == kv_heads)
        << tsv_path << ":" << row << ": " << col << " columns for a model of " << kv_heads
        << " KV heads (one tab-separated column per KV head): patterns of another model?";
  }
  KVB_USAGE_CHECK(row == layers) << tsv_path << " has " << row << " rows for a model of " << layers
                                 << " layers (one row per layer): patterns of another model?";
  return p;
}

class DuoAttention final : public Policy {
 public:
  explicit DuoAttention(const PolicyConfig& c) : Policy(c) {
    const double ratio = c.options.get_double("head_compression_ratio", 0.0, 0.0, 1.0);
    const std::string dir = c.options.get_string("patterns", "");
    const int layers = c.shape.num_layers, heads = c.shape.num_kv_heads;
    const DuoPatterns p = load_patterns(dir, layers, heads * tp_size());
    sink_ = p.sink;
    recent_ = p.recent;
    // The n lowest scores stream: Python's round(size x ratio) (halves to even).
    const int total = static_cast<int>(p.scores.size());
    const int n = static_cast<int>(std::nearbyint(total * ratio));
    std::vector<int> order(total);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return p.scores[a] < p.scores[b]; });
    streaming_.assign(total, 0);
    for (int i = 0; i < n; ++i) streaming_[order[i]] = 1;
    kv_heads_ = heads * tp_size();
  }

  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    const int group = cache_kv_heads() / config().shape.num_kv_heads;  // gqa=expand copies
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      const int kv = global_head(h) / group;
      if (!streaming_[static_cast<size_t>(st.layer) * kv_heads_ + kv]) continue;
      const int len = cache.length(st.layer, h);
      if (len <= sink_ + recent_) continue;
      plan.drop(h, sink_, len - sink_ - recent_, len);
    }
  }
  std::unique_ptr<Policy> clone() const override { return std::make_unique<DuoAttention>(*this); }

 private:
  int sink_ = 0, recent_ = 0, kv_heads_ = 0;
  std::vector<uint8_t> streaming_;  // [layers * kv_heads] of the whole model
};

}  // namespace

PolicyInfo duo_attention_policy_info() {
  return {"duo_attention",
          "DuoAttention (DuoAttentionPress): the heads with the lowest published retrieval scores "
          "keep only their sink and recent tokens, the others the whole prompt (patterns=DIR)",
          {{"patterns",
            "",
            "folder of the authors' head scores for this model (attn_patterns/<model>: "
            "full_attention_heads.tsv, config.json with sink_size and recent_size); required, "
            "never downloaded",
            {}},
           {"head_compression_ratio",
            "0.0",
            "fraction of the model's KV heads that stream (the lowest scores; kvpress's default "
            "0 keeps every head whole)",
            {}}},
          [](const PolicyConfig& c) { return std::make_unique<DuoAttention>(c); }};
}

}  // namespace kvb::policies
