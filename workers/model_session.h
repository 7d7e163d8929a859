// Shared by everything that runs a model (generate, eval, sweep workers): load the model and its tokenizer from the CLI's
// --model/--tokenizer, encode prompts (optionally through the model's chat template).
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kernels/policies/policy.h"
#include "workers/engine/model.h"
#include "workers/tokenizer/jinja_chat_template.h"
#include "workers/tokenizer/tokenizer.h"

namespace kvb::workers {

struct LoadedModel {
  std::unique_ptr<engine::Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::string path;               // the model file or folder (named in errors)
  std::string chat_template;      // the GGUF's or tokenizer_config.json's Jinja ("" if none)
  // The model's own chat template, parsed (null if the model has none, or if it is not valid
  // Jinja: chat_error then says why). Shared so that copies of the session share one parse.
  std::shared_ptr<const tokenizer::JinjaChatTemplate> chat;
  std::string chat_error;         // why chat prompts cannot be rendered ("" if they can)
  // chat_frame's renders, by system message: a render runs in a forked child (render_sandbox.h),
  // which costs ~30 ms of the parent's time per GiB it holds, so a worker renders a model's frame
  // once per load rather than once per prompt. Shared like `chat`.
  struct FrameCache;
  std::shared_ptr<FrameCache> chat_frames;
  bool chat_writes_bos = false;   // the rendered prompt starts with the BOS token's text
  bool add_bos = false;           // prepend BOS to prompts (llama2.c: yes; GGUF, HF: add_bos_token)
  std::vector<int32_t> end_ids;   // generation stops on these
};

// model_path: a GGUF file, a llama2.c checkpoint, or a Hugging Face checkpoint folder.
// tokenizer_path: "" to use the model's own vocabulary (GGUF metadata, the folder's
// tokenizer.json); a llama2.c tokenizer.bin or an HF tokenizer.json otherwise. Throws usage
// errors that say what to pass. native_blocks: load for --dtype native (engine::load_model).
LoadedModel load_model_and_tokenizer(const std::string& model_path,
                                     const std::string& tokenizer_path,
                                     bool native_blocks = false);

// The model's chat template around one user message: prefix + user text + suffix (the suffix
// ends with the assistant header, add_generation_prompt). system "" sends no system message, so
// the template's own default (SmolLM2's, Qwen2.5's) applies. The user text is not rendered: a
// sentinel is, and the split around it keeps the user's text out of special-token parsing (so a
// template filter such as `| trim` does not apply to it). Usage error naming the model if it has
// no template, or if its template refuses the conversation or does not render the sentinel once.
struct ChatFrame {
  std::string prefix;
  std::string suffix;
};
ChatFrame chat_frame(const LoadedModel& lm, const std::string& system);
// The tokenizer and prompt conventions of a model without its weights (the sweep's coordinator
// builds samples and unit keys with it). lm.model is null.
LoadedModel load_tokenizer_only(const std::string& model_path, const std::string& tokenizer_path);

// Encodes text; `special` parses control-token text ("<|im_start|>") as control tokens. Data and
// user text are encoded with special = false, so a dataset cannot inject control tokens.
std::vector<int32_t> encode_text(const LoadedModel& lm, const std::string& text, bool special,
                                 bool bos);
// KVzip's reconstruction prompt (kvpress KVzipPress.prepare) in this model's tokens: the first
// `prefix` prompt tokens (the chat template's head) are not reconstructed; `tail` is the chat
// template's tail after a user turn (empty: "\n", kvpress's choice without a template).
policies::ReplayPrompt replay_prompt(const LoadedModel& lm, int prefix,
                                     const std::vector<int32_t>& tail);
// Whether a prompt starts with BOS (llama2.c models, GGUF add_bos_token; not when the chat
// template writes the BOS token's text itself, as Llama-3's and Gemma's do).
bool prompt_needs_bos(const LoadedModel& lm, bool chat);

// Encodes a user prompt; with chat, wraps it as one user turn (plus an optional system turn).
std::vector<int32_t> encode_prompt(const LoadedModel& lm, const std::string& prompt, bool chat,
                                   const std::string& system);

// SHA-256 (lowercase hex) of token ids, each as an int32 in little-endian byte order: the
// measurement prompt_sha256 (results/schema.sql), so that two runs can be shown to have fed
// identical prompts. parts are hashed in order, as one sequence.
std::string token_ids_sha256(std::initializer_list<const std::vector<int32_t>*> parts);

// "key=value" strings from --policy-opt into options; a malformed entry is a usage error.
policies::PolicyOptions parse_policy_options(const std::vector<std::string>& entries);

}  // namespace kvb::workers
