// The generation loop with timing of prefill and decode.
#include "workers/engine/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/error.h"

namespace kvb::engine {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void prefill_prompt(Engine& engine, kernels::KvCache& cache, const std::vector<int32_t>& prompt,
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
    if (policy && policy->reconstructs_context()) engine.reconstruct_context(*policy, cache, prompt);
  }
}

Generation::Generation(std::vector<float> logits, const GenerateOptions& options,
                       std::function<bool(int32_t)> on_token)
    : logits_(std::move(logits)), options_(options), on_token_(std::move(on_token)) {
  done_ = options_.max_new_tokens <= 0;
}

int32_t Generation::next() {
  if (done_) return -1;
  const int step = step_++;
  // One pass over the vocabulary beside a forward pass that reads vocabulary x dim weights.
  for (size_t i = 0; i < logits_.size(); ++i) {
    if (!std::isfinite(logits_[i])) {
      KVB_FAIL() << (options_.model.empty() ? "" : "model '" + options_.model + "': ")
                 << "the logits for generated token " << step + 1 << " (after "
                 << (step == 0 ? std::string("the prompt") : "token " + std::to_string(step))
                 << ") are not finite (token " << i << ": " << logits_[i]
                 << "); the model's weights hold NaN or Inf, or its activations overflow: check "
                    "the model file";
    }
  }
  int32_t id = sample_token(logits_, options_.sampling, static_cast<uint64_t>(step));
  if (!options_.follow.empty()) {
    KVB_CHECK(static_cast<size_t>(step) < options_.follow.size())
        << "generate: step " << step << " past the " << options_.follow.size() << " ids to follow";
    const int32_t fed = options_.follow[static_cast<size_t>(step)];
    KVB_USAGE_CHECK(fed >= 0 && static_cast<size_t>(fed) < logits_.size())
        << "id " << fed << " to follow (step " << step << ") is outside the vocabulary [0, "
        << logits_.size() << ")";
    result_.followed.push_back(
        {id, logits_[static_cast<size_t>(id)], logits_[static_cast<size_t>(fed)]});
    id = fed;
  } else if (std::find(options_.end_ids.begin(), options_.end_ids.end(), id) !=
             options_.end_ids.end()) {
    result_.hit_end = true;
    done_ = true;
    return -1;
  }
  result_.tokens.push_back(id);
  // on_token may stop here; the last token is not fed back.
  const int steps =
      options_.follow.empty()
          ? options_.max_new_tokens
          : std::min<int>(options_.max_new_tokens, static_cast<int>(options_.follow.size()));
  if ((on_token_ && !on_token_(id)) || step + 1 >= steps) {
    done_ = true;
    return -1;
  }
  return id;
}

void Generation::stepped(double ms) {
  result_.step_ms.push_back(ms);
  ++result_.decode_steps;
}

GenerateResult generate_from(Engine& engine, kernels::KvCache& cache, std::vector<float> logits,
                             const GenerateOptions& options,
                             const std::function<bool(int32_t)>& on_token,
                             policies::Policy* policy) {
  Generation g(std::move(logits), options, on_token);
  auto t1 = std::chrono::steady_clock::now();
  for (int32_t next = g.next(); next >= 0; next = g.next()) {
    const auto ts = std::chrono::steady_clock::now();
    engine.forward({&next, 1}, cache, LogitsMode::kLast, g.logits(), policy, PolicyHook::kDecode);
    g.stepped(ms_since(ts));
  }
  g.result().decode_ms = ms_since(t1);
  return std::move(g.result());
}

GenerateResult generate(Engine& engine, kernels::KvCache& cache,
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
