// SmolLM2-135M-Instruct (Q4_1 GGUF) against golden logits from Hugging Face transformers loading
// the same GGUF (scripts/make_logits_fixture.py). Both dequantize the same blocks to the same f32
// weights, so the remaining difference is f32 summation order over 30 layers; we allow 1e-3
// absolute on logits of magnitude ~10-30 (measured: 7e-5, printed) and require the top-5 sets
// to agree wherever the reference's 5th and 6th logits are separated by more than that.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "workers/engine/engine.h"
#include "workers/engine/model.h"
#include "workers/formats/model_load.h"

namespace kvb {
namespace {

const std::string kModel = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
const std::string kFixture = std::string(KVB_FIXTURES_DIR) + "/engine/smollm2_logits.json";
constexpr double kTol = 1e-3;

TEST(SmolLM2, LogitsMatchTransformers) {
  ASSERT_TRUE(std::ifstream(kModel).good()) << kModel << " missing: run scripts/fetch_models.sh";
  std::ifstream f(kFixture);
  ASSERT_TRUE(f.good()) << kFixture;
  nlohmann::json fx = nlohmann::json::parse(f);
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  ASSERT_EQ(model->config.arch, "llama");
  ASSERT_EQ(model->config.num_layers, 30);
  engine::Engine eng(*model);
  const int V = model->config.vocab_size;
  const std::vector<int> sample_ids = fx["sample_ids"].get<std::vector<int>>();
  int checked_long = 0;
  for (const auto& cs : fx["cases"]) {
    const std::vector<int32_t> ids = cs["ids"].get<std::vector<int32_t>>();
    kernels::KvCache cache = eng.new_cache(static_cast<int>(ids.size()));
    std::vector<float> logits;
    eng.forward(ids, cache, engine::LogitsMode::kAll, &logits);
    ASSERT_EQ(logits.size(), ids.size() * V);
    double max_diff = 0;
    int top5_agree = 0, rows = 0;
    for (const auto& row : cs["rows"]) {
      const int p = row["position"];
      const float* got = &logits[static_cast<size_t>(p) * V];
      const auto top_ids = row["top_ids"].get<std::vector<int>>();
      const auto top_logits = row["top_logits"].get<std::vector<double>>();
      const auto samples = row["sample_logits"].get<std::vector<double>>();
      for (size_t i = 0; i < top_ids.size(); ++i) {
        max_diff = std::max(max_diff, std::fabs(got[top_ids[i]] - top_logits[i]));
      }
      for (size_t i = 0; i < sample_ids.size(); ++i) {
        max_diff = std::max(max_diff, std::fabs(got[sample_ids[i]] - samples[i]));
      }
      // Our top-5 (ties to the lower id) vs the reference's.
      std::vector<int> order(V);
      for (int i = 0; i < V; ++i) order[i] = i;
      std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                        [&](int a, int b) { return got[a] > got[b] || (got[a] == got[b] && a < b); });
      std::vector<int> ours(order.begin(), order.begin() + 5), ref(top_ids.begin(), top_ids.begin() + 5);
      std::sort(ours.begin(), ours.end());
      std::sort(ref.begin(), ref.end());
      const bool same = ours == ref;
      top5_agree += same;
      ++rows;
      if (top_logits[4] - top_logits[5] > 2 * kTol) {
        EXPECT_TRUE(same) << cs["name"] << " position " << p << ": top-5 sets differ";
      }
      EXPECT_EQ(order[0], top_ids[0]) << cs["name"] << " position " << p << ": top-1 differs";
      // The log-partition function too (catches an error spread thinly over the whole vocab).
      double m = -1e30, s = 0;
      for (int v = 0; v < V; ++v) m = std::max(m, double(got[v]));
      for (int v = 0; v < V; ++v) s += std::exp(double(got[v]) - m);
      EXPECT_NEAR(m + std::log(s), row["logsumexp"].get<double>(), kTol) << cs["name"] << " " << p;
    }
    std::cout << "[ smollm2 ] " << cs["name"].get<std::string>() << ": " << ids.size()
              << " tokens, max |logit - transformers| = " << max_diff << ", top-5 agreement "
              << top5_agree << "/" << rows << " positions\n";
    RecordProperty(cs["name"].get<std::string>() + "_max_abs_diff", std::to_string(max_diff));
    EXPECT_LT(max_diff, kTol) << cs["name"];
    if (ids.size() > 1000) ++checked_long;
  }
  EXPECT_GE(checked_long, 1) << "the fixture must include a prompt over 1,000 tokens";
}

}  // namespace
}  // namespace kvb
