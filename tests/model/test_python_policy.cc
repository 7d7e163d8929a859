// `--policy python` (kernels/policies/python_policy.cc, POLICIES.md "A policy in Python"): the
// examples in examples/policies/ against the native policies and an independent float64
// computation on SmolLM2, and hostile modules, each a clear error naming the file and function.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "common/error.h"
#include "workers/engine/generate.h"
#include "workers/formats/model_load.h"
#include "workers/model_session.h"

namespace kvb {
namespace {

using KeepSets = std::vector<std::vector<std::vector<int32_t>>>;  // [layer][head] positions

const std::string kExamples = std::string(KVB_EXAMPLES_DIR) + "/policies/";

class PythonPolicySmol : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string model = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
    ASSERT_TRUE(std::ifstream(model).good()) << model << " missing: run scripts/fetch_models.sh";
    lm_ = new workers::LoadedModel(workers::load_model_and_tokenizer(model, ""));
    std::ifstream in(std::string(KVB_SHARED_DIR) + "/data/wikitext-2/test.txt");
    ASSERT_TRUE(in.good());
    std::string text(6000, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    prompt_ = new std::vector<int32_t>(workers::encode_prompt(*lm_, text, false, ""));
    prompt_->resize(std::min<size_t>(prompt_->size(), 600));
    ASSERT_GE(prompt_->size(), 500u);
  }

  static policies::PolicyConfig config(const std::string& name, int budget,
                                       std::map<std::string, std::string> opts = {}) {
    const auto& c = lm_->model->config;
    policies::PolicyConfig pc;
    pc.name = name;
    pc.kv_budget = budget;
    pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
    pc.options = policies::PolicyOptions(std::move(opts));
    return pc;
  }

  static KeepSets keep_sets(const kernels::KvCache& cache) {
    KeepSets k(cache.shape().num_layers);
    for (int l = 0; l < cache.shape().num_layers; ++l) {
      const kernels::LayerKvView v = cache.layer(l);
      for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
        k[l].emplace_back(v.position(h), v.position(h) + cache.length(l, h));
      }
    }
    return k;
  }

  struct Run {
    KeepSets after_prefill, at_end;
    std::vector<int32_t> tokens;
  };
  static Run run(const policies::PolicyConfig& pc, int new_tokens) {
    engine::Engine eng(*lm_->model);
    auto policy = policies::make_policy(pc);
    kernels::KvCache cache =
        eng.new_cache(static_cast<int>(prompt_->size()) + new_tokens + 1, policy.get());
    std::vector<float> logits;
    policy->begin_sequence(static_cast<int>(prompt_->size()));
    engine::prefill_prompt(eng, cache, *prompt_, policy.get(), &logits);
    Run r;
    r.after_prefill = keep_sets(cache);
    for (int i = 0; i < new_tokens; ++i) {
      const int32_t next =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      r.tokens.push_back(next);
      eng.forward({&next, 1}, cache, engine::LogitsMode::kLast, &logits, policy.get(),
                  engine::PolicyHook::kDecode);
    }
    r.at_end = keep_sets(cache);
    return r;
  }

  // The whole prompt's cache (post-RoPE keys of every token), for independent computations.
  static kernels::KvCache full_cache() {
    engine::Engine eng(*lm_->model);
    kernels::KvCache cache = eng.new_cache(static_cast<int>(prompt_->size()));
    std::vector<float> logits;
    eng.forward(*prompt_, cache, engine::LogitsMode::kLast, &logits);
    return cache;
  }

  // Compares keep-sets head by head against `expected`; a head that differs must differ only
  // in tokens whose reference score lies within `tol` (relative) of the head's boundary score
  // (the budget-th best). score(l, h, slot): the reference score of the full cache's slot
  // (higher keeps). Returns the number of heads that differ (near ties).
  static int compare_with_near_ties(const KeepSets& got, const KeepSets& expected, int budget,
                                    const std::function<double(int, int, int)>& score,
                                    double tol) {
    int differing = 0;
    for (size_t l = 0; l < got.size(); ++l) {
      for (size_t h = 0; h < got[l].size(); ++h) {
        if (got[l][h] == expected[l][h]) continue;
        ++differing;
        std::vector<double> all;
        const int n = static_cast<int>(prompt_->size());
        for (int s = 0; s < n; ++s) all.push_back(score(l, h, s));
        std::vector<double> sorted = all;
        std::sort(sorted.begin(), sorted.end(), std::greater<>());
        const double boundary = sorted[budget - 1];
        std::set<int32_t> a(got[l][h].begin(), got[l][h].end());
        std::set<int32_t> b(expected[l][h].begin(), expected[l][h].end());
        for (int32_t p : a) {
          if (!b.count(p)) {
            EXPECT_LE(std::abs(all[p] - boundary), tol * std::abs(boundary))
                << "layer " << l << " head " << h << ": position " << p
                << " kept only by the Python policy is no near tie";
          }
        }
        for (int32_t p : b) {
          if (!a.count(p)) {
            EXPECT_LE(std::abs(all[p] - boundary), tol * std::abs(boundary))
                << "layer " << l << " head " << h << ": position " << p
                << " dropped only by the Python policy is no near tie";
          }
        }
      }
    }
    return differing;
  }

  static workers::LoadedModel* lm_;
  static std::vector<int32_t>* prompt_;
};

workers::LoadedModel* PythonPolicySmol::lm_ = nullptr;
std::vector<int32_t>* PythonPolicySmol::prompt_ = nullptr;

// knorm.py keeps what the native knorm keeps, per (layer, head), at three budgets; the native
// policy ranks pre-RoPE norms in float64, the module post-RoPE norms in float32, so heads may
// differ at near ties only (|norm difference| within 1e-5 relative), counted and printed.
TEST_F(PythonPolicySmol, KnormPyKeepsTheNativeKnormsKeepSets) {
  const kernels::KvCache full = full_cache();
  const int d = lm_->model->config.head_dim;
  auto norm_score = [&](int l, int h, int s) {
    const float* k = full.layer(l).key(h, s);
    double sum = 0;
    for (int i = 0; i < d; ++i) sum += static_cast<double>(k[i]) * k[i];
    return -std::sqrt(sum);
  };
  int heads_total = 0, differing_total = 0;
  for (int budget : {32, 128, 300}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    const Run native = run(config("knorm", budget), 0);
    const Run py = run(config("python", budget, {{"file", kExamples + "knorm.py"}}), 0);
    const int differing =
        compare_with_near_ties(py.after_prefill, native.after_prefill, budget, norm_score, 1e-5);
    const int heads = static_cast<int>(native.after_prefill.size() * native.after_prefill[0].size());
    std::cout << "[ knorm.py ] budget " << budget << ": " << heads - differing << "/" << heads
              << " heads identical, " << differing << " differ at near ties\n";
    heads_total += heads;
    differing_total += differing;
    for (const auto& layer : py.after_prefill) {
      for (const auto& head : layer) EXPECT_EQ(static_cast<int>(head.size()), budget);
    }
  }
  EXPECT_LE(differing_total * 10, heads_total) << "more than a tenth of the heads differ";
}

// h2o.py (decode_score) generates the native h2o's tokens and keeps its keep-sets exactly.
TEST_F(PythonPolicySmol, H2oPyEqualsTheNativeH2oTokensAndKeepSets) {
  for (int budget : {64, 160}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    const Run native = run(config("h2o", budget), 24);
    const Run py = run(config("python", budget, {{"file", kExamples + "h2o.py"}}), 24);
    EXPECT_EQ(py.tokens, native.tokens);
    EXPECT_EQ(py.after_prefill, native.after_prefill);
    EXPECT_EQ(py.at_end, native.at_end);
    for (const auto& layer : py.at_end) {
      for (const auto& head : layer) EXPECT_EQ(static_cast<int>(head.size()), budget);
    }
  }
  // An option reaches the module typed by its OPTIONS and changes the result as natively.
  const Run native = run(config("h2o", 64, {{"heavy_fraction", "0.25"}}), 8);
  const Run py = run(config("python", 64, {{"file", kExamples + "h2o.py"},
                                          {"heavy_fraction", "0.25"}}), 8);
  EXPECT_EQ(py.tokens, native.tokens);
  EXPECT_EQ(py.at_end, native.at_end);
}

// keydiff.py against KeyDiff computed here in float64 from the full cache's keys: minus the
// cosine of each key to the mean of the head's normalised keys; ties keep the later token.
TEST_F(PythonPolicySmol, KeydiffPyMatchesAFloat64Computation) {
  const kernels::KvCache full = full_cache();
  const int d = lm_->model->config.head_dim;
  const int n = static_cast<int>(prompt_->size());
  const int layers = full.shape().num_layers, heads = full.shape().num_kv_heads;
  std::vector<std::vector<std::vector<double>>> ref(layers);
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < heads; ++h) {
      std::vector<double> anchor(d, 0.0), norms(n);
      for (int s = 0; s < n; ++s) {
        const float* k = full.layer(l).key(h, s);
        double sq = 0;
        for (int i = 0; i < d; ++i) sq += static_cast<double>(k[i]) * k[i];
        norms[s] = std::sqrt(sq);
        for (int i = 0; i < d; ++i) anchor[i] += k[i] / std::max(norms[s], 1e-12) / n;
      }
      double an = 0;
      for (double a : anchor) an += a * a;
      an = std::sqrt(an);
      std::vector<double> score(n);
      for (int s = 0; s < n; ++s) {
        const float* k = full.layer(l).key(h, s);
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += k[i] * anchor[i];
        score[s] = -dot / std::max(norms[s] * an, 1e-8);
      }
      ref[l].push_back(std::move(score));
    }
  }
  for (int budget : {48, 200}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    KeepSets expected(layers);
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < heads; ++h) {
        std::vector<int32_t> idx(n);
        std::iota(idx.begin(), idx.end(), 0);
        const auto& sc = ref[l][h];
        std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
          return sc[a] != sc[b] ? sc[a] > sc[b] : a > b;
        });
        idx.resize(budget);
        std::sort(idx.begin(), idx.end());
        expected[l].push_back(idx);
      }
    }
    const Run py = run(config("python", budget, {{"file", kExamples + "keydiff.py"}}), 0);
    const int differing = compare_with_near_ties(
        py.after_prefill, expected, budget, [&](int l, int h, int s) { return ref[l][h][s]; },
        1e-5);
    std::cout << "[ keydiff.py ] budget " << budget << ": " << layers * heads - differing << "/"
              << layers * heads << " heads equal the float64 keep-set, " << differing
              << " differ at near ties\n";
    EXPECT_LE(differing * 10, layers * heads);
  }
}

// ---- hostile modules ---------------------------------------------------------------------

std::string write_module(const std::string& name, const std::string& body) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "kvb_python_policy";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << body;
  return path;
}

// The python policy at kv_budget 8 on model m with `opts` (file=...).
policies::PolicyConfig python_config(const engine::Model& m,
                                     const std::map<std::string, std::string>& opts) {
  const auto& c = m.config;
  policies::PolicyConfig pc;
  pc.name = "python";
  pc.kv_budget = 8;
  pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
  pc.options = policies::PolicyOptions(opts);
  return pc;
}

// Runs a prefill (and a few decode steps) with the module; returns the error's message and
// kind, and how long it took.
struct Outcome {
  bool threw = false;
  std::string message;
  ErrorKind kind = ErrorKind::kRuntime;
  double seconds = 0;
};

Outcome run_module(const engine::Model& m, const std::string& path,
                   std::map<std::string, std::string> opts = {}) {
  opts["file"] = path;
  const policies::PolicyConfig pc = python_config(m, opts);
  Outcome o;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    engine::Engine eng(m);
    auto policy = policies::make_policy(pc);
    kernels::KvCache cache = eng.new_cache(40, policy.get());
    policy->begin_sequence(24);
    std::vector<int32_t> prompt = {1};
    for (int i = 0; i < 23; ++i) prompt.push_back(3 + i * 7);
    std::vector<float> logits;
    engine::prefill_prompt(eng, cache, prompt, policy.get(), &logits);
    for (int32_t t : {5, 6, 7}) {
      eng.forward({&t, 1}, cache, engine::LogitsMode::kLast, &logits, policy.get(),
                  engine::PolicyHook::kDecode);
    }
  } catch (const Error& e) {
    o.threw = true;
    o.message = e.what();
    o.kind = e.kind();
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return o;
}

TEST(PythonPolicyHostile, EachFailureIsAnErrorNamingTheFileAndFunction) {
  const std::string path = std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin";
  std::unique_ptr<engine::Model> m = engine::load_model(path);
  const std::string ok_score =
      "import numpy as np\ndef score(ctx):\n    return -np.linalg.norm(ctx.keys, axis=-1)\n";
  struct Case {
    std::string name, body, function, expect;
    std::map<std::string, std::string> opts;
    ErrorKind kind = ErrorKind::kRuntime;
  };
  const std::vector<Case> cases = {
      {"raises.py", "def score(ctx):\n    return 1 / 0\n", "score()",
       "raised ZeroDivisionError: division by zero (at "},
      {"shape.py", "import numpy as np\ndef score(ctx):\n    return np.zeros((1, 2), np.float32)\n",
       "score()", "returned shape [1, 2]"},
      {"dtype.py", "import numpy as np\ndef score(ctx):\n    return np.zeros(ctx.keys.shape[:2])\n",
       "score()", "format 'd' (use .astype(numpy.float32))"},
      {"nan.py",
       "import numpy as np\ndef score(ctx):\n    s = np.zeros(ctx.keys.shape[:2], np.float32)\n"
       "    s[0, 3] = np.nan\n    return s\n",
       "score()", "returned NaN at head 0, slot 3"},
      {"a_list.py", "def score(ctx):\n    return [[0.0]]\n", "score()", "returned a list"},
      {"forever.py", "def score(ctx):\n    while True:\n        pass\n", "score()",
       "exceeded its time limit of 1 s", {{"time_limit_s", "1"}}},
      {"decode_forever.py", ok_score + "def decode_score(ctx):\n    while True:\n        pass\n",
       "decode_score()", "exceeded its time limit of 1 s", {{"time_limit_s", "1"}}},
      {"missing_import.py", "import kvbench_no_such_module\n" + ok_score, "loading the module",
       "raised ModuleNotFoundError: No module named 'kvbench_no_such_module'"},
      {"greedy.py",
       "import numpy as np\nheld = []\ndef score(ctx):\n    while True:\n"
       "        held.append(np.ones(10**7))\n",
       "score()", "ran out of memory: MemoryError", {{"memory_limit_gb", "0.5"}},
       ErrorKind::kOutOfMemory},
      {"keeps_view.py", "import numpy as np\ndef score(ctx):\n    ctx.state['k'] = ctx.keys\n"
                        "    return -np.linalg.norm(ctx.keys, axis=-1)\n",
       "score()", "kept ctx.keys"},
      // ctx's rows are made on their first read by a function of ctx's; kept past its call and
      // called later, it refuses (it would read a cache and a call that are gone).
      {"late_rows.py",
       "import numpy as np\nheld = []\ndef score(ctx):\n    held.append(ctx._kvbench_rows)\n"
       "    return np.zeros(ctx.positions.shape, np.float32)\n"
       "def decode_score(ctx):\n    held[0](ctx)\n"
       "    return np.zeros(ctx.positions.shape, np.float32)\n",
       "decode_score()",
       "RuntimeError: ctx.keys and ctx.values are valid only during the call that got ctx"},
      {"keeps_ctx.py", "import numpy as np\nheld = []\ndef score(ctx):\n    held.append(ctx)\n"
                       "    return np.zeros(ctx.positions.shape, np.float32)\n",
       "score()", "kept ctx.positions"},
      {"no_score.py", "def scores(ctx):\n    pass\n", "", "defines no function score(ctx)"},
      {"syntax.py", "def score(ctx)\n    return 0\n", "loading the module", "raised SyntaxError"},
      {"bad_option.py", "OPTIONS = {'alpha2': 1.0}\n" + ok_score, "", "unknown option 'beta2'",
       {{"beta2", "3"}}},
      {"typed_option.py", "OPTIONS = {'steps': 1}\n" + ok_score, "", "steps=x is not an integer",
       {{"steps", "x"}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string file = write_module(c.name, c.body);
    const Outcome o = run_module(*m, file, c.opts);
    ASSERT_TRUE(o.threw) << "no error";
    EXPECT_NE(o.message.find("python policy " + file), std::string::npos) << o.message;
    if (!c.function.empty()) EXPECT_NE(o.message.find(c.function), std::string::npos) << o.message;
    EXPECT_NE(o.message.find(c.expect), std::string::npos) << o.message;
    EXPECT_EQ(o.kind, c.kind) << o.message;
    EXPECT_LT(o.seconds, 30) << "took " << o.seconds << " s";
    // The interpreter is still sound: a good module runs afterwards.
    const Outcome good = run_module(*m, write_module("good.py", ok_score));
    EXPECT_FALSE(good.threw) << good.message;
  }
  // The file itself: missing, or not given.
  const Outcome missing = run_module(*m, "/nonexistent/policy.py");
  EXPECT_TRUE(missing.threw);
  EXPECT_NE(missing.message.find("file=/nonexistent/policy.py is not a readable regular file"),
            std::string::npos)
      << missing.message;
  EXPECT_EQ(missing.kind, ErrorKind::kUsage);
}

// ctx.keys and ctx.values are made when first read: absent from vars(ctx) until then, the
// same read-only arrays on every later read (deleted and read again too), and any other missing
// field is an AttributeError;
// the keep-sets are those of a module that reads the rows at once.
TEST(PythonPolicyCtx, RowsAreMadeOnFirstReadAndOtherFieldsStayMissing) {
  const std::string path = std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin";
  std::unique_ptr<engine::Model> m = engine::load_model(path);
  const std::string file = write_module(
      "lazy_rows.py",
      "import numpy as np\n"
      "def check(ctx):\n"
      "    assert 'keys' not in vars(ctx) and 'values' not in vars(ctx), sorted(vars(ctx))\n"
      "    assert getattr(ctx, 'no_such_field', None) is None\n"
      "    try:\n"
      "        ctx.no_such_field\n"
      "        raise AssertionError('no AttributeError')\n"
      "    except AttributeError as e:\n"
      "        assert 'no_such_field' in str(e), str(e)\n"
      "    assert hasattr(ctx, 'values')\n"
      "    k = ctx.keys\n"
      "    assert k is ctx.keys and ctx.values is vars(ctx)['values']\n"
      "    del ctx.keys\n"
      "    assert ctx.keys is k  # made once per call: a second read sets the same arrays\n"
      "    kv, n = ctx.positions.shape\n"
      "    assert k.shape[:2] == (kv, n) and k.dtype == np.float32 and not k.flags.writeable\n"
      "    ctx.state['calls'] = ctx.state.get('calls', 0) + 1\n"
      "    return -np.linalg.norm(k, axis=-1)\n"
      "def score(ctx):\n"
      "    return check(ctx)\n"
      "def decode_score(ctx):\n"
      "    return check(ctx)\n");
  const Outcome o = run_module(*m, file);
  EXPECT_FALSE(o.threw) << o.message;
  // The same keep-sets as a module that reads the rows at once (ok_score of the hostile test).
  const std::string eager = write_module(
      "eager_rows.py",
      "import numpy as np\n"
      "def score(ctx):\n    return -np.linalg.norm(ctx.keys, axis=-1)\n"
      "def decode_score(ctx):\n    return -np.linalg.norm(ctx.keys, axis=-1)\n");
  const auto& c = m->config;
  auto keep_of = [&](const std::string& f) {
    const policies::PolicyConfig pc = python_config(*m, {{"file", f}});
    engine::Engine eng(*m);
    auto policy = policies::make_policy(pc);
    kernels::KvCache cache = eng.new_cache(40, policy.get());
    std::vector<int32_t> prompt = {1};
    for (int i = 0; i < 23; ++i) prompt.push_back(3 + i * 7);
    policy->begin_sequence(24);
    std::vector<float> logits;
    engine::prefill_prompt(eng, cache, prompt, policy.get(), &logits);
    for (int32_t t : {5, 6, 7}) {
      eng.forward({&t, 1}, cache, engine::LogitsMode::kLast, &logits, policy.get(),
                  engine::PolicyHook::kDecode);
    }
    std::vector<std::vector<int32_t>> kept;
    for (int l = 0; l < c.num_layers; ++l) {
      for (int h = 0; h < c.num_kv_heads; ++h) {
        const int32_t* p = cache.layer(l).position(h);
        kept.emplace_back(p, p + cache.length(l, h));
      }
    }
    return kept;
  };
  const auto lazy = keep_of(file), direct = keep_of(eager);
  EXPECT_EQ(lazy, direct);
  ASSERT_FALSE(lazy.empty());
  EXPECT_EQ(lazy[0].size(), 8u);  // evicted to the budget
}

// A state dict lives for the unit, and a clone (a fork after a shared prefix) copies it.
TEST(PythonPolicyState, StateLivesForTheUnitAndClonesCopyIt) {
  const std::string path = std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin";
  std::unique_ptr<engine::Model> m = engine::load_model(path);
  const std::string file = write_module(
      "counting.py",
      "import numpy as np\n"
      "def score(ctx):\n"
      "    ctx.state['n'] = ctx.state.get('n', 0) + 1\n"
      "    return np.zeros(ctx.keys.shape[:2], np.float32)\n"
      "def decode_score(ctx):\n"
      "    ctx.state['n'] = ctx.state.get('n', 0) + 1\n"
      "    # the count of calls so far: the token of the step-th call is kept everywhere else\n"
      "    s = np.zeros(ctx.keys.shape[:2], np.float32)\n"
      "    if ctx.state['n'] > 100:\n"
      "        raise RuntimeError('calls %d' % ctx.state['n'])\n"
      "    return s\n");
  const policies::PolicyConfig pc = python_config(*m, {{"file", file}});
  engine::Engine eng(*m);
  auto policy = policies::make_policy(pc);
  kernels::KvCache cache = eng.new_cache(200, policy.get());
  std::vector<int32_t> prompt = {1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41};
  std::vector<float> logits;
  engine::prefill_prompt(eng, cache, prompt, policy.get(), &logits);
  // stories260K has 5 layers: 5 calls so far. 19 decode steps: 95 more, then the clone copies
  // the count, so the original and the clone each fail at their own 101st call.
  for (int i = 0; i < 19; ++i) {
    int32_t t = 3 + i;
    eng.forward({&t, 1}, cache, engine::LogitsMode::kLast, &logits, policy.get(),
                engine::PolicyHook::kDecode);
  }
  std::unique_ptr<policies::Policy> copy = policy->clone();
  kernels::KvCache cache2 = cache;
  int32_t t = 7;
  try {
    eng.forward({&t, 1}, cache, engine::LogitsMode::kLast, &logits, policy.get(),
                engine::PolicyHook::kDecode);
    FAIL() << "the 101st call did not raise";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("RuntimeError: calls 101"), std::string::npos) << e.what();
  }
  try {
    eng.forward({&t, 1}, cache2, engine::LogitsMode::kLast, &logits, copy.get(),
                engine::PolicyHook::kDecode);
    FAIL() << "the clone's 101st call did not raise";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("RuntimeError: calls 101"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvb
