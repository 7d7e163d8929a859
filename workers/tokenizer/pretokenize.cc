// Regex pre-tokenization with PCRE2 (UTF + UCP, JIT when available): the pattern table of
// llama.cpp's llm_tokenizer_bpe (per LLAMA_VOCAB_PRE_TYPE, chosen by tokenizer.ggml.pre) and the
// split semantics of llama.cpp's unicode_regex_split / HF pre_tokenizers::Split("Isolated").
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <map>

#include "common/error.h"
#include "workers/tokenizer/tokenizer_impl.h"
#include "workers/tokenizer/unicode.h"

namespace kvb::tokenizer {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// llama.cpp LLAMA_VOCAB_PRE_TYPE_LLAMA3 (Llama-3 tiktoken regex).
const char* const kLlama3Pattern =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// llama.cpp LLAMA_VOCAB_PRE_TYPE_QWEN2: as Llama-3 but single digits.
const char* const kQwen2Pattern =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreType {
  std::vector<const char*> names;
  std::vector<std::string> patterns;
  bool ignore_merges = false;
};
const std::vector<PreType>& pre_types() {
  static const std::vector<PreType> types = {
      // llama.cpp's fallback for BPE vocabularies without a recognised pre type.
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Pattern, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
      {{"gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais"}, {kGpt2Pattern}},
      // Digits one by one, then GPT-2 (HF: Sequence[Digits(individual), ByteLevel]).
      {{"smollm", "codeshell", "exaone", "minerva-7b"}, {R"(\p{N})", kGpt2Pattern}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3"}, {kLlama3Pattern}, true},
      {{"qwen2", "deepseek-r1-qwen"}, {kQwen2Pattern}},
  };
  return types;
}

// Length of the valid UTF-8 sequence at pos, or 0 if the bytes there are not one.
size_t valid_utf8_at(std::string_view s, size_t pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) return 1;
  const size_t n = unicode::utf8_len(b0);
  if (n == 1 || b0 >= 0xF5 || pos + n > s.size()) return 0;
  size_t p = pos;
  unicode::next_codepoint(s, p);  // advances by one byte only on malformed input
  return p - pos == n ? n : 0;
}

}  // namespace

std::vector<std::string> supported_pre_tokenizers() {
  std::vector<std::string> names;
  for (const auto& t : pre_types()) names.insert(names.end(), t.names.begin(), t.names.end());
  return names;
}

PreTokenizerSpec pre_tokenizer_spec(const std::string& pre_name, const std::string& source) {
  for (const auto& t : pre_types()) {
    for (const char* n : t.names) {
      if (pre_name == n) return {t.patterns, t.ignore_merges};
    }
  }
  std::string supported;
  for (const auto& n : supported_pre_tokenizers()) supported += (supported.empty() ? "" : ", ") + n;
  KVB_FAIL() << source << ": unsupported tokenizer.ggml.pre '" << pre_name
             << "' (supported: " << supported << ")";
  return {};
}

RegexSplitter::RegexSplitter(const std::vector<std::string>& patterns) {
  for (const auto& pattern : patterns) {
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      for (void* c : codes_) pcre2_code_free(static_cast<pcre2_code*>(c));
      KVB_FAIL() << "pre-tokenizer regex does not compile at offset " << err_offset << ": "
                 << reinterpret_cast<const char*>(msg) << " (pattern: " << pattern << ")";
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if unavailable
    codes_.push_back(code);
  }
}

RegexSplitter::~RegexSplitter() {
  for (void* c : codes_) pcre2_code_free(static_cast<pcre2_code*>(c));
}

std::vector<std::string_view> RegexSplitter::split(std::string_view text) const {
  // Fragments that are invalid UTF-8 bytes are never handed to PCRE2 (it requires valid UTF).
  struct Frag {
    std::string_view text;
    bool raw_byte;
  };
  std::vector<Frag> frags;
  size_t start = 0, pos = 0;
  while (pos < text.size()) {
    const size_t n = valid_utf8_at(text, pos);
    if (n > 0) {
      pos += n;
      continue;
    }
    if (pos > start) frags.push_back({text.substr(start, pos - start), false});
    frags.push_back({text.substr(pos, 1), true});
    start = ++pos;
  }
  if (pos > start) frags.push_back({text.substr(start, pos - start), false});

  pcre2_match_context* mctx = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  if (jit_stack != nullptr) pcre2_jit_stack_assign(mctx, nullptr, jit_stack);
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  std::string error;
  for (void* c : codes_) {
    auto* code = static_cast<pcre2_code*>(c);
    std::vector<Frag> next;
    next.reserve(frags.size() * 2);
    for (const Frag& f : frags) {
      if (f.raw_byte) {
        next.push_back(f);
        continue;
      }
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(f.text.data());
      size_t offset = 0, gap_start = 0;
      while (offset < f.text.size()) {
        const int rc =
            pcre2_match(code, subject, f.text.size(), offset, PCRE2_NO_UTF_CHECK, md, mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          PCRE2_UCHAR msg[256];
          pcre2_get_error_message(rc, msg, sizeof(msg));
          error = reinterpret_cast<const char*>(msg);
          break;
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        size_t m0 = ov[0], m1 = ov[1];
        if (m1 == m0) {  // empty match: step over one character, emit nothing
          offset = m0 + unicode::utf8_len(static_cast<uint8_t>(f.text[m0]));
          continue;
        }
        if (m0 > gap_start) next.push_back({f.text.substr(gap_start, m0 - gap_start), false});
        next.push_back({f.text.substr(m0, m1 - m0), false});
        offset = gap_start = m1;
      }
      if (!error.empty()) break;
      if (gap_start < f.text.size()) next.push_back({f.text.substr(gap_start), false});
    }
    if (!error.empty()) break;
    frags = std::move(next);
  }
  pcre2_match_data_free(md);
  if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
  pcre2_match_context_free(mctx);
  KVB_CHECK(error.empty()) << "pre-tokenizer regex match failed: " << error;

  std::vector<std::string_view> out;
  out.reserve(frags.size());
  for (const Frag& f : frags) out.push_back(f.text);
  return out;
}

}  // namespace kvb::tokenizer
