// Shared by everything that runs a model (generate, eval, sweep workers): load the model and its tokenizer from the CLI's
// --model/--tokenizer, encode prompts (optionally through the model's chat template).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/policies/policy.h"
#include "workers/engine/model.h"
#include "workers/tokenizer/tokenizer.h"

namespace kvb::workers {

struct LoadedModel {
  std::unique_ptr<engine::Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  tokenizer::ChatFormat chat_format = tokenizer::ChatFormat::kNone;
  std::string chat_template;      // the GGUF's or tokenizer_config.json's Jinja ("" if none)
  bool add_bos = false;           // prepend BOS to prompts (llama2.c: yes; GGUF, HF: add_bos_token)
  std::vector<int32_t> end_ids;   // generation stops on these
};

// model_path: a GGUF file, a llama2.c checkpoint, or a Hugging Face checkpoint folder.
// tokenizer_path: "" to use the model's own vocabulary (GGUF metadata, the folder's
// tokenizer.json); a llama2.c tokenizer.bin or an HF tokenizer.json otherwise. Throws usage
// errors that say what to pass.
LoadedModel load_model_and_tokenizer(const std::string& model_path,
                                     const std::string& tokenizer_path);

// The chat template around one user message: prefix + user text + suffix (the suffix ends with
// the assistant header). system "" uses the template's default system message, if any.
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
// Whether a prompt starts with BOS (llama2.c models, GGUF add_bos_token; not when a chat
// template writes its BOS literally).
bool prompt_needs_bos(const LoadedModel& lm, bool chat);

// Encodes a user prompt; with chat, wraps it as one user turn (plus an optional system turn).
std::vector<int32_t> encode_prompt(const LoadedModel& lm, const std::string& prompt, bool chat,
                                   const std::string& system);

// "key=value" strings from --policy-opt into options; a malformed entry is a usage error.
policies::PolicyOptions parse_policy_options(const std::vector<std::string>& entries);

}  // namespace kvb::workers
