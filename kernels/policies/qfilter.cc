// `qfilter` (kvpress QFilterPress; Godey et al. 2025, "Q-Filters: Leveraging QK geometry for
// efficient KV cache compression"; POLICIES.md "kvpress's presses"): after the prompt each KV
// head keeps the kv_budget tokens whose keys (as cached, post-RoPE) have the lowest dot product
// with the head's published filter: score = -(filter . key). The filters are the authors' per
// (layer, KV head) vectors for the model, read from the file the option `filters` names (the
// `model.safetensors` of the published folder, its tensor `q_filters` [layers, KV heads,
// head_dim] in Hugging Face's channel order); kvbench never downloads them and refuses to run
// without them. The score is the vocabulary's quadratic_scores with the filter as the "mean"
// and no covariance (a = -1, b = 0), so it runs where the cache lives.
#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/rope.h"
#include "kernels/formats/safetensors.h"
#include "kernels/policies/policies.h"
#include "kernels/policies/scorer.h"

namespace kvb::policies {
namespace {

// The filters of a model of `layers` x `kv_heads` x `head_dim`, validated: the file's tensor
// `q_filters` of exactly that shape (f32, f16 or bf16), every entry finite.
std::vector<float> load_filters(const std::string& path, int layers, int kv_heads, int head_dim) {
  KVB_USAGE_CHECK(!path.empty())
      << "policy qfilter needs the option filters=FILE, the model.safetensors of the Q-Filters "
         "authors' published filters for this model (huggingface.co/nthngdy/<model>_qfilt); "
         "kvbench does not download them";
  std::unique_ptr<formats::SafetensorsFile> f;
  try {
    f = formats::SafetensorsFile::open(path);
  } catch (const Error& e) {
    KVB_USAGE_FAIL() << "policy qfilter: filters=" << path << ": " << e.what();
  }
  const formats::SafetensorsTensorInfo* t = f->find_tensor("q_filters");
  KVB_USAGE_CHECK(t != nullptr) << "policy qfilter: filters=" << path
                                << " holds no tensor q_filters (the Q-Filters file's only one)";
  const std::vector<uint64_t> want = {static_cast<uint64_t>(layers),
                                      static_cast<uint64_t>(kv_heads),
                                      static_cast<uint64_t>(head_dim)};
  auto shape_text = [](const std::vector<uint64_t>& s) {
    std::string out;
    for (uint64_t x : s) out += (out.empty() ? "" : " x ") + std::to_string(x);
    return out;
  };
  KVB_USAGE_CHECK(t->shape == want)
      << "policy qfilter: filters=" << path << " holds q_filters of " << shape_text(t->shape)
      << "; this model needs " << shape_text(want)
      << " (layers x KV heads x head_dim): filters of another model?";
  KVB_USAGE_CHECK(formats::safetensors_dtype_convertible(t->dtype))
      << "policy qfilter: filters=" << path << ": q_filters is " << t->dtype
      << "; F32, F16 or BF16 expected";
  std::vector<float> v = f->load_f32("q_filters", want);
  for (size_t i = 0; i < v.size(); ++i) {
    KVB_USAGE_CHECK(std::isfinite(v[i]))
        << "policy qfilter: filters=" << path << ": q_filters entry " << i << " (layer "
        << i / (static_cast<size_t>(kv_heads) * head_dim) << ") is not finite";
  }
  return v;
}

class QFilter final : public CacheScorer {
 public:
  explicit QFilter(const PolicyConfig& c)
      : CacheScorer(c),
        filters_(load_filters(c.options.get_string("filters", ""), c.shape.num_layers,
                              c.shape.num_kv_heads * tp_size(), c.shape.head_dim)) {
    KVB_USAGE_CHECK(!c.options.get_bool("threshold_decode", false))
        << "policy qfilter: threshold_decode scores each generated token alone, and a token's "
           "filter score depends on its key; use threshold without it";
  }

  std::unique_ptr<Policy> clone() const override { return std::make_unique<QFilter>(*this); }

 protected:
  float lone_score() const override {
    KVB_FAIL() << "policy qfilter has no score of a token alone (threshold_decode is refused)";
  }
  SlotRows& score(PolicyOps& ops, const LayerStats& st, const kernels::KvIndex& cache) override {
    const int heads = cache.shape().num_kv_heads, d = cache.shape().head_dim;
    // The cache's rows rotate adjacent pairs where the model's do (a GGUF llama's), the filters
    // are in HF's channel order: row j of head h reads the filter's channel hf_channel_of_row(j).
    const bool adjacent = st.rope && st.rope->style == kernels::cpu::RopeStyle::kNorm;
    const int rot = st.rope ? st.rope->rot_dim : d;
    const int model_kv = config_.shape.num_kv_heads * tp_size();
    const int per_kv = gqa_expand() ? cache_kv_heads() / config_.shape.num_kv_heads : 1;
    rowwise_.resize(static_cast<size_t>(heads) * d);
    for (int h = 0; h < heads; ++h) {
      const int kv = global_head(h) / per_kv;  // the model's KV head of cache head h
      // The model's layer (a `block` or `chunk` scratch cache is a layer 0 of its own).
      const float* f = &filters_[(static_cast<size_t>(model_layer()) * model_kv + kv) * d];
      for (int j = 0; j < d; ++j) {
        rowwise_[static_cast<size_t>(h) * d + j] = f[kernels::cpu::hf_channel_of_row(j, adjacent, rot)];
      }
    }
    SlotRows& filter = rows_of(filter_.rows, ops, SlotType::kF32, 1, heads);
    ops.write_rows(filter, 0, rowwise_, d);
    SlotRows& score = rows_of(score_.rows, ops, SlotType::kF32, 1, heads);
    ops.quadratic_scores(score, 0, cache, st.layer, filter, 0, /*group=*/1, /*a=*/-1.0, /*b=*/0.0);
    return score;
  }

 private:
  std::vector<float> filters_;  // [layers, model KV heads, head_dim], HF's channel order
  std::vector<float> rowwise_;  // this layer's, in the cache's row order
  ScratchRows filter_, score_;
};

}  // namespace

PolicyInfo qfilter_policy_info() {
  return {"qfilter",
          "keep the kv_budget tokens whose keys have the lowest dot product with the head's "
          "published Q-filter (QFilterPress; filters=FILE, never downloaded)",
          with_wrappers({{"filters", "",
                          "the Q-Filters authors' model.safetensors for this model (tensor "
                          "q_filters: layers x KV heads x head_dim; huggingface.co/nthngdy/"
                          "<model>_qfilt); required"}}),
          [](const PolicyConfig& c) { return std::make_unique<QFilter>(c); }};
}

}  // namespace kvb::policies
