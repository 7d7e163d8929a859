// The generation loop with timing of prefill and decode.
#include "workers/engine/generate.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"

namespace kvb::engine {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void prefill_prompt(EngineBase& engine, kernels::KvCache& cache, const std::vector<int32_t>& prompt,
                    policies::Policy* policy, std::vector<float>* logits) {
  KVB_CHECK(!prompt.empty()) << "prefill_prompt: empty prompt";
  if (policy) policy->begin_sequence(static_cast<int>(prompt.size()));
  if (policy && policy->prefill_mode() == policies::PrefillMode::kStreaming) {
    for (size_t t = 0; t < prompt.size(); ++t) {
      engine.forward({&prompt[t], 1}, cache,
                     t + 1 == prompt.size() ? LogitsMode::kLast : LogitsMode::kNone, logits,
                     policy, PolicyHook::kDecode);
    }
  } else {
    engine.forward(prompt, cache, LogitsMode::kLast, logits, policy, PolicyHook::kPrefill);
  }
}

GenerateResult generate_from(EngineBase& engine, kernels::KvCache& cache, std::vector<float> logits,
                             const GenerateOptions& options,
                             const std::function<bool(int32_t)>& on_token,
                             policies::Policy* policy) {
  GenerateResult result;
  auto is_end = [&](int32_t id) {
    return std::find(options.end_ids.begin(), options.end_ids.end(), id) != options.end_ids.end();
  };
  auto t1 = std::chrono::steady_clock::now();
  for (int step = 0; step < options.max_new_tokens; ++step) {
    const int32_t next = sample_token(logits, options.sampling, static_cast<uint64_t>(step));
    if (is_end(next)) {
      result.hit_end = true;
      break;
    }
    result.tokens.push_back(next);
    if (on_token && !on_token(next)) break;
    if (step + 1 == options.max_new_tokens) break;  // the last token is not fed back
    const auto ts = std::chrono::steady_clock::now();
    engine.forward({&next, 1}, cache, LogitsMode::kLast, &logits, policy, PolicyHook::kDecode);
    result.step_ms.push_back(ms_since(ts));
    ++result.decode_steps;
  }
  result.decode_ms = ms_since(t1);
  return result;
}

GenerateResult generate(EngineBase& engine, kernels::KvCache& cache,
                        const std::vector<int32_t>& prompt,
                        const GenerateOptions& options,
                        const std::function<void(int32_t)>& on_token,
                        policies::Policy* policy) {
  KVB_USAGE_CHECK(!prompt.empty()) << "the prompt has no tokens (give a prompt or a BOS token)";
  std::vector<float> logits;
  auto t0 = std::chrono::steady_clock::now();
  prefill_prompt(engine, cache, prompt, policy, &logits);
  const double prefill_ms = ms_since(t0);
  GenerateResult result = generate_from(
      engine, cache, std::move(logits), options,
      [&](int32_t id) {
        if (on_token) on_token(id);
        return true;
      },
      policy);
  result.prompt_tokens = static_cast<int>(prompt.size());
  result.prefill_ms = prefill_ms;
  return result;
}

}  // namespace kvb::engine
