// Laws every policy must obey (POLICIES.md "What every policy must pass"), over the whole
// registry and its variant flags, and the guide's example policy (prompt_heavy, compiled into
// this test when the build does not list it among KVBENCH_EXTRA_POLICIES), on stories260K,
// SmolLM2 and the tiny Qwen3 fixture (q/k norm, head_dim != dim / num_heads):
//  1. a budget that never forces an eviction gives logits bit-identical to `full`, through the
//     prompt and every teacher-forced decode step;
//  2. decode-evicting policies never hold more than the budget in any head after a step; the
//     prompt-cache family holds at most its computed budget after prefill and grows by one a step;
//  3. the same unit twice gives the same bits (determinism); memory accounting = retained slots.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include "kernels/policies/extra_policies.h"
#include "kernels/policies/policy.h"
#include "registry_options.h"
#include "workers/engine/engine.h"
#include "workers/engine/generate.h"
#include "workers/engine/model.h"
#include "workers/formats/model_load.h"

namespace kvb {
namespace policies {
PolicyInfo prompt_heavy_policy_info();  // examples/policies/cpp/prompt_heavy.cc
}  // namespace policies
namespace {

using policies::PolicyConfig;

struct Variant {
  std::string policy;
  std::map<std::string, std::string> options;
  const policies::PolicyInfo* info = nullptr;  // a policy outside the registry; null: by name
  std::string label() const {
    std::string s = policy;
    for (const auto& [k, v] : options) s += " " + k + "=" + v;
    return s;
  }
};

// Every registered policy with defaults, plus the variant flags that change the code path.
std::vector<Variant> variants() {
  std::vector<Variant> v;
  for (const auto& p : policies::policy_registry()) {
    // python needs its file= and simlayerkv a threshold below 1 to compress at all (below);
    // duo_attention decides by its head scores, not the budget (DuoAttentionLaws); think keeps
    // every token and prunes key channels (ThinkPrunesKeyChannels).
    // qfilter reads filters of the model's shape (QFilterLaws); finch's window is a task's
    // question, which these raw prompts lack (below: window_size); kvzip allocates across
    // layers and heads (KvZipLaws).
    if (p.name != "python" && p.name != "simlayerkv" && p.name != "duo_attention" &&
        p.name != "think" && p.name != "qfilter" && p.name != "finch" && p.name != "kvzip") {
      v.push_back({p.name, {}});
    }
  }
  const std::set<std::string> names = [] {
    std::set<std::string> s;
    for (const auto& p : policies::policy_registry()) s.insert(p.name);
    return s;
  }();
  auto add = [&](const std::string& name, std::map<std::string, std::string> o) {
    if (names.count(name)) v.push_back({name, std::move(o)});
  };
  add("h2o", {{"prefill", "streaming"}});
  add("h2o", {{"candidates", "promote_recent"}});
  add("h2o", {{"gqa", "expand"}});
  add("streaming_llm", {{"positions", "rolling"}, {"evict", "before_attention"}});
  add("scissorhands", {{"prefill", "streaming"}});
  add("snapkv", {{"gqa", "expand"}});
  add("window", {{"gqa", "expand"}});
  add("subgen", {{"sinks", "2"}, {"recent", "4"}});
  add("subgen_kcenter", {{"weight_by_cluster_size", "true"}, {"decode", "slide"}});
  // kvpress's AdaKVPress over a scorer; expected_attention's mean-only variant.
  add("keydiff", {{"ada", "true"}});
  add("expected_attention", {{"ada", "true"}});
  add("expected_attention", {{"use_covariance", "false"}, {"use_vnorm", "false"}});
  // SimLayerKV with every layer lazy (any attention share exceeds 0): its thresholds between are
  // hand-computed in test_policy_kvpress.
  add("simlayerkv", {{"lazy_threshold", "0"}});
  add("simlayerkv", {{"lazy_threshold", "0"}, {"n_last", "2"}, {"n_initial", "2"}});
  // kvpress's DecodingPress after the prompt's compression (decode_interval).
  add("keydiff", {{"decode_interval", "3"}});
  add("lagkv", {{"decode_interval", "2"}, {"ada", "true"}, {"lag", "8"}});
  // kvpress's CriticalKVPress and CriticalAdaKVPress over a scorer.
  add("keydiff", {{"critical", "true"}});
  add("expected_attention", {{"critical", "true"}, {"ada", "true"}, {"use_vnorm", "false"}});
  // kvpress's ChunkKVPress over a scorer (threshold replaces the budget: ThresholdLaws below).
  add("keydiff", {{"chunkkv", "4"}});
  add("snapkv", {{"chunkkv", "5"}});
  add("keydiff", {{"chunk", "7"}});  // kvpress's ChunkPress
  add("keydiff", {{"block", "5"}});  // kvpress's BlockPress
  add("cur", {{"block", "3"}});
  add("lagkv", {{"chunk", "6"}, {"lag", "2"}});  // ChunkPress, each run scored as its own cache
  add("pyramidkv", {{"formula", "kvpress"}, {"beta", "2"}});
  add("expected_attention", {{"chunkkv", "3"}});
  // kvpress's ChunkPress over ExpectedAttention: each run its own queries, sinks and softmax.
  add("expected_attention", {{"chunk", "9"}});
  // kvpress's NonCausalAttnPress: a short last chunk (padded), and Ada-KV over its z-scores.
  add("noncausal_attn", {{"chunk_size", "5"}});
  add("noncausal_attn", {{"ada", "true"}, {"chunk_size", "4"}});
  add("leverage", {{"sketch_dimension", "4"}, {"chunkkv", "3"}});  // LeverageScorePress
  // CompactorPress with short ends and chunks (its middle padded), Ada-KV over its scores.
  add("compactor", {{"sink_size_start", "2"}, {"sink_size_end", "1"}, {"chunk_size", "5"},
                    {"ada", "true"}, {"blending", "0.5"}});
  // kvpress's FinchPress with the prompt's last tokens as its question, whole and by runs (kept
  // positions: the sliding-window models refuse re-rotation; PolicyLaws' rerotate cases cover it).
  add("finch", {{"window_size", "4"}, {"positions", "true"}});
  add("finch", {{"window_size", "3"}, {"chunk_length", "5"}, {"positions", "true"}});
  // kvpress's ComposedPress of two token presses (then:), the first keeping every prompt token
  // (first_compression_ratio 0: law 1 holds): the second decides on the survivors' rows.
  add("snapkv", {{"then", "keydiff"}, {"first_compression_ratio", "0"}});
  add("knorm", {{"then", "lagkv"}, {"first_compression_ratio", "0"}, {"then.lag", "4"}});
  add("expected_attention", {{"then", "cur"}, {"first_compression_ratio", "0"}});
  // Policies in Python (examples/policies/): one with decode eviction, one without, Ada-KV's
  // allocation with protected sinks and window.
  const std::string examples = std::string(KVB_EXAMPLES_DIR) + "/policies/";
  add("python", {{"file", examples + "h2o.py"}});
  add("python", {{"file", examples + "knorm.py"}});
  add("python",
      {{"file", examples + "knorm.py"}, {"ada", "true"}, {"sinks", "2"}, {"window", "2"}});
  // The guide's example (kernels/policies/README.md), where the registry does not have it.
  static const policies::PolicyInfo example = policies::prompt_heavy_policy_info();
  if (!names.count(example.name)) v.push_back({example.name, {}, &example});
  v.push_back({example.name, {{"gqa", "expand"}}, names.count(example.name) ? nullptr : &example});
  return v;
}

// Policies whose budget bounds the cache only after prefill (no decode eviction).
bool prompt_cache_family(const Variant& var) {
  const std::string& name = var.policy;
  if (name == "python") {  // a module without decode_score
    return var.options.at("file").find("knorm.py") != std::string::npos;
  }
  return name == "snapkv" || name == "pyramidkv" || name == "ada_snapkv" ||
         name == "ada_pyramidkv" || name == "knorm" || name == "subgen_kcenter" ||
         name == "keydiff" || name == "observed_attention" || name == "cur" || name == "lagkv" ||
         name == "expected_attention" || name == "simlayerkv" || name == "noncausal_attn" ||
         name == "leverage" || name == "compactor" || name == "finch";
}

struct Trace {
  std::vector<std::vector<float>> logits;  // after the prompt, then after each forced token
  std::vector<int> max_len;                // longest head after the prompt and after each step
  std::vector<size_t> logical_bytes;
  std::vector<int> total_slots;
};

Trace run(engine::Engine& eng, const engine::Model& m, const Variant& var, int budget,
          const std::vector<int32_t>& prompt, const std::vector<int32_t>& forced) {
  PolicyConfig pc;
  pc.name = var.policy;
  pc.kv_budget = budget;
  const auto& c = m.config;
  pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
  pc.options = policies::PolicyOptions(var.options);
  pc.seed = 11;
  std::unique_ptr<policies::Policy> policy =
      var.info ? policies::make_policy(*var.info, pc) : policies::make_policy(pc);
  kernels::KvCache cache = eng.new_cache(0, policy.get());
  Trace tr;
  std::vector<float> logits;
  auto record = [&] {
    tr.logits.push_back(logits);
    tr.max_len.push_back(cache.max_length());
    tr.logical_bytes.push_back(cache.logical_bytes());
    tr.total_slots.push_back(cache.total_slots());
  };
  engine::prefill_prompt(eng, cache, prompt, policy.get(), &logits);
  record();
  for (int32_t t : forced) {
    eng.forward({&t, 1}, cache, engine::LogitsMode::kLast, &logits, policy.get(),
                engine::PolicyHook::kDecode);
    record();
  }
  return tr;
}

// Variants shard, shard + shards, ... of variants() (all of them by default): a model whose
// laws take minutes is split into several tests, each under its own time limit.
// `only`: the variants of these policies alone (all when empty); dtype: the engine's weights.
void check_model(const engine::Model& m, const std::vector<int32_t>& prompt, int gen, int shard = 0,
                 int shards = 1, engine::DType dtype = engine::DType::kF32,
                 const std::set<std::string>& only = {}) {
  engine::Engine eng(m, nullptr, dtype);
  // Teacher-forced continuation: full's greedy tokens.
  std::vector<int32_t> forced;
  {
    kernels::KvCache cache = eng.new_cache();
    std::vector<float> l;
    eng.forward(prompt, cache, engine::LogitsMode::kLast, &l);
    for (int i = 0; i < gen; ++i) {
      const int32_t next = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      forced.push_back(next);
      eng.forward({&next, 1}, cache, engine::LogitsMode::kLast, &l);
    }
  }
  const Trace ref = run(eng, m, {"full", {}}, 0, prompt, forced);
  const int total = static_cast<int>(prompt.size() + forced.size());
  const int n = static_cast<int>(prompt.size());
  const std::vector<Variant> all = variants();
  for (size_t i = static_cast<size_t>(shard); i < all.size(); i += static_cast<size_t>(shards)) {
    const Variant& var = all[i];
    if (!only.empty() && !only.count(var.policy)) continue;
    SCOPED_TRACE(var.label());
    // Law 1: a budget above everything the sequence will hold.
    const Trace big = run(eng, m, var, total + 8, prompt, forced);
    ASSERT_EQ(big.logits.size(), ref.logits.size());
    for (size_t s = 0; s < ref.logits.size(); ++s) {
      ASSERT_EQ(big.logits[s], ref.logits[s]) << "step " << s << ": logits differ from full";
    }
    if (var.policy == "full") continue;
    // Law 2: a small budget that forces eviction.
    const int budget = std::max(8, n / 3);
    const Trace small = run(eng, m, var, budget, prompt, forced);
    // The prompt-cache family's per-head budgets (PyramidKV layers, Ada-KV heads) are checked
    // exactly by their unit tests; here: compressed below the prompt, then one more per step.
    for (size_t s = 0; s < small.max_len.size(); ++s) {
      const int allowed = prompt_cache_family(var) ? n - 1 + static_cast<int>(s) : budget;
      EXPECT_LE(small.max_len[s], allowed) << "step " << s;
    }
    if (!prompt_cache_family(var)) {
      EXPECT_LE(small.max_len.back(), budget);
    }
    // Memory accounting: logical bytes = retained slots x bytes per slot (native weights: the
    // cache holds f16 rows, 2 bytes an element; f32 keys under rolling positions, which cache
    // them before RoPE).
    const bool native = dtype == engine::DType::kNative;
    const bool rolling = var.options.count("positions") && var.options.at("positions") == "rolling";
    const size_t key_elem = native && !rolling ? 2 : sizeof(float);
    const size_t value_elem = native ? 2 : sizeof(float);
    const size_t slot_bytes = (key_elem + value_elem) * m.config.head_dim + sizeof(int32_t);
    for (size_t s = 0; s < small.total_slots.size(); ++s) {
      EXPECT_EQ(small.logical_bytes[s], small.total_slots[s] * slot_bytes);
    }
    // Eviction happened and changed something (else the test proves nothing).
    EXPECT_LT(small.max_len[0], n) << "no head was compressed after the prompt";
    // Law 3: determinism.
    const Trace again = run(eng, m, var, budget, prompt, forced);
    EXPECT_EQ(again.logits, small.logits);
  }
}

// stories260K (../shared) and the 48-token prompt the laws run on it.
std::unique_ptr<engine::Model> stories260k() {
  const std::string path = std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin";
  if (!std::ifstream(path).good()) {
    ADD_FAILURE() << path << " missing: ../shared must be beside the checkout";
    return nullptr;
  }
  return engine::load_model(path);
}

std::vector<int32_t> stories_prompt() {
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 47; ++i) prompt.push_back(static_cast<int32_t>(3 + (i * 37) % 500));
  return prompt;
}

TEST(PolicyLaws, Stories260K) {
  std::unique_ptr<engine::Model> m = stories260k();
  ASSERT_TRUE(m);
  const std::vector<int32_t> prompt = stories_prompt();
  check_model(*m, prompt, 12);
}

// The two models of the laws written per policy below: stories260K (adjacent-pair RoPE) or the
// tiny Qwen3 (rotate_half, q/k norms), and their prompt: stories_prompt(), or `text`'s bytes as
// Qwen3's token ids.
std::unique_ptr<engine::Model> stories_or_qwen3(bool qwen3) {
  return qwen3 ? engine::load_model(std::string(KVB_FIXTURES_DIR) + "/engine/qwen3_tiny.gguf")
               : stories260k();
}

std::vector<int32_t> stories_or_qwen3_prompt(bool qwen3, const std::string& text) {
  return qwen3 ? std::vector<int32_t>(text.begin(), text.end()) : stories_prompt();
}

// qfilter (kvpress QFilterPress) reads filters of the model's shape (registry_options.h's
// made-up ones), so it runs the laws here rather than in variants(): a budget above everything
// gives full's logits bit for bit; a small one leaves every head at most the budget after the
// prompt, then one more per step (no decode eviction); the same run twice gives the same bits;
// logical bytes = retained slots x slot bytes. Ada-KV over it too.
TEST(PolicyLaws, QFilterLaws) {
  for (const bool qwen3 : {false, true}) {
    const std::unique_ptr<engine::Model> m = stories_or_qwen3(qwen3);
    ASSERT_TRUE(m);
    SCOPED_TRACE(qwen3 ? "qwen3 tiny" : "stories260K");
    engine::Engine eng(*m, nullptr);
    const auto& c = m->config;
    const std::vector<int32_t> prompt = stories_or_qwen3_prompt(qwen3, "Filters score the keys; the least aligned stay in the cache.");
    const std::vector<int32_t> forced = {5, 9, 40, 7};
    const int n = static_cast<int>(prompt.size());
    const Trace ref = run(eng, *m, {"full", {}}, 0, prompt, forced);
    for (const bool ada : {false, true}) {
      std::map<std::string, std::string> o = testing_registry::required_options(
          "qfilter", c.num_layers, c.num_kv_heads, c.head_dim);
      if (ada) o["ada"] = "true";
      const Variant var{"qfilter", o};
      EXPECT_EQ(run(eng, *m, var, n + 12, prompt, forced).logits, ref.logits);
      const int budget = std::max(8, n / 3);
      const Trace small = run(eng, *m, var, budget, prompt, forced);
      for (size_t s = 0; s < small.max_len.size(); ++s) {
        EXPECT_LE(small.max_len[s], (ada ? n : budget) + static_cast<int>(s)) << "step " << s;
        EXPECT_EQ(small.logical_bytes[s],
                  small.total_slots[s] * (2 * sizeof(float) * c.head_dim + sizeof(int32_t)));
      }
      EXPECT_LT(small.total_slots[0], c.num_layers * c.num_kv_heads * n);
      EXPECT_EQ(small.total_slots[0], c.num_layers * c.num_kv_heads * budget);  // budget per head
      EXPECT_NE(small.logits, ref.logits);
      EXPECT_EQ(run(eng, *m, var, budget, prompt, forced).logits, small.logits);
      if (ada) continue;
      // BlockPress with one block past the budget scores the whole prompt as one cache: the same
      // keep-sets (and the layer's own filters: the scratch cache is a layer 0 of its own).
      Variant whole = var;
      whole.options["block"] = "1000";
      EXPECT_EQ(run(eng, *m, whole, budget, prompt, forced).logits, small.logits);
    }
  }
}

// ThinK (policy `think`, option `think: r`) prunes key channels, not tokens, so law 1 reads: a
// ratio that prunes nothing gives the logits of the policy alone (full's for `think`). With r =
// 0.5 every head of every layer zeroes head_dim / 2 key channels in each prompt slot it keeps
// (the same channels in every slot) and none in the tokens after the prompt; the tokens kept are
// the policy's own; the logits change; memory counts the zeroed channels as not stored; the same
// run twice gives the same bits.
TEST(PolicyLaws, ThinkPrunesKeyChannels) {
  std::unique_ptr<engine::Model> m = stories260k();
  ASSERT_TRUE(m);
  engine::Engine eng(*m, nullptr);
  const auto& c = m->config;
  const std::vector<int32_t> prompt = stories_prompt();
  const std::vector<int32_t> forced = {5, 9, 40, 7};
  const int n = static_cast<int>(prompt.size());
  const int d = c.head_dim;
  EXPECT_EQ(run(eng, *m, {"think", {}}, 0, prompt, forced).logits,
            run(eng, *m, {"full", {}}, 0, prompt, forced).logits);
  EXPECT_EQ(run(eng, *m, {"snapkv", {{"think", "0.1"}}}, 16, prompt, forced).logits,
            run(eng, *m, {"snapkv", {}}, 16, prompt, forced).logits);  // int(d x 0.1) = 0
  ASSERT_LT(d * 0.1, 1.0);
  struct Case {
    Variant var;
    int budget;
    Variant alone;
    bool same_tokens = true;  // h2o's decode evictions read attention, which ThinK changes
  };
  const std::vector<Case> cases = {
      {{"think", {{"key_channel_compression_ratio", "0.5"}}}, 0, {"full", {}}},
      {{"snapkv", {{"think", "0.5"}}}, 16, {"snapkv", {}}},
      {{"keydiff", {{"think", "0.5"}, {"think_window", "4"}}}, 20, {"keydiff", {}}},
      {{"h2o", {{"think", "0.5"}}}, 24, {"h2o", {}}, false}};
  for (const Case& k : cases) {
    SCOPED_TRACE(k.var.label());
    auto go = [&](const Variant& var, std::vector<std::vector<float>>* logits,
                  std::vector<size_t>* bytes) {
      PolicyConfig pc;
      pc.name = var.policy;
      pc.kv_budget = k.budget;
      pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
      pc.options = policies::PolicyOptions(var.options);
      std::unique_ptr<policies::Policy> policy = policies::make_policy(pc);
      kernels::KvCache cache = eng.new_cache(0, policy.get());
      std::vector<float> l;
      engine::prefill_prompt(eng, cache, prompt, policy.get(), &l);
      logits->push_back(l);
      bytes->push_back(eng.kv_logical_bytes(cache));
      for (int32_t t : forced) {
        eng.forward({&t, 1}, cache, engine::LogitsMode::kLast, &l, policy.get(),
                    engine::PolicyHook::kDecode);
        logits->push_back(l);
        bytes->push_back(eng.kv_logical_bytes(cache));
      }
      return cache;
    };
    std::vector<std::vector<float>> with, alone, again;
    std::vector<size_t> bytes, alone_bytes, again_bytes;
    const kernels::KvCache cache = go(k.var, &with, &bytes);
    const kernels::KvCache plain = go(k.alone, &alone, &alone_bytes);
    size_t pruned = 0;
    for (int l = 0; l < c.num_layers; ++l) {
      const kernels::LayerKvView v = cache.layer(l);
      const kernels::LayerKvView p = plain.layer(l);
      for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
        if (k.same_tokens) {  // the policy's own tokens
          ASSERT_EQ(cache.length(l, h), plain.length(l, h));
          ASSERT_TRUE(
              std::equal(v.position(h), v.position(h) + cache.length(l, h), p.position(h)));
        }
        EXPECT_EQ(cache.pruned_key_channels(l, h), d / 2);
        int prompt_slots = 0;
        while (prompt_slots < cache.length(l, h) && v.position(h)[prompt_slots] < n) {
          ++prompt_slots;
        }
        EXPECT_EQ(cache.channel_pruned_slots(l, h), prompt_slots);
        pruned += static_cast<size_t>(prompt_slots) * (d / 2);
        int zero_channels = 0;
        for (int ch = 0; ch < d; ++ch) {
          int zeros = 0;
          for (int s = 0; s < prompt_slots; ++s) zeros += v.key(h, s)[ch] == 0.0f;
          if (zeros == prompt_slots && prompt_slots > 0) ++zero_channels;
          // The tokens after the prompt keep every channel.
          for (int s = prompt_slots; s < cache.length(l, h); ++s) {
            EXPECT_NE(v.key(h, s)[ch], 0.0f) << "layer " << l << " head " << h << " slot " << s;
          }
        }
        EXPECT_EQ(zero_channels, d / 2) << "layer " << l << " head " << h;
      }
    }
    EXPECT_EQ(cache.pruned_key_elements(), pruned);
    const size_t slot_bytes = 2 * sizeof(float) * d + sizeof(int32_t);
    EXPECT_EQ(bytes.back(), cache.total_slots() * slot_bytes - pruned * sizeof(float));
    if (k.same_tokens) EXPECT_EQ(bytes.back(), alone_bytes.back() - pruned * sizeof(float));
    EXPECT_NE(with, alone) << "pruning channels changed no logit";
    go(k.var, &again, &again_bytes);
    EXPECT_EQ(again, with);
  }
}

// `positions: rerotate` (kvpress KeyRerotationPress): law 1 reads, a budget that evicts nothing
// re-rotates nothing (every key sits at its own slot) and gives full's logits bit for bit. With a
// budget that evicts, each head keeps the policy's own tokens, slot s takes position s, its key
// is the policy's key for that token rotated by RoPE's angle for s - p (checked against a float64
// rotation written here), the sequence continues at the longest head's length, and two runs give
// the same bits.
void check_rerotate(const engine::Model& model, const std::vector<int32_t>& prompt) {
  const engine::Model* m = &model;
  engine::Engine eng(*m, nullptr);
  const auto& c = m->config;
  const std::vector<int32_t> forced = {5, 9, 40, 7};
  const int n = static_cast<int>(prompt.size());
  const int total = n + static_cast<int>(forced.size());
  EXPECT_EQ(run(eng, *m, {"snapkv", {{"positions", "rerotate"}}}, total + 8, prompt, forced).logits,
            run(eng, *m, {"full", {}}, 0, prompt, forced).logits);
  for (const Variant& var : {Variant{"snapkv", {{"positions", "rerotate"}}},
                             Variant{"keydiff", {{"positions", "rerotate"}, {"think", "0.5"}}},
                             Variant{"pyramidkv", {{"positions", "rerotate"}}},
                             // a composition re-rotates after its second policy's decision
                             Variant{"snapkv",
                                     {{"positions", "rerotate"},
                                      {"then", "keydiff"},
                                      {"first_compression_ratio", "0.25"}}}}) {
    SCOPED_TRACE(var.label());
    Variant alone = var;  // the policy alone: the same tokens, keys where they were computed
    alone.options.erase("positions");
    alone.options.erase("think");  // ThinK zeroes channels of the rotated keys (checked below)
    auto prefill = [&](const Variant& v, std::vector<float>* logits) {
      PolicyConfig pc;
      pc.name = v.policy;
      pc.kv_budget = 16;
      pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
      pc.options = policies::PolicyOptions(v.options);
      auto policy = policies::make_policy(pc);
      kernels::KvCache cache = eng.new_cache(8, policy.get());
      engine::prefill_prompt(eng, cache, prompt, policy.get(), logits);
      return std::make_pair(std::move(policy), std::move(cache));
    };
    std::vector<float> l1, l2, l3;
    auto [p1, moved] = prefill(var, &l1);
    auto [p2, plain] = prefill(alone, &l2);
    EXPECT_EQ(l1, l2);  // the prompt's own logits come before any compression
    int longest = 0;
    for (int l = 0; l < c.num_layers; ++l) {
      const auto& rope = c.rope_of(l);
      const int half = rope.rot_dim / 2;
      const kernels::LayerKvView a = moved.layer(l), b = plain.layer(l);
      for (int h = 0; h < c.num_kv_heads; ++h) {
        ASSERT_EQ(moved.length(l, h), plain.length(l, h));
        ASSERT_LT(plain.length(l, h), n);  // evicted: something moves
        longest = std::max(longest, moved.length(l, h));
        for (int s = 0; s < moved.length(l, h); ++s) {
          ASSERT_EQ(a.position(h)[s], s);
          const int delta = s - b.position(h)[s];
          const float* want_row = b.key(h, s);
          const float* got = a.key(h, s);
          for (int i = 0; i < half; ++i) {
            const int x = rope.style == kernels::cpu::RopeStyle::kNorm ? 2 * i : i;
            const int y = rope.style == kernels::cpu::RopeStyle::kNorm ? 2 * i + 1 : i + half;
            double f = 1.0 / std::pow(static_cast<double>(rope.theta), 2.0 * i / rope.rot_dim);
            if (!rope.freq_factors.empty()) f /= rope.freq_factors[i];
            const double angle = delta / static_cast<double>(rope.linear_scale) * f;
            const double cx = std::cos(angle), sx = std::sin(angle);
            const double x0 = want_row[x], x1 = want_row[y];
            const double tol = 1e-4 * (std::fabs(x0) + std::fabs(x1) + 1e-3);
            // ThinK's channels, zeroed after the rotation: exactly 0 in the moved key.
            const bool pruned = var.options.count("think") > 0;
            if (!(pruned && got[x] == 0.0f)) {
              EXPECT_NEAR(got[x], x0 * cx - x1 * sx, tol) << "layer " << l << " head " << h;
            }
            if (!(pruned && got[y] == 0.0f)) {
              EXPECT_NEAR(got[y], x0 * sx + x1 * cx, tol) << "layer " << l << " head " << h;
            }
          }
          for (int i = rope.rot_dim; i < c.head_dim; ++i) {
            if (!(var.options.count("think") && got[i] == 0.0f)) EXPECT_EQ(got[i], want_row[i]);
          }
        }
      }
    }
    EXPECT_EQ(moved.next_position(), longest);
    EXPECT_EQ(plain.next_position(), n);
    const int32_t t = forced[0];
    eng.forward({&t, 1}, moved, engine::LogitsMode::kLast, &l3, p1.get(),
                engine::PolicyHook::kDecode);
    EXPECT_EQ(moved.layer(0).position(0)[moved.length(0, 0) - 1], longest);
    EXPECT_NE(l3, std::vector<float>());
    // Determinism.
    std::vector<float> again;
    auto [p3, moved_again] = prefill(var, &again);
    for (int l = 0; l < c.num_layers; ++l) {
      const kernels::LayerKvView a = moved.layer(l), b = moved_again.layer(l);
      for (int h = 0; h < c.num_kv_heads; ++h) {
        ASSERT_EQ(moved_again.length(l, h), moved.length(l, h) - 1);
        EXPECT_EQ(0, std::memcmp(a.key(h, 0), b.key(h, 0),
                                 sizeof(float) * c.head_dim * moved_again.length(l, h)));
      }
    }
  }
}

TEST(PolicyLaws, RerotateMovesTheKeptKeysToTheirSlots) {
  std::unique_ptr<engine::Model> m = stories260k();  // llama2.c: adjacent pairs
  ASSERT_TRUE(m);
  check_rerotate(*m, stories_prompt());
}

TEST(PolicyLaws, RerotateMovesTheKeptKeysToTheirSlotsQwen3Tiny) {
  const std::string path = std::string(KVB_FIXTURES_DIR) + "/engine/qwen3_tiny.gguf";
  std::unique_ptr<engine::Model> m = engine::load_model(path);  // rotate_half, q/k norms
  ASSERT_EQ(m->config.rope_of(0).style, kernels::cpu::RopeStyle::kNeox);
  const std::string text = "Re-rotated keys sit at their slots; the next token after the longest.";
  check_rerotate(*m, std::vector<int32_t>(text.begin(), text.end()));
}

// `threshold` (kvpress DMSPress) decides by its threshold, not the budget, so law 1 reads: a
// threshold below every score gives full's logits at any budget. A threshold above every score
// leaves each head its last threshold_window tokens after the prompt (then one more per step);
// one between keeps at least the window; every run twice gives the same bits. With
// threshold_decode the tokens leaving the window at decode go too: the heads stay at the window.
TEST(PolicyLaws, ThresholdReplacesTheBudget) {
  std::unique_ptr<engine::Model> m = stories260k();
  ASSERT_TRUE(m);
  engine::Engine eng(*m, nullptr);
  const std::vector<int32_t> prompt = stories_prompt();
  const std::vector<int32_t> forced = {5, 9, 40, 7};
  const int n = static_cast<int>(prompt.size());
  const Trace ref = run(eng, *m, {"full", {}}, 0, prompt, forced);
  for (const char* name :
       {"keydiff", "cur", "lagkv", "expected_attention", "noncausal_attn", "leverage"}) {
    SCOPED_TRACE(name);
    const Trace none = run(eng, *m, {name, {{"threshold", "-1e30"}, {"threshold_window", "0"}}}, 1,
                           prompt, forced);
    EXPECT_EQ(none.logits, ref.logits);
    const Variant all{name, {{"threshold", "1e30"}, {"threshold_window", "6"}}};
    const Trace most = run(eng, *m, all, 500, prompt, forced);
    for (size_t s = 0; s < most.max_len.size(); ++s) {
      // expected_attention scores its 4 sinks the largest float (kvpress: its maximum + 1); cur
      // and lagkv score theirs 1.
      const int sinks = std::string(name) == "expected_attention" ? 4 : 0;
      EXPECT_EQ(most.max_len[s], 6 + sinks + static_cast<int>(s)) << "step " << s;
    }
    EXPECT_EQ(run(eng, *m, all, 500, prompt, forced).logits, most.logits);
    const Trace some =
        run(eng, *m, {name, {{"threshold", "0"}, {"threshold_window", "8"}}}, 1, prompt, forced);
    EXPECT_GE(some.max_len[0], 8);
    EXPECT_LE(some.max_len[0], n);
    // expected_attention, noncausal_attn and leverage read the prompt's queries or keys: no
    // threshold_decode.
    if (std::string(name) == "expected_attention" || std::string(name) == "noncausal_attn" ||
        std::string(name) == "leverage") {
      continue;
    }
    // threshold_decode: every token that leaves the window goes too, so the heads stay at 6.
    const Variant sliding{
        name, {{"threshold", "1e30"}, {"threshold_window", "6"}, {"threshold_decode", "true"}}};
    const Trace slid = run(eng, *m, sliding, 500, prompt, forced);
    for (size_t s = 0; s < slid.max_len.size(); ++s) EXPECT_EQ(slid.max_len[s], 6) << "step " << s;
    EXPECT_EQ(run(eng, *m, sliding, 500, prompt, forced).logits, slid.logits);
    EXPECT_EQ(
        run(eng, *m,
            {name,
             {{"threshold", "-1e30"}, {"threshold_window", "0"}, {"threshold_decode", "true"}}},
            1, prompt, forced)
            .logits,
        ref.logits);
  }
}

// `duo_attention` (kvpress DuoAttentionPress) decides by its head scores, not the budget: with
// head_compression_ratio 0 (kvpress's default) it is full at any budget; with 1 every head keeps
// its 4 sink and 16 recent tokens after the prompt (then one more per step); runs repeat bit for
// bit.
TEST(PolicyLaws, DuoAttentionFollowsItsHeadScores) {
  std::unique_ptr<engine::Model> m = stories260k();
  ASSERT_TRUE(m);
  engine::Engine eng(*m, nullptr);
  const std::vector<int32_t> prompt = stories_prompt();
  const std::vector<int32_t> forced = {5, 9, 40, 7};
  const Trace ref = run(eng, *m, {"full", {}}, 0, prompt, forced);
  auto options = [&](const char* ratio) {
    std::map<std::string, std::string> o = testing_registry::required_options(
        "duo_attention", m->config.num_layers, m->config.num_kv_heads);
    o["head_compression_ratio"] = ratio;
    return o;
  };
  EXPECT_EQ(run(eng, *m, {"duo_attention", options("0")}, 1, prompt, forced).logits, ref.logits);
  const Variant all{"duo_attention", options("1")};
  const Trace most = run(eng, *m, all, 8, prompt, forced);
  for (size_t s = 0; s < most.max_len.size(); ++s) {
    EXPECT_EQ(most.max_len[s], 20 + static_cast<int>(s)) << "step " << s;
  }
  EXPECT_EQ(run(eng, *m, all, 8, prompt, forced).logits, most.logits);
  const Trace half = run(eng, *m, {"duo_attention", options("0.5")}, 8, prompt, forced);
  EXPECT_LT(half.total_slots[0], ref.total_slots[0]);
  EXPECT_GT(half.total_slots[0], most.total_slots[0]);
}

// `kvzip` (kvpress KVzipPress) keeps the model's budget, not each head's: a budget above the
// sequence runs no pass and equals full bit for bit; a small one keeps layers x heads x budget
// slots in all after the prompt (layerwise: heads x budget in every layer), every head at least
// its n_sink sinks and some head more than the budget; decode adds one slot per head per step;
// runs repeat bit for bit. Also on the tiny Qwen3 (rotate_half, q/k norms).
TEST(PolicyLaws, KvZipKeepsTheModelsBudget) {
  for (const bool qwen3 : {false, true}) {
    const std::unique_ptr<engine::Model> m = stories_or_qwen3(qwen3);
    ASSERT_TRUE(m);
    SCOPED_TRACE(qwen3 ? "qwen3 tiny" : "stories260K");
    engine::Engine eng(*m, nullptr);
    const auto& c = m->config;
    const std::vector<int32_t> prompt = stories_or_qwen3_prompt(qwen3, "Repeat the context: the keys it needs most are the ones to keep.");
    const std::vector<int32_t> forced = {5, 9, 40, 7};
    const int n = static_cast<int>(prompt.size());
    const Trace ref = run(eng, *m, {"full", {}}, 0, prompt, forced);
    EXPECT_EQ(run(eng, *m, {"kvzip", {}}, n + 8, prompt, forced).logits, ref.logits);
    const int budget = std::max(8, n / 3);
    const int heads = c.num_kv_heads;
    for (const bool layerwise : {false, true}) {
      SCOPED_TRACE(layerwise ? "layerwise" : "whole model");
      const Variant var{"kvzip", {{"chunk_size", "16"}, {"layerwise", layerwise ? "true" : "false"}}};
      const Trace small = run(eng, *m, var, budget, prompt, forced);
      EXPECT_EQ(small.total_slots[0], c.num_layers * heads * budget);
      for (size_t s = 1; s < small.total_slots.size(); ++s) {
        EXPECT_EQ(small.total_slots[s], small.total_slots[0] + static_cast<int>(s) * c.num_layers * heads);
      }
      EXPECT_GT(small.max_len[0], budget) << "every head kept the same share";
      EXPECT_LT(small.max_len[0], n);
      EXPECT_EQ(run(eng, *m, var, budget, prompt, forced).logits, small.logits);
      EXPECT_NE(small.logits.back(), ref.logits.back());
    }
  }
}

// SmolLM2's laws take about 4 minutes on 2 cores: 6 tests of every sixth variant each, so that
// ctest spreads them and a busy machine does not push one test past its limit.
constexpr int kSmolShards = 6;
class PolicyLawsSmolLM2 : public ::testing::TestWithParam<int> {};

TEST_P(PolicyLawsSmolLM2, Shard) {
  const std::string path = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  ASSERT_TRUE(std::ifstream(path).good()) << path << " missing: run scripts/fetch_models.sh";
  std::unique_ptr<engine::Model> m = engine::load_model(path);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 60; ++i) prompt.push_back(static_cast<int32_t>(100 + (i * 7919) % 40000));
  check_model(*m, prompt, 6, GetParam(), kSmolShards);
}
INSTANTIATE_TEST_SUITE_P(PolicyLaws, PolicyLawsSmolLM2, ::testing::Range(0, kSmolShards));

// The laws on the model's own quantized weights (--dtype native, issue 35): a policy sees the
// same engine whatever its weights, so a budget that forces nothing equals `full` on the same
// dtype, bit for bit; checked for one policy of each kind (decode eviction, prompt compression,
// Ada-KV's allocation, a rolling-positions sink policy, the H2O-family scissorhands).
TEST(PolicyLaws, SmolLM2NativeWeights) {
  const std::string path = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  ASSERT_TRUE(std::ifstream(path).good()) << path << " missing: run scripts/fetch_models.sh";
  std::unique_ptr<engine::Model> m = engine::load_model(path);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 60; ++i) prompt.push_back(static_cast<int32_t>(100 + (i * 7919) % 40000));
  check_model(*m, prompt, 6, 0, 1, engine::DType::kNative,
              {"full", "h2o", "snapkv", "ada_snapkv", "streaming_llm", "scissorhands", "knorm"});
}

// Qwen3's q/k norm sits before RoPE, so it shapes the pre-RoPE keys, the rolling-positions path
// and every statistic a policy reads; head_dim 32 with dim 64 and 4 heads checks that policies
// size by head_dim, not dim / num_heads.
TEST(PolicyLaws, Qwen3Tiny) {
  const std::string path = std::string(KVB_FIXTURES_DIR) + "/engine/qwen3_tiny.gguf";
  std::unique_ptr<engine::Model> m = engine::load_model(path);
  ASSERT_TRUE(m->config.qk_norm);
  ASSERT_NE(m->config.head_dim, m->config.dim / m->config.num_heads);
  const std::string text = "Policies see the keys after Qwen3's per-head RMSNorm.";
  const std::vector<int32_t> prompt(text.begin(), text.end());
  check_model(*m, prompt, 12);
}

// Gemma 3's sliding-window layers keep their own window-sized cache whatever the policy, and
// policies act on the global layer only (POLICIES.md "Sliding-window layers"): every law still
// holds, and the sliding layers' 15 rows stay under the small budget (max(8, 60 / 3) = 20).
TEST(PolicyLaws, Gemma3Tiny) {
  const std::string path = std::string(KVB_FIXTURES_DIR) + "/engine/gemma3_tiny.gguf";
  std::unique_ptr<engine::Model> m = engine::load_model(path);
  ASSERT_TRUE(m->config.sliding(0));
  ASSERT_FALSE(m->config.sliding(5));
  const std::string text = "Sliding layers keep a window; only the global layer is evicted.";
  const std::vector<int32_t> prompt(text.begin(), text.end());
  ASSERT_GE(prompt.size(), 60u);
  check_model(*m, prompt, 12);
}

// Phi-3's LongRoPE and YaRN scale cos and sin by an attention factor and divide the frequencies
// per dimension; Phi-3 rotates only half of each head. The rolling-positions path re-rotates the
// pre-RoPE keys with the same parameters, so every law must hold as on plain RoPE.
TEST(PolicyLaws, Phi3Tiny) {
  const std::string path = std::string(KVB_FIXTURES_DIR) + "/engine/phi3_tiny.gguf";
  std::unique_ptr<engine::Model> m = engine::load_model(path);
  ASSERT_NE(m->config.rope.attn_factor, 1.0f);
  ASSERT_LT(m->config.rope.rot_dim, m->config.head_dim);
  const std::string text = "LongRoPE: long factors for the run, cos and sin scaled by 1.265.";
  const std::vector<int32_t> prompt(text.begin(), text.end());
  check_model(*m, prompt, 12);
}

TEST(PolicyLaws, Qwen2YarnTiny) {
  const std::string path = std::string(KVB_FIXTURES_DIR) + "/engine/qwen2_yarn_tiny.gguf";
  std::unique_ptr<engine::Model> m = engine::load_model(path);
  ASSERT_EQ(m->config.rope_scaling, "yarn");
  const std::string text = "YaRN blends interpolated and original frequencies per dimension.";
  const std::vector<int32_t> prompt(text.begin(), text.end());
  check_model(*m, prompt, 12);
}

}  // namespace
}  // namespace kvb
