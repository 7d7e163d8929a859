// A model's own chat template (Jinja), rendered as transformers'
// apply_chat_template(tokenize=False) renders it: the same environment (trim_blocks, lstrip_blocks,
// no trailing newline kept, raise_exception, strftime_now) and the same context (messages,
// add_generation_prompt, tools = none, documents = none, bos_token, eos_token). The Jinja engine is
// minja (google/minja, fetched at set-up time by scripts/fetch_models.sh; it stays out of this
// header). Checked byte for byte against transformers on seven families:
// tests/unit/test_jinja_chat_template.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "workers/tokenizer/render_sandbox.h"
#include "workers/tokenizer/tokenizer.h"

namespace kvb::tokenizer {

class JinjaChatTemplate {
 public:
  // Parses `text` once. `origin` names the template in every error ("model.gguf:
  // tokenizer.chat_template", "DIR/tokenizer_config.json: chat_template"). bos_token / eos_token
  // are the tokens' texts; "" leaves the name undefined in the template (as transformers does for
  // a tokenizer without one). Throws a usage error naming origin if the text is empty, larger
  // than kMaxTemplateBytes, nested deeper than kMaxNesting, or not valid Jinja.
  JinjaChatTemplate(std::string text, std::string bos_token, std::string eos_token,
                    std::string origin);
  ~JinjaChatTemplate();
  JinjaChatTemplate(JinjaChatTemplate&&) noexcept;
  JinjaChatTemplate& operator=(JinjaChatTemplate&&) noexcept;

  // The rendered prompt. A template that raises (raise_exception: "roles must alternate", "System
  // role not supported") or fails while rendering gives a usage error naming origin and carrying
  // the template's message. The render runs in an isolated child process under limits()
  // (render_sandbox.h: time, evaluation steps, memory, recursion depth, output size); a template
  // that exceeds one, or crashes the child, is a usage error naming origin and the limit.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  // A template that exceeded a limit or crashed the renderer fails every later render of this
  // object at once with the same error (it is hostile: no second fork, no second 10 s wait).
  const SandboxLimits& limits() const { return limits_; }
  void set_limits(const SandboxLimits& limits) { limits_ = limits; }

  const std::string& text() const { return text_; }
  const std::string& origin() const { return origin_; }
  const std::string& bos_token() const { return bos_token_; }

  static constexpr size_t kMaxTemplateBytes = 1 << 20;  // real templates are 0.5-20 KB
  static constexpr int kMaxNesting = 200;  // brackets and blocks; bounds the parser's recursion

 private:
  struct Parsed;
  std::string text_, bos_token_, eos_token_, origin_;
  SandboxLimits limits_;
  struct Verdict;                      // the first limit or crash, shared by moved-from copies
  std::shared_ptr<Verdict> verdict_;
  std::unique_ptr<const Parsed> parsed_;
};

// One-shot form for callers that hold a template's text and its special tokens (a GGUF's
// tokenizer.chat_template, an HF folder's tokenizer_config.json chat_template / bos_token /
// eos_token): JinjaChatTemplate(text, bos, eos, origin).render(messages, add_generation_prompt).
std::string render_chat_template(const std::string& text, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const std::string& bos_token,
                                 const std::string& eos_token, const std::string& origin);

}  // namespace kvb::tokenizer
