// The cost of a policy written in Python (`--policy python`, examples/policies/) against the
// native policy it reimplements, on one long prompt (SmolLM2, WikiText-2, 4,096 tokens by
// default): prefill wall time and the time inside policy hooks, per prefill layer, and decode
// ms per step with its policy share. Native and Python runs alternate (A B A B ...), --pairs
// times; the table holds medians and the Python/native ratios of the same run.
//   bench_python_policy [--model PATH] [--prompt-tokens 4096] [--kv-budget 512]
//                       [--new-tokens 16] [--pairs 5]
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "common/error.h"
#include "bench/bench_stats.h"
#include "common/table.h"
#include "kernels/policies/policy.h"
#include "workers/engine/generate.h"
#include "workers/model_session.h"

namespace {
using kvb::bench::fmt;
using kvb::bench::median;
struct Sample {
  double prefill_ms = 0, prefill_policy_ms = 0, step_ms = 0, step_policy_ms = 0;
};
}  // namespace

int main(int argc, char** argv) {
  using namespace kvb;
  std::string model = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string text_file = std::string(KVB_SHARED_DIR) + "/data/wikitext-2/test.txt";
  std::string examples = std::string(KVB_EXAMPLES_DIR) + "/policies/";
  int prompt_tokens = 4096, budget = 512, new_tokens = 16, pairs = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) model = argv[i + 1];
    else if (!std::strcmp(argv[i], "--prompt-tokens")) prompt_tokens = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--kv-budget")) budget = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--new-tokens")) new_tokens = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--pairs")) pairs = std::atoi(argv[i + 1]);
    else {
      std::cerr << "unknown flag " << argv[i] << "\n";
      return 2;
    }
  }
  try {
    workers::LoadedModel lm = workers::load_model_and_tokenizer(model, "");
    std::ifstream in(text_file);
    if (!in) throw Error("cannot open " + text_file);
    std::ostringstream ss;
    ss << in.rdbuf();
    std::vector<int32_t> prompt =
        workers::encode_text(lm, ss.str().substr(0, 40 * prompt_tokens), false, false);
    if (static_cast<int>(prompt.size()) < prompt_tokens) throw Error("text too short");
    prompt.resize(prompt_tokens);
    engine::Engine eng(*lm.model);
    const auto& c = lm.model->config;
    int global_layers = 0;
    for (int l = 0; l < c.num_layers; ++l) global_layers += c.sliding(l) ? 0 : 1;
    auto run = [&](const std::string& name, const std::map<std::string, std::string>& opts) {
      policies::PolicyConfig pc;
      pc.name = name;
      pc.kv_budget = budget;
      pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
      pc.options = policies::PolicyOptions(opts);
      auto policy = policies::make_policy(pc);
      kernels::KvCache cache = eng.new_cache(prompt_tokens + new_tokens, policy.get());
      std::vector<float> logits;
      Sample s;
      double pol0 = eng.policy_ms();
      auto t0 = std::chrono::steady_clock::now();
      policy->begin_sequence(prompt_tokens);
      engine::prefill_prompt(eng, cache, prompt, policy.get(), &logits);
      s.prefill_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      s.prefill_policy_ms = eng.policy_ms() - pol0;
      pol0 = eng.policy_ms();
      engine::GenerateOptions go;
      go.max_new_tokens = new_tokens;
      engine::GenerateResult r = engine::generate_from(eng, cache, logits, go, nullptr, policy.get());
      s.step_ms = r.decode_steps ? r.decode_ms / r.decode_steps : 0;
      s.step_policy_ms = r.decode_steps ? (eng.policy_ms() - pol0) / r.decode_steps : 0;
      return s;
    };
    Table table({"policy", "prompt tok", "prefill ms", "policy ms / prefill layer",
                 "prefill vs native", "decode ms/step", "policy ms/step", "decode vs native"});
    const std::vector<std::tuple<std::string, std::string>> cases = {{"knorm", "knorm.py"},
                                                                     {"h2o", "h2o.py"}};
    for (const auto& [native, file] : cases) {
      std::vector<Sample> a, b;
      std::vector<double> prefill_ratio, step_ratio;
      for (int p = 0; p < pairs; ++p) {
        a.push_back(run(native, {}));
        b.push_back(run("python", {{"file", examples + file}}));
        prefill_ratio.push_back(b.back().prefill_ms / a.back().prefill_ms);
        if (a.back().step_ms > 0) step_ratio.push_back(b.back().step_ms / a.back().step_ms);
        std::cerr << "[bench_python_policy] " << native << " pair " << p + 1 << "/" << pairs
                  << ": prefill " << fmt(a.back().prefill_ms, 0) << " / "
                  << fmt(b.back().prefill_ms, 0) << " ms, step " << fmt(a.back().step_ms, 2)
                  << " / " << fmt(b.back().step_ms, 2) << " ms\n";
      }
      auto col = [](const std::vector<Sample>& v, double Sample::*f) {
        std::vector<double> x;
        for (const Sample& s : v) x.push_back(s.*f);
        return median(x);
      };
      for (int side = 0; side < 2; ++side) {
        const std::vector<Sample>& v = side == 0 ? a : b;
        table.add({side == 0 ? native : "python " + file, std::to_string(prompt_tokens),
                   fmt(col(v, &Sample::prefill_ms), 0),
                   fmt(col(v, &Sample::prefill_policy_ms) / global_layers, 2),
                   side == 0 ? "1" : fmt(median(prefill_ratio), 3),
                   fmt(col(v, &Sample::step_ms), 2), fmt(col(v, &Sample::step_policy_ms), 2),
                   side == 0 ? "1" : fmt(median(step_ratio), 3)});
      }
    }
    std::cout << "SmolLM2 (" << model << "), kv_budget " << budget << ", " << new_tokens
              << " decode steps, " << pairs << " interleaved pairs, medians\n";
    table.print(std::cout, "md");
  } catch (const std::exception& e) {
    std::cerr << "bench_python_policy: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
