// Autoregressive generation over the engine: prefill the prompt once, then decode one token at a
// time until an end token or the token limit. The stop rule follows POLICIES.md "Stopping": the
// end token is not part of the output and is not fed back.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "workers/engine/engine.h"
#include "workers/engine/sampler.h"

namespace kvb::engine {

struct GenerateOptions {
  int max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> end_ids;  // generation stops when one of these is produced
  std::string model;             // named in errors ("" : not named)
  // Teacher forcing: when not empty, step i feeds follow[i] back instead of its own pick, for
  // exactly min(max_new_tokens, follow.size()) steps, and an end token picked does not stop it.
  // The result's tokens are the followed ids; each step's own pick is in result.followed.
  std::vector<int32_t> follow;
};

// One teacher-forced step: the sampler's pick from the step's logits, its logit, and the logit
// of the token that was fed back instead.
struct FollowedStep {
  int32_t pick = -1;
  float pick_logit = 0;
  float followed_logit = 0;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids, without the end token
  bool hit_end = false;         // stopped on an end token (else on the limit)
  int prompt_tokens = 0;
  double prefill_ms = 0;        // prompt forward pass, incl. the first token's logits
  double decode_ms = 0;         // all decode steps
  int decode_steps = 0;
  std::vector<double> step_ms;  // each decode step (forward of one token)
  std::vector<FollowedStep> followed;  // with options.follow: one per step
};

// The prompt phase alone: begin_sequence, then prefill per the policy's prefill_mode (oneshot:
// one pass with on_prefill_layer; streaming: token by token with on_decode_layer). logits receives
// the last token's logits.
void prefill_prompt(Engine& engine, kernels::KvCache& cache, const std::vector<int32_t>& prompt,
                    policies::Policy* policy, std::vector<float>* logits);

// One sequence's decode loop as steps, so that several sequences can decode in one batch
// (Engine::decode_batch) and each still follows generate_from's rule exactly: next() samples
// from the current logits (the sampler's counter is the sequence's own step), stops on an end
// token, on_token returning false or the limit (the last token is not fed back), and otherwise
// returns the token to feed back; the caller runs it into logits() and calls stepped(). Logits
// that are not all finite are a runtime error naming options.model and the step: sampling would
// turn them into tokens (greedy's argmax over NaN is token 0) that look like a result.
class Generation {
 public:
  Generation(std::vector<float> logits, const GenerateOptions& options,
             std::function<bool(int32_t)> on_token);
  // The token to feed back, or -1 when the sequence is done (result() is then final).
  int32_t next();
  bool done() const { return done_; }
  // Where the fed-back token's logits go.
  std::vector<float>* logits() { return &logits_; }
  // After the feed-back forward: its wall time in ms (in a batch: the batch step's).
  void stepped(double ms);
  GenerateResult& result() { return result_; }

 private:
  std::vector<float> logits_;
  const GenerateOptions& options_;
  std::function<bool(int32_t)> on_token_;
  GenerateResult result_;
  int step_ = 0;
  bool done_ = false;
};

// The decode loop alone, from the logits after the prompt. on_token is called with each generated
// id (not the end token) before it is fed back; returning false stops generation there.
GenerateResult generate_from(Engine& engine, kernels::KvCache& cache, std::vector<float> logits,
                             const GenerateOptions& options,
                             const std::function<bool(int32_t)>& on_token,
                             policies::Policy* policy);

// Runs `prompt` (non-empty) through the engine on `cache` and generates. on_token (optional) is
// called with each generated id as it is produced.
// With a policy, the prompt is prefilled per its prefill_mode (oneshot: one pass then
// on_prefill_layer; streaming: token by token through on_decode_layer) and every decode step runs
// on_decode_layer.
GenerateResult generate(Engine& engine, kernels::KvCache& cache,
                        const std::vector<int32_t>& prompt,
                        const GenerateOptions& options,
                        const std::function<void(int32_t)>& on_token = nullptr,
                        policies::Policy* policy = nullptr);

}  // namespace kvb::engine
