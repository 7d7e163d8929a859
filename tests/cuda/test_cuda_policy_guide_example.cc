// CPU/CUDA parity of the guide's example policy, `prompt_heavy` (examples/policies/cpp/
// prompt_heavy.cc; kernels/policies/README.md "CPU/CUDA parity"). The policy is written once
// against the ops table, so the same hooks run on CpuPolicyOps and CudaPolicyOps:
//  - ops level: one layer of ragged heads (lengths 1, 3, 7, 17, 4097), GQA groups 1 and 4,
//    mean and max, column sums with many ties: the prefill hook and six decode steps keep the
//    same slots on both instances (the CPU's host plans against the device's lists), and the
//    state bytes agree;
//  - engine level: the CPU engine and the GPU engine (f32), teacher-forced on the CPU's greedy
//    tokens, keep the same positions per (layer, head) at a budget that evicts, with logits
//    within 1e-2 at every step (as every registered policy in test_cuda_engine.cc), and at a
//    budget above everything keep every token (tiny Qwen3 fixture; SmolLM2 where fetched).
// Skips without a CUDA device (compiled in every CUDA build; run on a GPU machine).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/runtime.h"
#include "kernels/ops/cpu_policy_ops.h"
#include "kernels/policies/extra_policies.h"
#include "kernels/policies/policy.h"
#include "parity_util.h"
#include "policy_ops_fixture.h"
#include "workers/engine/cuda_engine.h"
#include "workers/engine/engine.h"
#include "workers/engine/generate.h"
#include "workers/engine/model.h"
#include "workers/formats/model_load.h"
#include "workers/model_session.h"

namespace kvb {
namespace policies {
PolicyInfo prompt_heavy_policy_info();  // examples/policies/cpp/prompt_heavy.cc
}  // namespace policies
namespace {

namespace cu = kernels::cuda;
using kernels::EvictionPlan;
using kernels::KvCache;

const policies::PolicyInfo& example() {
  static const policies::PolicyInfo info = policies::prompt_heavy_policy_info();
  return info;
}

std::unique_ptr<policies::Policy> make(int budget, const policies::ModelShape& shape,
                                       const std::map<std::string, std::string>& opts) {
  policies::PolicyConfig pc;
  pc.name = example().name;
  pc.kv_budget = budget;
  pc.shape = shape;
  pc.options = policies::PolicyOptions(opts);
  return policies::make_policy(example(), pc);
}

class PromptHeavyOpsParity : public parity::PolicyOpsFixture {
 protected:
  // Both plans keep the same slots in every head; then each is applied to its cache (the device
  // lists to the index and the device rows, as the engine does) and the positions agree.
  void expect_same_and_apply(const EvictionPlan& cplan, const EvictionPlan& gplan) {
    const int heads = host_.shape().num_kv_heads;
    if (gplan.on_device()) {
      const std::vector<int32_t> lists =
          parity::to_host(gplan.device_slots(), static_cast<size_t>(heads) * gplan.device_ld());
      for (int h = 0; h < heads; ++h) {
        parity::expect_same_keep_list(gplan, lists, cplan, h, host_.length(0, h));
      }
    } else {
      for (int h = 0; h < heads; ++h) {
        EXPECT_EQ(cplan.kind(h), EvictionPlan::Kind::kKeepAll) << "head " << h;
        EXPECT_EQ(gplan.kind(h), EvictionPlan::Kind::kKeepAll) << "head " << h;
      }
    }
    host_.apply(cplan);
    index_.apply(gplan);
    if (gplan.on_device()) {
      auto* rows = dynamic_cast<cu::DeviceKvCache*>(index_.device_rows());
      ASSERT_NE(rows, nullptr);
      rows->keep_slots(0, gplan.device_slots(), gplan.device_ld(), gplan.device_counts().data(),
                       stream_, /*validated=*/true);
    }
    for (int h = 0; h < heads; ++h) {
      ASSERT_EQ(index_.length(0, h), host_.length(0, h)) << "head " << h;
      const int32_t* a = index_.layer(0).position(h);  // read back from the device if stale
      const int32_t* b = host_.layer(0).position(h);
      EXPECT_EQ(std::vector<int32_t>(a, a + host_.length(0, h)),
                std::vector<int32_t>(b, b + host_.length(0, h)))
          << "head " << h;
    }
  }

  // The engine's decode append: one new position in every head of both caches.
  void append_token(int32_t position) {
    auto* rows = dynamic_cast<cu::DeviceKvCache*>(index_.device_rows());
    const std::vector<float> kv(8, 0.5f);
    const cu::DeviceBuffer<float> dkv = parity::to_device(kv);
    for (int h = 0; h < host_.shape().num_kv_heads; ++h) {
      host_.append(0, h, kv.data(), kv.data(), position);
      index_.append(0, h, nullptr, nullptr, position);
      rows->append(0, h, dkv.data(), dkv.data(), position, stream_);
    }
    KVB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
};

TEST_F(PromptHeavyOpsParity, PrefillAndDecodeKeepTheCpuSlots) {
  const std::vector<int> lens = {1, 3, 7, 17, 4097};
  const int heads = static_cast<int>(lens.size());
  const int steps = 6;
  for (const int budget : {5, 40}) {
    for (const int group : {1, 4}) {
      for (const char* reduce : {"mean", "max"}) {
        SCOPED_TRACE(testing::Message()
                     << "budget " << budget << " group " << group << " " << reduce);
        make_caches(lens, steps);  // slot s of head h at position 3s + h
        const policies::ModelShape shape = {2, heads * group, heads, 8, 8192};
        const std::map<std::string, std::string> opts = {{"gqa_reduce", reduce}};
        std::unique_ptr<policies::Policy> cp = make(budget, shape, opts);
        std::unique_ptr<policies::Policy> gp = make(budget, shape, opts);
        ASSERT_TRUE(gp->decides_with_ops());
        const int stride = 4097;
        const std::vector<float> sums =
            parity::tied_vec(static_cast<size_t>(heads) * group * stride, 90 + budget + group, 6);
        const cu::DeviceBuffer<float> dsums = parity::to_device(sums);
        policies::LayerStats st;
        st.layer = 0;  // the caches have one layer; the policy's layer 0 of 2
        st.n_new = stride;
        st.num_heads = heads * group;
        st.stride = stride;
        st.col_sums = sums.data();
        st.ops = &cpu_;
        EvictionPlan cplan, gplan;
        cplan.reset(0, heads);
        gplan.reset(0, heads);
        cp->on_prefill_layer(st, host_, cplan);
        st.col_sums = dsums.data();
        st.ops = gpu_.get();
        gp->on_prefill_layer(st, index_, gplan);
        ASSERT_NO_FATAL_FAILURE(expect_same_and_apply(cplan, gplan));
        EXPECT_EQ(gp->state_bytes(), cp->state_bytes());
        for (int s = 0; s < steps; ++s) {
          SCOPED_TRACE(testing::Message() << "decode step " << s + 1);
          append_token(3 * stride + s);  // after every head's positions (3 slot + head)
          policies::LayerStats dt;       // the policy asks for no statistics at decode
          dt.layer = 0;
          dt.n_new = 1;
          dt.num_heads = heads * group;
          dt.ops = &cpu_;
          cplan.reset(0, heads);
          gplan.reset(0, heads);
          cp->on_decode_layer(dt, host_, cplan);
          dt.ops = gpu_.get();
          gp->on_decode_layer(dt, index_, gplan);
          ASSERT_NO_FATAL_FAILURE(expect_same_and_apply(cplan, gplan));
          EXPECT_EQ(gp->state_bytes(), cp->state_bytes());
          for (int h = 0; h < heads; ++h) EXPECT_LE(host_.length(0, h), budget) << "head " << h;
        }
      }
    }
  }
}

// ---- engine level ---------------------------------------------------------------------------

struct EngineRun {
  std::vector<std::vector<float>> logits;  // after the prompt, then after each forced token
  std::vector<std::vector<int32_t>> keep;  // final positions per (layer, head)
};

EngineRun run(engine::Engine& eng, const engine::Model& m, int budget,
              const std::vector<int32_t>& prompt, const std::vector<int32_t>& forced) {
  const auto& c = m.config;
  std::unique_ptr<policies::Policy> policy =
      make(budget, {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len}, {});
  KvCache cache = eng.new_cache(0, policy.get());
  EngineRun r;
  std::vector<float> logits;
  engine::prefill_prompt(eng, cache, prompt, policy.get(), &logits);
  r.logits.push_back(logits);
  for (int32_t t : forced) {
    eng.forward({&t, 1}, cache, engine::LogitsMode::kLast, &logits, policy.get(),
                engine::PolicyHook::kDecode);
    r.logits.push_back(logits);
  }
  for (int l = 0; l < c.num_layers; ++l) {
    const kernels::LayerKvView v = cache.layer(l);
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      r.keep.emplace_back(v.position(h), v.position(h) + cache.length(l, h));
    }
  }
  return r;
}

// The CPU's greedy continuation of `prompt`, teacher-forced into both engines.
void expect_gpu_keeps_the_cpu_sets(const engine::Model& m, const std::vector<int32_t>& prompt,
                                   int gen) {
  engine::Engine cpu(m);
  engine::Engine gpu(m, engine::cuda_backend(m, engine::DType::kF32));
  std::vector<int32_t> forced;
  {
    KvCache cache = cpu.new_cache(static_cast<int>(prompt.size()) + gen);
    engine::GenerateOptions opt;
    opt.max_new_tokens = gen;  // no end ids: always gen tokens
    forced = engine::generate(cpu, cache, prompt, opt).tokens;
  }
  const int n = static_cast<int>(prompt.size());
  const int total = n + static_cast<int>(forced.size());
  for (const int budget : {std::max(8, n / 3), total + 8}) {
    SCOPED_TRACE(testing::Message() << "budget " << budget);
    const EngineRun a = run(cpu, m, budget, prompt, forced);
    const EngineRun g = run(gpu, m, budget, prompt, forced);
    ASSERT_EQ(a.logits.size(), g.logits.size());
    for (size_t s = 0; s < a.logits.size(); ++s) {
      ASSERT_EQ(a.logits[s].size(), g.logits[s].size());
      double worst = 0;
      for (size_t i = 0; i < a.logits[s].size(); ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(a.logits[s][i]) - g.logits[s][i]));
      }
      EXPECT_LT(worst, 1e-2) << "step " << s;
    }
    EXPECT_EQ(a.keep, g.keep);
    size_t kept = 0;
    for (const auto& k : a.keep) kept += k.size();
    if (budget > total) {
      EXPECT_EQ(kept, a.keep.size() * total) << "a budget above everything evicted";
    } else {
      EXPECT_LT(kept, a.keep.size() * total) << "budget " << budget << " evicted nothing";
    }
  }
}

TEST(PromptHeavyEngineParity, Qwen3TinyF32) {
  if (!cu::has_device()) GTEST_SKIP() << "no CUDA device visible";
  std::unique_ptr<engine::Model> m =
      engine::load_model(std::string(KVB_FIXTURES_DIR) + "/engine/qwen3_tiny.gguf");
  const std::string text = "A prompt of bytes for the example policy on the GPU.";
  expect_gpu_keeps_the_cpu_sets(*m, std::vector<int32_t>(text.begin(), text.end()), 12);
}

TEST(PromptHeavyEngineParity, SmolLM2F32) {
  if (!cu::has_device()) GTEST_SKIP() << "no CUDA device visible";
  const std::string path = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::ifstream(path).good()) GTEST_SKIP() << path << " missing (scripts/fetch_models.sh)";
  workers::LoadedModel lm = workers::load_model_and_tokenizer(path, "");
  const std::vector<int32_t> ids = workers::encode_prompt(
      lm, "Explain in simple words why the sky is blue during the day and red at sunset.",
      /*chat=*/true, "");
  expect_gpu_keeps_the_cpu_sets(*lm.model, ids, 16);
}

}  // namespace
}  // namespace kvb
