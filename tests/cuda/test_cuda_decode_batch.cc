// Issue 16 item 1 on the GPU: a decode batch of every policy (different prompt lengths, units
// leaving at different steps) against each sequence decoded alone on the same engine. The
// policies' decisions and their caches (lengths, positions, device rows) must be identical, the
// logits bit-identical when cuBLAS computes a row of an n-row GEMM as it computes the row alone,
// and otherwise within f32 reassociation (the test prints which held). Skips without a GPU or
// SmolLM2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/runtime.h"
#include "kernels/policies/policy.h"
#include "workers/engine/cuda_engine.h"
#include "workers/engine/generate.h"
#include "workers/model_session.h"

namespace kvb {
namespace {

namespace cu = kernels::cuda;
using engine::DType;

const std::string kSmol = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

struct Variant {
  std::string policy;  // "" = no policy
  std::map<std::string, std::string> options;
};

std::vector<Variant> variants() {
  std::vector<Variant> v = {{"", {}}};
  for (const auto& p : policies::policy_registry()) v.push_back({p.name, {}});
  v.push_back({"h2o", {{"gqa", "expand"}}});
  v.push_back({"streaming_llm", {{"positions", "rolling"}, {"evict", "before_attention"}}});
  v.push_back({"scissorhands", {{"threshold", "inv_position"}}});
  v.push_back({"tova", {{"tova_reduce", "layer"}}});
  return v;
}

std::unique_ptr<policies::Policy> make(const engine::Model& m, const Variant& v, int budget) {
  if (v.policy.empty()) return nullptr;
  policies::PolicyConfig pc;
  pc.name = v.policy;
  pc.kv_budget = budget;
  const auto& c = m.config;
  pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
  pc.options = policies::PolicyOptions(v.options);
  pc.seed = 5;
  return policies::make_policy(pc);
}

std::vector<int32_t> positions(const kernels::KvCache& c, int l, int h) {
  const int32_t* p = c.layer(l).position(h);
  return std::vector<int32_t>(p, p + c.length(l, h));
}

TEST(CudaDecodeBatch, EveryPolicyDecidesAsAloneAndLogitsAgree) {
  if (!cu::has_device()) GTEST_SKIP() << "no CUDA device visible";
  if (!std::ifstream(kSmol).good()) GTEST_SKIP() << kSmol << " missing (scripts/fetch_models.sh)";
  workers::LoadedModel lm = workers::load_model_and_tokenizer(kSmol, "");
  const engine::Model& m = *lm.model;
  engine::CudaEngine eng(m, DType::kF32);
  const std::vector<Variant> vars = variants();
  const int B = static_cast<int>(vars.size()), V = m.config.vocab_size, steps = 12, budget = 24;
  std::vector<std::unique_ptr<policies::Policy>> pa, pb;
  std::vector<kernels::KvCache> ca, cb;
  std::vector<int> stop(B);
  std::vector<float> logits;
  for (int b = 0; b < B; ++b) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < 40 + 3 * b; ++i) prompt.push_back((7 + 31 * i + 13 * b) % V);
    pa.push_back(make(m, vars[b], budget));
    pb.push_back(make(m, vars[b], budget));
    ca.push_back(eng.new_cache(0, pa[b].get()));
    cb.push_back(eng.new_cache(0, pb[b].get()));
    engine::prefill_prompt(eng, ca[b], prompt, pa[b].get(), &logits);
    engine::prefill_prompt(eng, cb[b], prompt, pb[b].get(), &logits);
    stop[b] = steps - b % 4;
  }
  double worst = 0;
  bool bitwise = true;
  for (int t = 0; t < steps; ++t) {
    std::vector<int32_t> tokens;
    std::vector<kernels::KvCache*> caches;
    std::vector<policies::Policy*> pols;
    std::vector<int> who;
    for (int b = 0; b < B; ++b) {
      if (t >= stop[b]) continue;
      tokens.push_back((3 + 17 * t + 29 * b) % V);
      caches.push_back(&cb[b]);
      pols.push_back(pb[b].get());
      who.push_back(b);
    }
    std::vector<float> batch;
    eng.decode_batch(tokens, caches, pols, &batch);
    ASSERT_EQ(batch.size(), tokens.size() * static_cast<size_t>(V));
    for (size_t i = 0; i < who.size(); ++i) {
      const int b = who[i];
      std::vector<float> alone;
      eng.forward({&tokens[i], 1}, ca[b], engine::LogitsMode::kLast, &alone, pa[b].get(),
                  engine::PolicyHook::kDecode);
      const float* row = batch.data() + i * static_cast<size_t>(V);
      bitwise = bitwise && std::memcmp(row, alone.data(), sizeof(float) * V) == 0;
      double diff = 0;
      for (int j = 0; j < V; ++j) diff = std::max(diff, std::fabs(double(row[j]) - alone[j]));
      worst = std::max(worst, diff);
      ASSERT_LE(diff, 1e-3) << "sequence " << b << " (" << vars[b].policy << ") step " << t;
    }
  }
  for (int b = 0; b < B; ++b) {
    SCOPED_TRACE(testing::Message() << "sequence " << b << " (" << vars[b].policy << ")");
    EXPECT_EQ(ca[b].next_position(), cb[b].next_position());
    for (int l = 0; l < m.config.num_layers; ++l) {
      for (int h = 0; h < ca[b].shape().num_kv_heads; ++h) {
        ASSERT_EQ(ca[b].length(l, h), cb[b].length(l, h)) << "layer " << l << " head " << h;
        EXPECT_EQ(positions(ca[b], l, h), positions(cb[b], l, h)) << "layer " << l;
      }
    }
  }
  std::printf("decode batch of %d on the GPU: logits %s (max |diff| %.3g against alone)\n", B,
              bitwise ? "bit-identical" : "not bit-identical", worst);
}

}  // namespace
}  // namespace kvb
