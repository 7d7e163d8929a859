// Internal pieces shared by the tokenizer implementations (not part of the engine-facing API):
// token kinds (GGUF tokenizer.ggml.token_type values), the special-token splitter, the PCRE2
// pre-tokenizer, and constructors of the byte-level BPE and SentencePiece-style tokenizers from
// plain vectors (used by the GGUF and tokenizer.json loaders, and by tests).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "workers/tokenizer/tokenizer.h"

namespace kvb::tokenizer {

// The largest tokenizer file read (tokenizer.json, tokenizer.bin): Gemma 3's tokenizer.json, the
// largest in common use, is 33 MiB; a file above this is refused before it is read.
constexpr uint64_t kMaxTokenizerBytes = uint64_t{256} << 20;

// llama.cpp's llama_token_type (the values stored in tokenizer.ggml.token_type).
enum class TokenKind : uint8_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// Splits text at literal occurrences of added tokens, leftmost-longest (HF AddedVocabulary).
// Control tokens are matched only when parse_special is set; user-defined ones always (as
// llama.cpp's tokenizer_st_partition does).
class SpecialSplitter {
 public:
  void add(const std::string& text, int32_t id, bool control);
  struct Piece {
    int32_t id;             // >= 0: an added token; -1: raw text in `text`
    std::string_view text;  // view into the encoded string
  };
  std::vector<Piece> split(std::string_view text, bool parse_special) const;

 private:
  struct Entry {
    std::string text;
    int32_t id;
    bool control;
  };
  std::vector<Entry> by_byte_[256];  // candidates by first byte, longest first
  std::unordered_set<std::string> texts_;
};

// Pre-tokenizer: a list of PCRE2 patterns (UTF + UCP) applied in turn; each splits every current
// fragment into its matches and the unmatched gaps between them (llama.cpp unicode_regex_split,
// HF Split with behavior "Isolated"). Invalid UTF-8 bytes become one-byte fragments.
class RegexSplitter {
 public:
  explicit RegexSplitter(const std::vector<std::string>& patterns);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  std::vector<void*> codes_;  // pcre2_code_8*
};

// Pre-tokenization of a GGUF tokenizer.ggml.pre name (llama.cpp's LLAMA_VOCAB_PRE_TYPE table):
// its regexes, and whether llama.cpp sets ignore_merges for it (the Llama-3 family).
struct PreTokenizerSpec {
  std::vector<std::string> patterns;
  bool ignore_merges = false;
};
// Throws, naming source (the file) and listing the supported names, for an unknown name.
PreTokenizerSpec pre_tokenizer_spec(const std::string& pre_name, const std::string& source);
std::vector<std::string> supported_pre_tokenizers();
extern const char* const kGpt2Pattern;  // GPT-2's pre-tokenizer regex (HF ByteLevel use_regex)

// Byte-level BPE vocabulary (GGUF "gpt2", HF tokenizer.json BPE + ByteLevel).
struct BpeVocab {
  std::string source;               // file, for error messages
  std::vector<std::string> tokens;  // id -> text (byte-level alphabet unless added)
  std::vector<TokenKind> kinds;     // id -> kind; kControl / kUserDefined are added tokens
  std::vector<std::pair<std::string, std::string>> merges;  // rank order
  std::vector<std::string> pre_patterns;
  bool add_prefix_space = false;  // prepend " " to text fragments not starting with one
  bool ignore_merges = false;     // a pre-token that is itself in the vocab is emitted whole
  bool nfc = false;               // NFC-normalize raw text (HF normalizer "NFC")
  int32_t bos_id = -1, eos_id = -1;
  int32_t unk_id = -1;   // stands for bytes whose symbol is not in the vocabulary
  bool add_bos = false;  // the vocabulary's own BOS convention (default_add_bos())
  std::vector<int32_t> end_ids;
};
std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeVocab vocab);

// BPE merge table: (left id, right id) -> (rank, merged id). make_merge_table throws, naming
// source, when a merge uses or produces a token that is not in the vocabulary; of repeated pairs
// the first rank wins. apply_merges merges a word's symbol ids lowest rank first, leftmost on ties
// (HF tokenizers' Word::merge_all, llama.cpp's llm_tokenizer_bpe_session); ids < 0 never merge
// and are dropped from the result.
using MergeTable = std::unordered_map<uint64_t, std::pair<int32_t, int32_t>>;
inline uint64_t merge_pair_key(int32_t a, int32_t b) {
  return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
}
MergeTable make_merge_table(const std::vector<std::pair<std::string, std::string>>& merges,
                            const std::unordered_map<std::string, int32_t>& token_to_id,
                            const std::string& source);
std::vector<int32_t> apply_merges(std::vector<int32_t> word, const MergeTable& merges);

// SentencePiece-style BPE of a Hugging Face tokenizer.json (Llama-2, Mistral, Gemma): HF
// tokenizers' BPE model over Unicode characters with byte_fallback ("<0xXX>" tokens for
// characters not in the vocabulary) and unk, after the file's normalizer and optional Metaspace
// pre-tokenizer, decoded by its decoder chain. Each step has HF tokenizers' semantics.
struct HfTextStep {  // normalizer step, applied in order to each text piece between added tokens
  enum class Kind { kReplace, kPrepend, kNfc } kind;
  std::string from, to;  // kReplace: literal from -> to; kPrepend: `to` before non-empty text
};
struct HfDecodeStep {  // decoder step, applied in order to the list of token strings
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind = Kind::kFuse;
  std::string from, to;     // kReplace: literal; kMetaspace: from = replacement
  int start = 0, stop = 0;  // kStrip: at most this many `from` characters off each token's ends
  bool drop_first = false;  // kMetaspace: the first token loses its replacement characters
};
enum class MetaspacePrepend { kNever, kFirst, kAlways };
struct HfSpmVocab {
  BpeVocab bpe;  // tokens, kinds, merges, bos/eos/unk, end_ids, add_bos (no pre_patterns)
  bool byte_fallback = false;
  bool fuse_unk = false;  // consecutive unknown characters become one <unk>
  std::vector<HfTextStep> normalizer;
  bool metaspace = false;   // pre_tokenizer is Metaspace
  std::string replacement;  // its replacement character (UTF-8)
  MetaspacePrepend prepend = MetaspacePrepend::kNever;
  bool split = false;       // split words before each replacement character
  std::string split_after;  // pre_tokenizer Split, String pattern, MergedWithPrevious: a word
                            // ends after each occurrence (Gemma's Split " ")
  std::vector<HfDecodeStep> decoder;
};
std::unique_ptr<Tokenizer> make_hf_spm_tokenizer(HfSpmVocab vocab);
// The SentencePiece-style part of load_hf_tokenizer_json: validates root's model flags,
// normalizer, pre_tokenizer (null, Metaspace, or Split on a string MergedWithPrevious), decoder and
// added_tokens' "normalized" flags, throwing errors that name `path` and the key; `bpe` holds the
// already-read vocabulary.
std::unique_ptr<Tokenizer> make_hf_spm_tokenizer(const std::string& path,
                                                 const nlohmann::json& root, BpeVocab bpe);
// Whether a tokenizer.json takes the SentencePiece-style reading: its pre_tokenizer has no
// ByteLevel step (null, Metaspace, Split; anything else is refused there).
bool is_sentencepiece_tokenizer_json(const nlohmann::json& root);

// SentencePiece-style vocabulary run with llama.cpp's SPM algorithm.
struct SpmVocab {
  std::string source;
  std::vector<std::string> tokens;  // with U+2581 for spaces, "<0xXX>" byte tokens
  std::vector<float> scores;
  std::vector<TokenKind> kinds;
  bool add_space_prefix = true;
  int32_t bos_id = -1, eos_id = -1, unk_id = -1;
  bool add_bos = true;
  std::vector<int32_t> end_ids;
};
std::unique_ptr<Tokenizer> make_spm_tokenizer(SpmVocab vocab);

// Texts of control tokens that end generation in chat models (llama.cpp's EOG list).
bool is_end_of_generation_text(const std::string& text);
// The byte a "<0xXX>" token stands for, or -1 (spm.cc). allow_plus: also "<0x+X>", as HF's
// byte-fallback decoder reads it (u8::from_str_radix accepts a leading '+'); llama.cpp does not.
int byte_token_value(const std::string& t, bool allow_plus);
// Appends id to ids if id >= 0 and not already present.
void add_unique(std::vector<int32_t>& ids, int32_t id);

}  // namespace kvb::tokenizer
