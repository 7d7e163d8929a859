// Tensor parallelism (issue "Multi-GPU workers") in one process: ranks are threads joined by a
// ThreadComm (the same rank-order reduction as the MPI communicator). On a random-weight
// Llama-shaped model with 16 query / 8 KV heads: sharding rules and errors, logits of tensor
// parallelism 2 and 4 against one device, Ada-KV per-head budgets bit-identical for TP 1, 2 and
// 4, and keep-sets identical for policies that decide per head (with global seeds) or per layer.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <thread>

#include "common/error.h"
#include "kernels/comm_threads.h"
#include "kernels/policies/snapkv_family.h"
#include "tp_test_model.h"
#include "workers/engine/engine.h"
#include "workers/engine/generate.h"
#include "workers/engine/tensor_parallel.h"
#include "workers/formats/model_load.h"

namespace kvb::engine {
namespace {

const Model& random_model() {
  static std::unique_ptr<Model> m = [] {
    const std::string path =
        (std::filesystem::temp_directory_path() / "kvb_test_tp_random_llama.gguf").string();
    EXPECT_TRUE(testing::write_random_llama_gguf(path)) << path;
    return load_model(path);
  }();
  return *m;
}

// What one rank saw: logits after the prompt and after each decode step, per-layer head budgets
// (SnapKV family) and the final keep-sets, per (layer, global KV head).
struct RankRun {
  std::vector<std::vector<float>> logits;
  std::map<std::pair<int, int>, std::vector<int32_t>> keep;
  std::map<std::pair<int, int>, int32_t> budget;
};

std::vector<int32_t> prompt_tokens(int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>(testing::tp_model_mix(i) % 512);
  return t;
}

// Runs the model split over `size` thread ranks: prompt prefill (with `policy`, if any), then
// `steps` greedy decode steps. Returns every rank's run.
std::vector<RankRun> run_tp(int size, const std::string& policy, int budget, int prompt_len,
                            int steps, const std::map<std::string, std::string>& opts = {}) {
  const Model& full = random_model();
  kernels::ThreadGroup group(size);
  std::vector<RankRun> runs(size);
  std::vector<std::string> errors(size);
  auto body = [&](int r) {
    try {
      omp_set_num_threads(1);
      kernels::ThreadComm comm(group, r);
      const Model shard = shard_model(full, r, size);
      Engine engine(shard, &comm);
      const ModelConfig& c = shard.config;
      std::unique_ptr<policies::Policy> p;
      if (!policy.empty()) {
        policies::PolicyConfig pc;
        pc.name = policy;
        pc.kv_budget = budget;
        pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
        pc.options = policies::PolicyOptions(opts);
        pc.seed = 7;
        pc.tp = &comm;
        p = policies::make_policy(pc);
      }
      kernels::KvCache cache = engine.new_cache(prompt_len + steps + 1, p.get());
      std::vector<float> logits;
      prefill_prompt(engine, cache, prompt_tokens(prompt_len), p.get(), &logits);
      runs[r].logits.push_back(logits);
      if (auto* f = dynamic_cast<policies::SnapKvFamily*>(p.get())) {
        for (int l = 0; l < c.num_layers; ++l) {
          const std::vector<int32_t>& b = f->head_budgets(l);
          for (size_t h = 0; h < b.size(); ++h) runs[r].budget[{l, p->global_head(h)}] = b[h];
        }
      }
      for (int s = 0; s < steps; ++s) {
        const int32_t next =
            static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        engine.forward({&next, 1}, cache, LogitsMode::kLast, &logits, p.get(), PolicyHook::kDecode);
        runs[r].logits.push_back(logits);
      }
      for (int l = 0; l < c.num_layers; ++l) {
        const kernels::LayerKvView v = cache.layer(l);
        for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
          const int g = p ? p->global_head(h) : r * cache.shape().num_kv_heads + h;
          runs[r].keep[{l, g}].assign(v.position(h), v.position(h) + cache.length(l, h));
        }
      }
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return runs;
}

// The group's keep-sets / budgets: the union of the ranks' (each holds its own heads).
template <typename K, typename V>
std::map<K, V> merged(const std::vector<RankRun>& runs, std::map<K, V> RankRun::*field) {
  std::map<K, V> out;
  for (const RankRun& r : runs) {
    for (const auto& [k, v] : r.*field) EXPECT_TRUE(out.emplace(k, v).second) << "duplicate head";
  }
  return out;
}

TEST(TensorParallel, ValidDegreesAndErrorsNameTheModel) {
  EXPECT_EQ(valid_tp_degrees(16, 8, 256), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(tp_degree_error("m", 16, 8, 256, 4), "");
  const std::string e = tp_degree_error("stories260K", 8, 4, 172, 8);
  EXPECT_NE(e.find("stories260K"), std::string::npos) << e;
  EXPECT_NE(e.find("4 KV heads"), std::string::npos) << e;
  EXPECT_NE(e.find("GQA group never straddles"), std::string::npos) << e;
  EXPECT_NE(e.find("valid --gpus-per-worker values for it: 1, 2, 4"), std::string::npos) << e;
  EXPECT_NE(tp_degree_error("m", 16, 8, 172, 8).find("FFN hidden size 172"), std::string::npos);
  EXPECT_THROW(shard_model(random_model(), 0, 3), Error);
}

TEST(TensorParallel, ShardsHoldTheirHeadsAndColumns) {
  const Model& full = random_model();
  const Model s = shard_model(full, 1, 4);
  EXPECT_EQ(s.config.num_heads, 4);
  EXPECT_EQ(s.config.num_kv_heads, 2);
  EXPECT_EQ(s.config.hidden_dim, 64);
  const int D = full.config.dim, hd = full.config.head_dim;
  // Rank 1's first query row is global row 4 * hd; its first wo column is global column 4 * hd.
  EXPECT_EQ(s.layers[2].wq[0], full.layers[2].wq[static_cast<size_t>(4 * hd) * D]);
  EXPECT_EQ(s.layers[2].wk[5], full.layers[2].wk[static_cast<size_t>(2 * hd) * D + 5]);
  EXPECT_EQ(s.layers[2].wo[static_cast<size_t>(3) * (4 * hd) + 1],
            full.layers[2].wo[static_cast<size_t>(3) * (16 * hd) + 4 * hd + 1]);
  EXPECT_EQ(s.layers[0].w_down[static_cast<size_t>(7) * 64 + 2],
            full.layers[0].w_down[static_cast<size_t>(7) * 256 + 64 + 2]);
}

TEST(TensorParallel, AllReduceSumsInRankOrderOnEveryRank) {
  kernels::ThreadGroup group(3);
  const float x[3] = {1e8f, 1.0f, -1e8f};  // rank order: (1e8 + 1) - 1e8 = 0 in f32
  std::vector<float> out(3);
  std::vector<std::thread> t;
  for (int r = 0; r < 3; ++r) {
    t.emplace_back([&, r] {
      kernels::ThreadComm c(group, r);
      float v = x[r];
      c.all_reduce_sum(&v, 1);
      out[r] = v;
    });
  }
  for (auto& th : t) th.join();
  EXPECT_EQ(out, (std::vector<float>{0.0f, 0.0f, 0.0f}));
}

TEST(TensorParallel, LogitsMatchOneDeviceClosely) {
  const std::vector<RankRun> one = run_tp(1, "", 0, 96, 4);
  for (int size : {2, 4}) {
    const std::vector<RankRun> tp = run_tp(size, "", 0, 96, 4);
    for (int r = 0; r < size; ++r) {
      ASSERT_EQ(tp[r].logits.size(), one[0].logits.size());
      // Every rank of a group holds the same bits.
      EXPECT_EQ(tp[r].logits, tp[0].logits) << "rank " << r;
    }
    double worst = 0;
    for (size_t s = 0; s < one[0].logits.size(); ++s) {
      for (size_t i = 0; i < one[0].logits[s].size(); ++i) {
        worst = std::max(worst, std::fabs(double(tp[0].logits[s][i]) - one[0].logits[s][i]));
      }
    }
    // Only the summation order of the row-parallel projections differs.
    EXPECT_LT(worst, 1e-4) << "TP " << size;
    // Without eviction every head keeps every position.
    EXPECT_EQ(merged(tp, &RankRun::keep), merged(one, &RankRun::keep));
  }
}

TEST(TensorParallel, AdaKvBudgetsPerHeadEqualOneDevice) {
  for (const std::string policy : {"ada_snapkv", "ada_pyramidkv"}) {
    const std::vector<RankRun> one = run_tp(1, policy, 48, 200, 3);
    const auto budgets = merged(one, &RankRun::budget);
    ASSERT_EQ(budgets.size(), 4u * 8u);
    // The allocation is adaptive: some layer gives its heads different budgets.
    bool uneven = false;
    for (const auto& [k, b] : budgets) uneven |= b != budgets.at({k.first, 0});
    EXPECT_TRUE(uneven) << policy;
    for (int size : {2, 4}) {
      const std::vector<RankRun> tp = run_tp(size, policy, 48, 200, 3);
      EXPECT_EQ(merged(tp, &RankRun::budget), budgets) << policy << " TP " << size;
      EXPECT_EQ(merged(tp, &RankRun::keep), merged(one, &RankRun::keep))
          << policy << " TP " << size;
    }
  }
}

// Every other policy (and variants that change the cache layout or the prefill) keeps the same
// tokens per global head at every degree.
TEST(TensorParallel, PerHeadAndPerLayerPoliciesKeepTheSameTokens) {
  const std::vector<std::pair<std::string, std::map<std::string, std::string>>> cases = {
      {"snapkv", {}},
      {"pyramidkv", {}},
      {"h2o", {}},
      {"random", {}},
      {"tova", {{"tova_reduce", "layer"}}},
      {"tova", {}},
      {"snapkv", {{"gqa", "expand"}}},
      {"random", {{"gqa", "expand"}}},
      {"window", {}},
      {"streaming_llm", {}},
      {"scissorhands", {}},
      {"knorm", {}},
      {"subgen", {}},
      {"subgen_kcenter", {}},
      {"h2o", {{"prefill", "streaming"}}}};
  for (const auto& [policy, opts] : cases) {
    const std::vector<RankRun> one = run_tp(1, policy, 40, 120, 6, opts);
    for (int size : {2, 4}) {
      const std::vector<RankRun> tp = run_tp(size, policy, 40, 120, 6, opts);
      EXPECT_EQ(merged(tp, &RankRun::keep), merged(one, &RankRun::keep))
          << policy << " TP " << size;
    }
  }
}

}  // namespace
}  // namespace kvb::engine
