// Engine tests on stories260K (llama2.c checkpoint from ../shared): llama2.c's own expected
// greedy output, and laws of the forward pass (prefill == token-by-token decode; KV accounting).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "common/error.h"
#include "workers/engine/engine.h"
#include "workers/engine/generate.h"
#include "workers/formats/model_load.h"
#include "workers/model_session.h"

namespace kvb {
namespace {

const std::string kModel = std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin";
const std::string kTok = std::string(KVB_SHARED_DIR) + "/models/stories260K/tok512.bin";

class Stories : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // CI must fail, not skip, when ../shared is missing.
    ASSERT_TRUE(std::ifstream(kModel).good()) << kModel << " missing: ../shared must be beside the checkout";
    lm_ = new workers::LoadedModel(workers::load_model_and_tokenizer(kModel, kTok));
  }
  static void TearDownTestSuite() {
    delete lm_;
    lm_ = nullptr;
  }
  static workers::LoadedModel* lm_;
};
workers::LoadedModel* Stories::lm_ = nullptr;

TEST_F(Stories, ConfigMatchesHeader) {
  const engine::ModelConfig& c = lm_->model->config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_TRUE(c.tied_embeddings);
}

// llama2.c's test expectation for this model: greedy from BOS.
TEST_F(Stories, GreedyFromBosMatchesLlama2c) {
  engine::Engine eng(*lm_->model);
  std::vector<int32_t> prompt = workers::encode_prompt(*lm_, "", false, "");
  if (prompt.empty()) prompt.push_back(1);
  ASSERT_EQ(prompt, std::vector<int32_t>{1});
  kernels::KvCache cache = eng.new_cache(64);
  engine::GenerateOptions opt;
  opt.max_new_tokens = 60;
  opt.end_ids = lm_->end_ids;
  engine::GenerateResult r = engine::generate(eng, cache, prompt, opt);
  const std::string text = lm_->tokenizer->decode(r.tokens);
  const std::string expected =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park.";
  EXPECT_EQ(text.substr(0, expected.size()), expected) << "got: " << text;
}

// Teacher forcing (GenerateOptions::follow, `generate --follow-ids`). Following the model's own
// greedy continuation changes nothing: the same ids, each step's pick the followed id, with the
// same logit bits. Following another sequence, step i's pick is the argmax of the logits after
// prompt + follow[0..i), which one prefill of the whole sequence gives at every position (up to
// f32 summation order, as in PrefillEqualsIncrementalDecode); an end token picked does not stop it.
TEST_F(Stories, FollowingIsTeacherForcing) {
  engine::Engine eng(*lm_->model);
  const std::vector<int32_t> prompt = {1};
  engine::GenerateOptions opt;
  opt.max_new_tokens = 40;
  opt.end_ids = lm_->end_ids;
  kernels::KvCache c0 = eng.new_cache(64);
  const engine::GenerateResult greedy = engine::generate(eng, c0, prompt, opt);
  ASSERT_EQ(greedy.tokens.size(), 40u);
  EXPECT_TRUE(greedy.followed.empty());

  opt.follow = greedy.tokens;
  kernels::KvCache c1 = eng.new_cache(64);
  const engine::GenerateResult same = engine::generate(eng, c1, prompt, opt);
  EXPECT_EQ(same.tokens, greedy.tokens);
  ASSERT_EQ(same.followed.size(), greedy.tokens.size());
  for (size_t i = 0; i < same.followed.size(); ++i) {
    EXPECT_EQ(same.followed[i].pick, greedy.tokens[i]) << "step " << i;
    EXPECT_EQ(same.followed[i].pick_logit, same.followed[i].followed_logit) << "step " << i;
  }

  // Another text, with the end token (llama2.c's BOS/EOS is 1 or 2) inside it.
  tokenizer::EncodeOptions eo;
  std::vector<int32_t> follow = lm_->tokenizer->encode("Tom had a red ball. He", eo);
  follow.insert(follow.begin() + 3, lm_->end_ids.at(0));
  opt.follow = follow;
  opt.max_new_tokens = 100;  // the ids bound the steps
  kernels::KvCache c2 = eng.new_cache(64);
  const engine::GenerateResult forced = engine::generate(eng, c2, prompt, opt);
  EXPECT_EQ(forced.tokens, follow);
  EXPECT_FALSE(forced.hit_end);
  ASSERT_EQ(forced.followed.size(), follow.size());
  EXPECT_EQ(forced.decode_steps, static_cast<int>(follow.size()) - 1);  // the last is not fed

  std::vector<int32_t> whole = prompt;
  whole.insert(whole.end(), follow.begin(), follow.end());
  const int V = lm_->model->config.vocab_size;
  kernels::KvCache c3 = eng.new_cache(64);
  std::vector<float> all;
  eng.forward(whole, c3, engine::LogitsMode::kAll, &all);
  int picked_other = 0;
  for (size_t i = 0; i < follow.size(); ++i) {
    const float* row = all.data() + (prompt.size() - 1 + i) * V;
    const int32_t arg = static_cast<int32_t>(std::max_element(row, row + V) - row);
    EXPECT_EQ(forced.followed[i].pick, arg) << "step " << i;
    EXPECT_NEAR(forced.followed[i].pick_logit, row[arg], 1e-4) << "step " << i;
    EXPECT_NEAR(forced.followed[i].followed_logit, row[follow[i]], 1e-4) << "step " << i;
    picked_other += forced.followed[i].pick != follow[i];
  }
  EXPECT_GT(picked_other, 0) << "the followed text should part from the model's picks somewhere";

  // An id outside the vocabulary is refused at its step.
  opt.follow = {5, V};
  kernels::KvCache c4 = eng.new_cache(64);
  EXPECT_THROW(engine::generate(eng, c4, prompt, opt), Error);
}

// Law: a prefill of n tokens gives the same logits as feeding them one at a time (up to f32
// summation order), at every position.
TEST_F(Stories, PrefillEqualsIncrementalDecode) {
  engine::Engine eng(*lm_->model);
  tokenizer::EncodeOptions eo;
  eo.add_bos = true;
  std::vector<int32_t> ids = lm_->tokenizer->encode("Tom and his dog went to the big park.", eo);
  ASSERT_GT(ids.size(), 8u);
  const int V = lm_->model->config.vocab_size;
  kernels::KvCache c1 = eng.new_cache();
  std::vector<float> all;
  eng.forward(ids, c1, engine::LogitsMode::kAll, &all);
  ASSERT_EQ(all.size(), ids.size() * V);
  kernels::KvCache c2 = eng.new_cache();
  std::vector<float> one;
  double max_diff = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    eng.forward({&ids[t], 1}, c2, engine::LogitsMode::kLast, &one);
    for (int v = 0; v < V; ++v) max_diff = std::max(max_diff, std::fabs(double(one[v]) - all[t * V + v]));
  }
  EXPECT_LT(max_diff, 1e-4) << "prefill vs decode logits differ by " << max_diff;
  // Both caches hold every token in every head, with positions 0..n-1.
  for (int l = 0; l < 5; ++l) {
    for (int h = 0; h < 4; ++h) {
      ASSERT_EQ(c1.length(l, h), static_cast<int>(ids.size()));
      kernels::LayerKvView v = c1.layer(l);
      for (size_t s = 0; s < ids.size(); ++s) EXPECT_EQ(v.position(h)[s], static_cast<int>(s));
    }
  }
  // Logical bytes = slots x (key + value + position).
  EXPECT_EQ(c1.logical_bytes(), size_t(5 * 4) * ids.size() * (2 * 8 * sizeof(float) + 4));
  EXPECT_EQ(c1.next_position(), static_cast<int32_t>(ids.size()));
}

// Same inputs, same bits (determinism across runs and thread schedules).
TEST_F(Stories, Deterministic) {
  engine::Engine eng(*lm_->model);
  std::vector<int32_t> ids = {1, 20, 30, 40, 50, 60, 70, 80};
  std::vector<float> a, b;
  kernels::KvCache c1 = eng.new_cache(), c2 = eng.new_cache();
  eng.forward(ids, c1, engine::LogitsMode::kAll, &a);
  eng.forward(ids, c2, engine::LogitsMode::kAll, &b);
  EXPECT_EQ(a, b);
}

TEST_F(Stories, BadTokenIdIsAnError) {
  engine::Engine eng(*lm_->model);
  kernels::KvCache c = eng.new_cache();
  std::vector<int32_t> ids = {1, 512};
  std::vector<float> out;
  EXPECT_THROW(eng.forward(ids, c, engine::LogitsMode::kLast, &out), Error);
}

TEST(Llama2cFormat, TruncatedFileIsAnError) {
  // A header that promises far more weights than the file holds.
  const std::string path = std::string(KVB_BINARY_DIR) + "/truncated_llama2c.bin";
  {
    std::ofstream out(path, std::ios::binary);
    int32_t hdr[7] = {64, 172, 5, 8, 4, 512, 512};
    out.write(reinterpret_cast<const char*>(hdr), sizeof(hdr));
    std::vector<float> some(1000, 0.5f);
    out.write(reinterpret_cast<const char*>(some.data()), some.size() * 4);
  }
  try {
    engine::load_model(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not match the header"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvb
