// Per-policy memory and time on one long prompt (SmolLM2 by default): KV bytes retained after the
// prompt and after decoding, as a share of `full`'s, the policy's own state, the time spent
// inside policy hooks (eviction overhead) and decode ms/token. Prints an md table on stdout.
//   bench_policy_table [--model PATH] [--prompt-tokens 2048] [--kv-budget 256] [--new-tokens 16]
//                      [--policies full,h2o,...]   (default: every registered policy; the "% of
//                                                   full" columns need `full` among them; an entry
//                                                   name:key=value:... sets options, e.g.
//                                                   keydiff:critical=true)
// The prompt is WikiText-2 test text from ../shared (a fixed slice), so runs are comparable.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/table.h"
#include "kernels/policies/policy.h"
#include "workers/engine/generate.h"
#include "workers/model_session.h"

namespace {
std::string fmt(double v, int p) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(p) << v;
  return s.str();
}
}  // namespace

int main(int argc, char** argv) {
  using namespace kvb;
  std::string model = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string text_file = std::string(KVB_SHARED_DIR) + "/data/wikitext-2/test.txt";
  int prompt_tokens = 2048, budget = 256, new_tokens = 16;
  std::set<std::string> only;  // --policies: empty runs every registered policy
  // --policies entries with options (name:key=value:...), per policy name, in the listed order.
  std::map<std::string, std::vector<std::map<std::string, std::string>>> variants;
  for (int i = 1; i < argc; ++i) {  // a flag without its value, or --help: the usage
    const bool help = !std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h");
    if (help || (i % 2 == 1 && i + 1 == argc)) {
      std::cerr << "usage: bench_policy_table [--model PATH] [--text FILE] [--prompt-tokens 2048] "
                   "[--kv-budget 256] [--new-tokens 16] [--policies full,h2o,...]\n"
                   "  --policies: names, or name:key=value:... with options (keydiff:critical=true)\n"
                   "  per policy on one WikiText-2 prompt: KV bytes after the prompt and after "
                   "decoding (% of full's), state bytes, prefill ms, policy ms, decode ms/token\n";
      return help ? 0 : 2;
    }
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) model = argv[i + 1];
    else if (!std::strcmp(argv[i], "--text")) text_file = argv[i + 1];
    else if (!std::strcmp(argv[i], "--prompt-tokens")) prompt_tokens = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--kv-budget")) budget = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--new-tokens")) new_tokens = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--policies")) {
      std::stringstream list(argv[i + 1]);
      for (std::string entry; std::getline(list, entry, ',');) {
        std::stringstream parts(entry);
        std::string name;
        std::getline(parts, name, ':');
        std::map<std::string, std::string> opts;
        for (std::string kv; std::getline(parts, kv, ':');) {
          const size_t eq = kv.find('=');
          if (eq == std::string::npos || eq == 0) {
            std::cerr << "--policies: '" << kv << "' in '" << entry << "' is not key=value\n";
            return 2;
          }
          opts[kv.substr(0, eq)] = kv.substr(eq + 1);
        }
        only.insert(name);
        variants[name].push_back(std::move(opts));
      }
    } else {
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
    std::vector<int32_t> prompt = workers::encode_text(lm, ss.str().substr(0, 40 * prompt_tokens), false, false);
    if (static_cast<int>(prompt.size()) < prompt_tokens) throw Error("text too short");
    prompt.resize(prompt_tokens);
    engine::Engine eng(*lm.model);
    const auto& c = lm.model->config;
    Table table({"policy", "kv_budget", "prompt tok", "KV bytes after prompt",
                          "% of full", "KV bytes final", "% of full (final)", "state bytes",
                          "peak head len", "prefill ms", "policy ms", "decode ms/tok", "status"});
    double full_prompt = 0, full_final = 0;
    for (const std::string& name : only) {
      if (!policies::find_policy(name)) throw Error("--policies: unknown policy '" + name + "'");
    }
    std::vector<std::pair<const policies::PolicyInfo*, std::map<std::string, std::string>>> runs;
    for (const auto& info : policies::policy_registry()) {
      if (!only.empty() && !only.count(info.name)) continue;
      // duo_attention needs the authors' pattern folder for the model: only when given
      // (--policies duo_attention:patterns=DIR:head_compression_ratio=R).
      if (info.name == "duo_attention" && !variants.count(info.name)) continue;
      if (variants.count(info.name)) {
        for (const auto& o : variants[info.name]) runs.push_back({&info, o});
      } else {
        runs.push_back({&info, {}});
      }
    }
    for (const auto& [info_ptr, opts] : runs) {
      const policies::PolicyInfo& info = *info_ptr;
      std::string label = info.name;
      for (const auto& [k, v] : opts) label += " " + k + "=" + v;
      policies::PolicyConfig pc;
      pc.name = info.name;
      pc.kv_budget = info.name == "full" ? 0 : budget;
      pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
      // python runs a script: the example H2O (bench_python_policy compares it with native h2o).
      if (info.name == "python") {
        pc.options = policies::PolicyOptions(std::map<std::string, std::string>{
            {"file", std::string(KVB_EXAMPLES_DIR) + "/policies/h2o.py"}});
      }
      // finch's window is a task's question; the bench's prompt is one text: its last 32 tokens
      // (snapkv's window) unless --policies finch:window_size=N says otherwise.
      if (info.name == "finch") {
        pc.options = policies::PolicyOptions(std::map<std::string, std::string>{
            {"window_size", "32"}});
      }
      if (!opts.empty()) pc.options = policies::PolicyOptions(opts);
      auto policy = policies::make_policy(pc);
      // kvzip's reconstruction prompt, as `kvbench generate` hands it (one text: no template).
      if (policy->reconstructs_context()) policy->set_replay_prompt(workers::replay_prompt(lm, 0, {}));
      kernels::KvCache cache = eng.new_cache(prompt_tokens + new_tokens, policy.get());
      std::vector<float> logits;
      const double pol0 = eng.policy_ms();
      auto t0 = std::chrono::steady_clock::now();
      engine::prefill_prompt(eng, cache, prompt, policy.get(), &logits);
      const double prefill_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      const double after_prompt = eng.kv_logical_bytes(cache);  // less ThinK's channels
      int peak = cache.max_length();
      engine::GenerateOptions go;
      go.max_new_tokens = new_tokens;
      engine::GenerateResult r = engine::generate_from(
          eng, cache, logits, go, [&](int32_t) { peak = std::max(peak, cache.max_length()); return true; },
          policy.get());
      const double final_bytes = eng.kv_logical_bytes(cache);
      if (info.name == "full") {
        full_prompt = after_prompt;
        full_final = final_bytes;
      }
      table.add({label, std::to_string(pc.kv_budget), std::to_string(prompt_tokens),
                 fmt(after_prompt, 0),
                 full_prompt > 0 ? fmt(100.0 * after_prompt / full_prompt, 2) : "n/a",
                 fmt(final_bytes, 0),
                 full_final > 0 ? fmt(100.0 * final_bytes / full_final, 2) : "n/a",
                 std::to_string(policy->state_bytes()), std::to_string(peak), fmt(prefill_ms, 0),
                 fmt(eng.policy_ms() - pol0, 1),
                 fmt(r.decode_steps ? r.decode_ms / r.decode_steps : 0, 2), "ok"});
      std::cerr << "[bench_policy_table] " << label << " done\n";
    }
    table.print(std::cout, "md");
  } catch (const std::exception& e) {
    std::cerr << "bench_policy_table: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
