// `kvbench generate`: load a model, encode a prompt, generate, print the text to stdout;
// timings and model facts go to stderr.
#include <boost/program_options.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "common/file_io.h"
#include "common/log.h"
#include "harness/cli.h"
#include "harness/sweep_config.h"
#include "kernels/policies/policy.h"
#include "workers/engine/generate.h"
#include "workers/model_session.h"

namespace po = boost::program_options;

namespace kvb::harness {

namespace {
std::string read_text_file(const std::string& path) {
  // Before the open: a FIFO would block it forever, a device (/dev/zero) never end.
  require_regular_file(path, "--prompt-file", "give a text file");
  std::ifstream in(path, std::ios::binary);
  KVB_USAGE_CHECK(in.good()) << "cannot open --prompt-file '" << path << "'";
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// --follow-ids: token ids separated by spaces or commas, each in [0, vocab).
std::vector<int32_t> parse_follow_ids(const std::string& text, int vocab) {
  static constexpr const char* kSeparators = " ,\t\n";
  std::vector<int32_t> ids;
  for (size_t i = text.find_first_not_of(kSeparators); i != std::string::npos;
       i = text.find_first_not_of(kSeparators, i)) {
    const std::string word = text.substr(i, text.find_first_of(kSeparators, i) - i);
    i += word.size();
    KVB_USAGE_CHECK(word.find_first_not_of("0123456789") == std::string::npos)
        << "--follow-ids: '" << word.substr(0, 40)
        << "' is not a token id (give ids separated by spaces or commas, e.g. \"11 2045 9\")";
    // Ten digits or more are past any vocabulary (and past stoll's range at 20).
    const long long v = word.size() > 9 ? vocab : std::stoll(word);
    KVB_USAGE_CHECK(v < vocab) << "--follow-ids: id " << word.substr(0, 40)
                               << " is outside the model's vocabulary [0, " << vocab << ")";
    ids.push_back(static_cast<int32_t>(v));
  }
  KVB_USAGE_CHECK(!ids.empty()) << "--follow-ids: no token ids given";
  return ids;
}

// errno names the cause where a stream's system call set it; streams do not promise that.
const char* stream_error() { return errno != 0 ? std::strerror(errno) : "the stream failed"; }

// {"policy", "kv_budget", "prompt_ids", "positions": [layer][kv head][retained positions], and
// with ThinK "key_channels"}: what scripts/compare_kvpress.py compares with kvpress's presses on
// the same prompt.
void write_keep_sets(const std::string& path, kernels::KvCache& cache,
                     const std::vector<int32_t>& ids, const std::vector<int32_t>& fed,
                     const std::string& policy, int budget) {
  nlohmann::json j;
  j["policy"] = policy;
  j["kv_budget"] = budget;
  j["prompt_ids"] = ids;
  j["fed_ids"] = fed;  // the generated tokens fed back through the model (the cache holds them)
  nlohmann::json layers = nlohmann::json::array();
  for (int l = 0; l < cache.shape().num_layers; ++l) {
    kernels::LayerKvView v = cache.layer(l);
    nlohmann::json heads = nlohmann::json::array();
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      heads.push_back(std::vector<int32_t>(v.position(h), v.position(h) + cache.length(l, h)));
    }
    layers.push_back(std::move(heads));
  }
  j["positions"] = std::move(layers);
  // ThinK (`think`): per [layer][kv head] the key channels (in the cache's row order: a llama
  // GGUF's rows rotate adjacent pairs) that are zero in every prompt slot the head keeps; only
  // where a head pruned channels and the rows are on the host.
  bool pruned = false;
  for (int l = 0; l < cache.shape().num_layers; ++l) {
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) pruned |= cache.pruned_key_channels(l, h);
  }
  if (pruned && cache.host_rows()) {
    nlohmann::json channels = nlohmann::json::array();
    const int d = cache.shape().head_dim;
    for (int l = 0; l < cache.shape().num_layers; ++l) {
      kernels::LayerKvView v = cache.layer(l);
      nlohmann::json heads = nlohmann::json::array();
      for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
        std::vector<int32_t> zero;
        const int slots = cache.channel_pruned_slots(l, h);
        for (int c = 0; c < d && slots > 0; ++c) {
          bool all = true;
          for (int s = 0; s < slots && all; ++s) all = v.key(h, s)[c] == 0.0f;
          if (all) zero.push_back(c);
        }
        heads.push_back(std::move(zero));
      }
      channels.push_back(std::move(heads));
    }
    j["key_channels"] = std::move(channels);
  }
  errno = 0;
  std::ofstream out(path);
  KVB_USAGE_CHECK(out.is_open()) << "cannot open --dump-keep-sets file '" << path
                                 << "' for writing: " << stream_error();
  out << j.dump() << "\n";
  // The text sits in the stream's buffer until close(): a full disk (/dev/full) fails there.
  out.close();
  KVB_CHECK(!out.fail()) << "error writing --dump-keep-sets file '" << path
                         << "': " << stream_error() << " (the file is incomplete)";
}
}  // namespace

int cmd_generate(const std::vector<std::string>& args) {
  std::string model_path, tokenizer_path, prompt, prompt_file, system, dump_path, follow_text;
  int max_new_tokens = 128, threads = 0, top_k = 0;
  float temperature = 0.0f, top_p = 1.0f;
  std::string seed_text = "0";
  bool chat = false, timings = false, show_ids = false;
  std::string policy_name = "full";
  DeviceOptions dev_opts;
  std::string kv_budget_text, compression_text;
  std::vector<std::string> policy_opts;
  po::options_description desc(
      "usage: kvbench generate --model PATH [--tokenizer PATH] --prompt TEXT [options]\n\n"
      "Generates text from a prompt and prints it to stdout (timings to stderr with --timings).\n"
      "Greedy unless --temperature > 0. Stops at the model's end token or --max-new-tokens.\n\n"
      "options");
  desc.add_options()("help,h", "print this help")(
      "model,m", po::value(&model_path),
      "model: GGUF (.gguf), llama2.c checkpoint (.bin) or Hugging Face checkpoint folder")(
      "tokenizer,t", po::value(&tokenizer_path),
      "tokenizer: llama2.c tokenizer.bin or HF tokenizer.json (default: the GGUF's or the "
      "folder's own; "
      "required for llama2.c checkpoints)")(
      "prompt,p", po::value(&prompt), "prompt text (may be empty: generation starts from BOS)")(
      "prompt-file", po::value(&prompt_file), "read the prompt from this file instead")(
      "chat", po::bool_switch(&chat),
      "wrap the prompt in the model's chat template (one user turn)")(
      "system", po::value(&system), "system message for --chat (default: the template's own)")(
      "max-new-tokens,n", po::value(&max_new_tokens)->default_value(128),
      "tokens to generate at most")("temperature", po::value(&temperature)->default_value(0.0f),
                                    "sampling temperature (0 = greedy)")(
      "top-k", po::value(&top_k)->default_value(0),
      "sample from the k most likely tokens (0 = all)")(
      "top-p", po::value(&top_p)->default_value(1.0f), "nucleus sampling mass (1 = off)")(
      "seed", po::value(&seed_text)->default_value("0"), "seed of the sampler's counter-based RNG")(
      "policy", po::value(&policy_name)->default_value("full"),
      "KV-cache eviction policy (kvbench ls policies lists them)")(
      "kv-budget", po::value(&kv_budget_text),
      "retained tokens per KV head per layer (256), or with a decimal point the fraction of the "
      "prompt kept (0.5); a budget is required unless --policy full or think")(
      "compression-ratio", po::value(&compression_text),
      "instead of --kv-budget: kvpress's compression_ratio, the fraction of the prompt removed "
      "(0.25 keeps max(1, int(n * 0.75)) tokens per KV head)")(
      "policy-opt", po::value(&policy_opts)->composing(),
      "policy option key=value (repeatable; kvbench ls policies lists each policy's options)")(
      "threads", po::value(&threads)->default_value(0),
      "OpenMP threads (0 = all cores; at most 1024)");
  add_device_options(desc, &dev_opts);
  desc.add_options()("timings", po::bool_switch(&timings),
                     "print prefill/decode times and tokens/s to stderr")(
      "show-ids", po::bool_switch(&show_ids), "print prompt and generated token ids to stderr")(
      "follow-ids", po::value(&follow_text),
      "teacher forcing: feed these token ids back (spaces or commas between them) instead of "
      "the model's picks, one per step, and print to stderr each step's own pick beside the "
      "followed id with both logits (another engine's continuation, compared step by step); "
      "the steps are the ids, so not with --max-new-tokens")(
      "dump-keep-sets", po::value(&dump_path),
      "write the cache's retained positions per (layer, KV head) after generation to this JSON "
      "file, with the prompt's ids and the generated ids fed back (--max-new-tokens 1: what "
      "the prompt's compression kept), and with think the key channels zeroed in the prompt's "
      "slots per (layer, KV head)");
  po::variables_map vm;
  if (!parse_command_line(args, desc, nullptr, "generate", &vm)) return 0;
  KVB_USAGE_CHECK(vm.count("model")) << "--model is required (see kvbench generate --help)";
  KVB_USAGE_CHECK(!(vm.count("prompt") && vm.count("prompt-file")))
      << "give --prompt or --prompt-file, not both";
  KVB_USAGE_CHECK(max_new_tokens >= 0) << "--max-new-tokens must be >= 0, got " << max_new_tokens;
  KVB_USAGE_CHECK(temperature >= 0 && temperature <= 100)
      << "--temperature must be in [0, 100] (0: greedy), got " << temperature;
  KVB_USAGE_CHECK(top_p > 0 && top_p <= 1) << "--top-p must be in (0, 1], got " << top_p;
  KVB_USAGE_CHECK(top_k >= 0) << "--top-k must be >= 0, got " << top_k;
  KVB_USAGE_CHECK(!vm.count("system") || chat)
      << "--system is the system message of --chat's template; add --chat or drop --system";
  KVB_USAGE_CHECK(!vm.count("follow-ids") || vm["max-new-tokens"].defaulted())
      << "--follow-ids sets the steps (one per id): drop --max-new-tokens";
  const uint64_t seed = parse_seed_option(seed_text);
  set_threads_option(threads);
  const DeviceChoice dc = resolve_device_options(dev_opts);  // before the (slow) model load
  const engine::Device dev = dc.device;
  const engine::DType dt = dc.dtype;
  if (vm.count("prompt-file")) prompt = read_text_file(prompt_file);
  KVB_USAGE_CHECK(!vm.count("dump-keep-sets") || !dump_path.empty())
      << "--dump-keep-sets needs a file name";

  // Fail on a bad policy name before the (slow) model load; budgets are checked against the model.
  policies::require_policy(policy_name);
  const BudgetEntry budget = parse_budget_flags(kv_budget_text, compression_text);
  workers::LoadedModel lm =
      workers::load_model_and_tokenizer(model_path, tokenizer_path, dt == engine::DType::kNative);
  const engine::ModelConfig& c = lm.model->config;
  std::vector<int32_t> follow;
  if (vm.count("follow-ids")) {
    follow = parse_follow_ids(follow_text, c.vocab_size);
    max_new_tokens = static_cast<int>(follow.size());
  }
  std::vector<int32_t> ids = workers::encode_prompt(lm, prompt, chat, system);
  if (ids.empty() && lm.tokenizer->bos_id() >= 0) ids.push_back(lm.tokenizer->bos_id());
  KVB_USAGE_CHECK(!ids.empty()) << "the prompt is empty and the vocabulary has no BOS token";
  KVB_USAGE_CHECK(static_cast<int>(ids.size()) < c.max_seq_len)
      << "the prompt has " << ids.size() << " tokens; the model's context is " << c.max_seq_len;
  if (static_cast<int>(ids.size()) + max_new_tokens > c.max_seq_len) {
    const int allowed = c.max_seq_len - static_cast<int>(ids.size());
    KVB_LOG_WARN << "prompt (" << ids.size() << ") + "
                 << (follow.empty() ? "--max-new-tokens (" : "--follow-ids (") << max_new_tokens
                 << ") exceeds the model's context " << c.max_seq_len << "; "
                 << (follow.empty() ? "generating" : "following") << " at most " << allowed;
    max_new_tokens = allowed;
  }
  if (show_ids) {
    std::ostringstream s;
    for (int32_t id : ids) s << id << " ";
    KVB_LOG_INFO << "prompt ids (" << ids.size() << "): " << s.str();
  }

  const int kv_budget = budget.none() ? 0 : budget.tokens_for(static_cast<int>(ids.size()));
  policies::PolicyConfig pc;
  pc.name = policy_name;
  pc.kv_budget = kv_budget;
  pc.budget_fraction = budget.fraction();
  pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len,
              c.has_sliding_layers()};
  pc.options = workers::parse_policy_options(policy_opts);
  pc.seed = seed;
  std::unique_ptr<policies::Policy> policy = policies::make_policy(pc);
  // KVzip reconstructs the whole prompt: generate's one text has no template head to skip.
  if (policy->reconstructs_context()) policy->set_replay_prompt(workers::replay_prompt(lm, 0, {}));
  engine::require_policy_layers(policy_name, model_path, c.global_layers(),
                                c.window.empty() ? 0 : c.window[0]);

  std::unique_ptr<engine::Engine> engp = engine::make_engine(*lm.model, dev, dt);
  engine::Engine& eng = *engp;
  if (dev == engine::Device::kCuda) {
    KVB_LOG_INFO << "engine: " << eng.device_description() << ", " << engine::dtype_name(dt);
  }
  kernels::KvCache cache =
      eng.new_cache(static_cast<int>(ids.size()) + max_new_tokens, policy.get());
  engine::GenerateOptions opt;
  opt.max_new_tokens = max_new_tokens;
  opt.sampling = {temperature, top_k, top_p, seed};
  opt.end_ids = lm.end_ids;
  opt.model = model_path;
  follow.resize(std::min<size_t>(follow.size(), static_cast<size_t>(max_new_tokens)));
  opt.follow = follow;
  // Stream text as it is produced: print the growing decode's new suffix.
  std::vector<int32_t> out_ids;
  std::string printed;
  auto on_token = [&](int32_t id) {
    out_ids.push_back(id);
    std::string text = lm.tokenizer->decode(out_ids, /*skip_special=*/false);
    // Hold back an incomplete UTF-8 sequence at the end.
    size_t end = text.size();
    for (size_t back = 1; back <= 3 && back <= text.size(); ++back) {
      unsigned char ch = static_cast<unsigned char>(text[text.size() - back]);
      if ((ch & 0xC0) == 0x80) continue;
      const size_t need = ch >= 0xF0 ? 4 : ch >= 0xE0 ? 3 : ch >= 0xC0 ? 2 : 1;
      if (need > back) end = text.size() - back;
      break;
    }
    if (end > printed.size() && text.compare(0, printed.size(), printed) == 0) {
      std::cout << text.substr(printed.size(), end - printed.size()) << std::flush;
      printed = text.substr(0, end);
    }
  };
  engine::GenerateResult r = engine::generate(eng, cache, ids, opt, on_token, policy.get());
  const std::string final_text = lm.tokenizer->decode(r.tokens, false);
  if (final_text.compare(0, printed.size(), printed) == 0) {
    std::cout << final_text.substr(printed.size());
  }
  std::cout << "\n" << std::flush;
  if (show_ids) {
    std::ostringstream s;
    for (int32_t id : r.tokens) s << id << " ";
    KVB_LOG_INFO << "generated ids (" << r.tokens.size() << "): " << s.str();
  }
  if (!r.followed.empty()) {
    int same = 0;
    for (size_t i = 0; i < r.followed.size(); ++i) {
      const engine::FollowedStep& f = r.followed[i];
      same += f.pick == r.tokens[i];
      KVB_LOG_INFO << std::setprecision(9) << "follow step " << i << ": followed " << r.tokens[i]
                   << " logit " << f.followed_logit << ", own pick " << f.pick << " logit "
                   << f.pick_logit;
    }
    KVB_LOG_INFO << "followed " << r.followed.size() << " ids: own pick equal at " << same;
  }
  if (!dump_path.empty()) {
    const std::vector<int32_t> fed(
        r.tokens.begin(), r.tokens.begin() + std::min<size_t>(r.decode_steps, r.tokens.size()));
    write_keep_sets(dump_path, cache, ids, fed, policy_name, kv_budget);
  }
  if (timings) {
    KVB_LOG_INFO << "prompt " << r.prompt_tokens << " tokens in " << r.prefill_ms << " ms ("
                 << (r.prompt_tokens * 1000.0 / r.prefill_ms) << " tok/s); decode "
                 << r.decode_steps << " steps in " << r.decode_ms << " ms ("
                 << (r.decode_steps > 0 ? r.decode_steps * 1000.0 / r.decode_ms : 0.0)
                 << " tok/s); " << (r.hit_end ? "stopped at end token" : "stopped at limit")
                 << "; KV cache " << eng.kv_logical_bytes(cache) << " bytes logical, "
                 << eng.kv_physical_bytes(cache) << " physical (" << cache.total_slots()
                 << " slots; policy " << policy_name << " state " << policy->state_bytes()
                 << " bytes)";
  }
  return 0;
}

}  // namespace kvb::harness
