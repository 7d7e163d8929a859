// Tokenizer from GGUF metadata (ggml/docs/gguf.md "Tokenizer" keys; llama.cpp llama_vocab::load):
// tokenizer.ggml.model "gpt2" -> byte-level BPE with the pre-split regexes of tokenizer.ggml.pre;
// "llama" -> SentencePiece-style scores run with llama.cpp's SPM algorithm.
#include <cmath>

#include "common/error.h"
#include "workers/formats/gguf.h"
#include "workers/tokenizer/tokenizer_impl.h"

namespace kvb::tokenizer {
namespace {

using formats::GgufFile;

// A special token's id: `def` when the key is absent (-1: none). A key that is present must name a
// token: GGUF writes these as u32, so -1 (llama.cpp's LLAMA_TOKEN_NULL) is no id a file can hold,
// and reading it as "none" would silently drop an end-of-generation token or the BOS.
int32_t id_or(const GgufFile& g, const std::string& key, int32_t def, size_t n_tokens) {
  if (!g.has(key)) return def;
  const int64_t id = g.get_int(key);
  KVB_CHECK(id >= 0 && id < int64_t(n_tokens))
      << g.path() << ": metadata key '" << key << "' = " << id << " is not a token id (0.."
      << int64_t(n_tokens) - 1 << "; leave the key out when the vocabulary has no such token)";
  return static_cast<int32_t>(id);
}

std::vector<TokenKind> token_kinds(const GgufFile& g, size_t n) {
  const std::string key = "tokenizer.ggml.token_type";
  if (!g.has(key)) return std::vector<TokenKind>(n, TokenKind::kNormal);
  const auto& types = g.get_int_array(key);
  KVB_CHECK(types.size() == n) << g.path() << ": metadata key '" << key << "' has " << types.size()
                               << " entries for " << n << " tokens";
  std::vector<TokenKind> kinds(n);
  for (size_t i = 0; i < n; ++i) {
    KVB_CHECK(types[i] >= 0 && types[i] <= 6) << g.path() << ": metadata key '" << key << "'[" << i
                                              << "] = " << types[i] << " is not a token type (0-6)";
    kinds[i] = static_cast<TokenKind>(types[i]);
  }
  return kinds;
}

// eos/eot/eom from the metadata, then control tokens whose text ends a turn (llama.cpp EOG set).
std::vector<int32_t> end_ids(const GgufFile& g, const std::vector<std::string>& tokens,
                             const std::vector<TokenKind>& kinds, int32_t eos) {
  std::vector<int32_t> ids;
  add_unique(ids, eos);
  add_unique(ids, id_or(g, "tokenizer.ggml.eot_token_id", -1, tokens.size()));
  add_unique(ids, id_or(g, "tokenizer.ggml.eom_token_id", -1, tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (kinds[i] == TokenKind::kControl && is_end_of_generation_text(tokens[i])) {
      add_unique(ids, static_cast<int32_t>(i));
    }
  }
  return ids;
}

std::unique_ptr<Tokenizer> load_bpe(const GgufFile& g) {
  BpeVocab v;
  v.source = g.path();
  v.tokens = g.get_string_array("tokenizer.ggml.tokens");
  const size_t n = v.tokens.size();
  KVB_CHECK(n > 0) << g.path() << ": metadata key 'tokenizer.ggml.tokens' is empty";
  v.kinds = token_kinds(g, n);
  const auto& merges = g.get_string_array("tokenizer.ggml.merges");
  v.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const size_t sp = merges[i].find(' ', 1);
    KVB_CHECK(sp != std::string::npos) << g.path() << ": metadata key 'tokenizer.ggml.merges'[" << i
                                       << "] = '" << merges[i] << "' is not of the form \"a b\"";
    v.merges.emplace_back(merges[i].substr(0, sp), merges[i].substr(sp + 1));
  }
  const std::string pre = g.get_string_or("tokenizer.ggml.pre", "default");
  PreTokenizerSpec spec = pre_tokenizer_spec(pre, g.path());
  v.pre_patterns = std::move(spec.patterns);
  v.ignore_merges = spec.ignore_merges;
  v.bos_id = id_or(g, "tokenizer.ggml.bos_token_id", -1, n);
  v.eos_id = id_or(g, "tokenizer.ggml.eos_token_id", -1, n);
  v.unk_id = id_or(g, "tokenizer.ggml.unknown_token_id", -1, n);
  v.add_bos = g.get_bool_or("tokenizer.ggml.add_bos_token", false) && v.bos_id >= 0;
  v.add_prefix_space = g.get_bool_or("tokenizer.ggml.add_space_prefix", false);
  v.end_ids = end_ids(g, v.tokens, v.kinds, v.eos_id);
  return make_bpe_tokenizer(std::move(v));
}

std::unique_ptr<Tokenizer> load_spm(const GgufFile& g) {
  SpmVocab v;
  v.source = g.path();
  v.tokens = g.get_string_array("tokenizer.ggml.tokens");
  const size_t n = v.tokens.size();
  KVB_CHECK(n > 0) << g.path() << ": metadata key 'tokenizer.ggml.tokens' is empty";
  v.kinds = token_kinds(g, n);
  const auto& scores = g.get_float_array("tokenizer.ggml.scores");
  KVB_CHECK(scores.size() == n) << g.path() << ": metadata key 'tokenizer.ggml.scores' has "
                                << scores.size() << " entries for " << n << " tokens";
  for (size_t i = 0; i < n; ++i) {
    // SPM merges compare scores: a NaN breaks the ordering, an infinity makes one merge win or
    // lose against everything (convert_hf_to_gguf writes finite scores, -1000 for added tokens).
    KVB_CHECK(std::isfinite(scores[i])) << g.path() << ": metadata key 'tokenizer.ggml.scores'["
                                        << i << "] = " << scores[i] << " is not a finite number";
  }
  v.scores.assign(scores.begin(), scores.end());
  // llama.cpp's defaults for SPM vocabularies: <unk> 0, <s> 1, </s> 2, add BOS, prefix a space.
  v.unk_id = id_or(g, "tokenizer.ggml.unknown_token_id", 0, n);
  v.bos_id = id_or(g, "tokenizer.ggml.bos_token_id", 1, n);
  v.eos_id = id_or(g, "tokenizer.ggml.eos_token_id", 2, n);
  v.add_bos = g.get_bool_or("tokenizer.ggml.add_bos_token", true) && v.bos_id >= 0;
  v.add_space_prefix = g.get_bool_or("tokenizer.ggml.add_space_prefix", true);
  v.end_ids = end_ids(g, v.tokens, v.kinds, v.eos_id);
  return make_spm_tokenizer(std::move(v));
}

}  // namespace

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const formats::GgufFile& gguf) {
  const std::string model = gguf.get_string("tokenizer.ggml.model");
  if (model == "gpt2") return load_bpe(gguf);
  if (model == "llama") return load_spm(gguf);
  KVB_FAIL() << gguf.path() << ": tokenizer.ggml.model '" << model
             << "' is not supported (supported: gpt2, llama)";
  return nullptr;
}

}  // namespace kvb::tokenizer
