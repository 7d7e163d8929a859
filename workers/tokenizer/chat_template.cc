// Chat prompt rendering for three template families, reproducing their reference Jinja templates:
// ChatML (SmolLM2-Instruct's tokenizer.chat_template, with its default system message), Llama-3
// (meta-llama/Meta-Llama-3-8B-Instruct tokenizer_config.json) and Gemma (google/gemma-3-it: a
// system message is folded into the first user turn). Detection is by signature token.
// Test oracles only (tests/unit/test_chat_template.cc, test_jinja_chat_template.cc): prompts are
// rendered from the model's own template by JinjaChatTemplate.
#include <algorithm>

#include "common/error.h"
#include "workers/tokenizer/tokenizer.h"

namespace kvb::tokenizer {
namespace {

// Jinja's `trim` (Python str.strip() on ASCII whitespace).
std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

void check_role(ChatFormat f, const std::string& role, std::initializer_list<const char*> ok) {
  for (const char* r : ok) {
    if (role == r) return;
  }
  std::string list;
  for (const char* r : ok) list += (list.empty() ? "" : ", ") + std::string(r);
  KVB_USAGE_FAIL() << chat_format_name(f) << " chat template: unknown role '" << role
                   << "' (expected one of: " << list << ")";
}

std::string render_chatml(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          const std::string& default_system) {
  std::string out;
  // SmolLM2: inside the loop, `loop.first and messages[0]['role'] != 'system'`.
  if (!default_system.empty() && !messages.empty() && messages[0].role != "system") {
    out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
  }
  for (const auto& m : messages) {
    check_role(ChatFormat::kChatML, m.role, {"system", "user", "assistant", "tool"});
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string render_llama3(std::vector<ChatMessage> messages, bool add_generation_prompt,
                          const std::string& default_system) {
  if (!default_system.empty() && (messages.empty() || messages[0].role != "system")) {
    messages.insert(messages.begin(), {"system", default_system});
  }
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    check_role(ChatFormat::kLlama3, m.role, {"system", "user", "assistant", "ipython", "tool"});
    if (i == 0) out += "<|begin_of_text|>";  // bos_token, prepended to the first message
    out +=
        "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string render_gemma(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                         const std::string& default_system) {
  std::string out = "<bos>";
  std::string first_user_prefix;
  size_t begin = 0;
  if (!messages.empty() && messages[0].role == "system") {
    first_user_prefix = messages[0].content + "\n\n";
    begin = 1;
  } else if (!default_system.empty()) {
    first_user_prefix = default_system + "\n\n";
  }
  for (size_t i = begin; i < messages.size(); ++i) {
    const auto& m = messages[i];
    check_role(ChatFormat::kGemma, m.role, {"system", "user", "assistant", "model"});
    const bool even = (i - begin) % 2 == 0;
    KVB_USAGE_CHECK((m.role == "user") == even)
        << "Gemma chat template: conversation roles must alternate "
           "user/assistant/user/assistant/... (message "
        << i << " has role '" << m.role << "')";
    const std::string role = m.role == "assistant" ? "model" : m.role;
    out += "<start_of_turn>" + role + "\n" + (i == begin ? first_user_prefix : "") +
           trim(m.content) + "<end_of_turn>\n";
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

// Undoes Jinja string-literal escapes (\n, \t, \', \", \\).
std::string unescape_literal(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out.push_back(s[i]);
      continue;
    }
    const char c = s[++i];
    out.push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c);
  }
  return out;
}

}  // namespace

ChatFormat detect_chat_format(const std::string& t) {
  if (t.find("<|im_start|>") != std::string::npos) return ChatFormat::kChatML;
  if (t.find("<|start_header_id|>") != std::string::npos) return ChatFormat::kLlama3;
  if (t.find("<start_of_turn>") != std::string::npos) return ChatFormat::kGemma;
  return ChatFormat::kNone;
}

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::kChatML:
      return "chatml";
    case ChatFormat::kLlama3:
      return "llama3";
    case ChatFormat::kGemma:
      return "gemma";
    default:
      return "none";
  }
}

std::string chat_default_system(const std::string& t) {
  // A string literal that opens a system turn and holds plain text up to <|im_end|>, e.g.
  // '<|im_start|>system\nYou are ...<|im_end|>\n'; a literal that is concatenated with
  // messages[0]['content'] contains its closing quote before <|im_end|> and is skipped.
  const std::string open = "<|im_start|>system";
  for (size_t pos = t.find(open); pos != std::string::npos; pos = t.find(open, pos + 1)) {
    if (pos == 0 || (t[pos - 1] != '\'' && t[pos - 1] != '"')) continue;
    const char quote = t[pos - 1];
    size_t p = pos + open.size();
    if (t.compare(p, 1, "\n") == 0) {
      p += 1;
    } else if (t.compare(p, 2, "\\n") == 0) {
      p += 2;
    } else {
      continue;
    }
    const size_t end = t.find("<|im_end|>", p);
    if (end == std::string::npos) continue;
    const std::string raw = t.substr(p, end - p);
    bool closed = false;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\\') {
        ++i;
      } else if (raw[i] == quote) {
        closed = true;
        break;
      }
    }
    if (!closed && !raw.empty()) return unescape_literal(raw);
  }
  return "";
}

std::string apply_chat_template(ChatFormat f, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, const std::string& default_system) {
  switch (f) {
    case ChatFormat::kChatML:
      return render_chatml(messages, add_generation_prompt, default_system);
    case ChatFormat::kLlama3:
      return render_llama3(messages, add_generation_prompt, default_system);
    case ChatFormat::kGemma:
      return render_gemma(messages, add_generation_prompt, default_system);
    default:
      KVB_USAGE_FAIL() << "apply_chat_template: no chat format (the model's "
                          "tokenizer.chat_template matched none of chatml, llama3, gemma)";
  }
  return "";
}

}  // namespace kvb::tokenizer
