// Tokenizers: llama2.c tokenizer.bin, GGUF `gpt2` byte-level BPE (pre-split regex chosen by
// tokenizer.ggml.pre, via PCRE2), GGUF `llama` SentencePiece-style vocabularies, and HF
// tokenizer.json BPE files. Special (control) tokens are matched in text before BPE.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvb::formats {
class GgufFile;
}

namespace kvb::tokenizer {

struct EncodeOptions {
  bool add_bos = false;       // prepend BOS (if the vocabulary has one)
  bool parse_special = true;  // text like "<|im_start|>" becomes its control token
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& text, const EncodeOptions& opt) const = 0;
  // Decodes ids to text (bytes; may end in partial UTF-8). Control tokens (BOS/EOS/chat markers)
  // are rendered as their text unless skip_special is true. SentencePiece-style vocabularies
  // (llama2.c, GGUF "llama") drop the leading space of the first text token when it starts the
  // sequence or follows BOS (run.c decode), so decode(encode(x)) == x. HF tokenizer.json files
  // decode as HF tokenizers' decode does (their decoder chain; ByteFallback turns an invalid
  // UTF-8 run of byte tokens into one U+FFFD per byte).
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // Text of one token on its own (raw bytes for byte tokens, which may be partial UTF-8 that
  // callers concatenate). Throws on ids outside [0, vocab_size).
  virtual std::string token_to_piece(int32_t id, bool skip_special = false) const = 0;
  // Text of `id` when it follows `prev` in a stream (prev = -1 at the start): as token_to_piece,
  // except that SentencePiece-style vocabularies strip the leading space after BOS or at the
  // start, as run.c's decode(prev, token) does.
  virtual std::string token_to_piece_after(int32_t prev, int32_t id,
                                           bool skip_special = false) const {
    return token_to_piece(id, skip_special);
  }

  virtual int32_t vocab_size() const = 0;
  int32_t bos_id() const { return bos_id_; }  // -1 if none
  int32_t eos_id() const { return eos_id_; }  // -1 if none
  // Every id that ends generation (EOS, EOT, <|im_end|>, ...), as the model's metadata names them.
  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  bool is_end(int32_t id) const;
  // Whether the vocabulary's convention is to start a prompt with BOS (GGUF
  // tokenizer.ggml.add_bos_token, tokenizer_config.json add_bos_token; llama2.c: true). Encoding
  // never adds BOS on its own: callers pass EncodeOptions::add_bos.
  bool default_add_bos() const { return default_add_bos_; }
  // Whether the token is a control/special token.
  virtual bool is_special(int32_t id) const = 0;
  // Returns the id of a token given its exact text, or -1.
  virtual int32_t find_token(const std::string& text) const = 0;

 protected:
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  std::vector<int32_t> end_ids_;
  bool default_add_bos_ = false;
};

// llama2.c tokenizer.bin (scores + pieces, merges by highest score; BOS 1, EOS 2). vocab_size
// must equal the number of pieces in the file (the checkpoint's vocab_size).
std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path, int32_t vocab_size);
// From a GGUF file's tokenizer.ggml.* metadata: model "gpt2" (byte-level BPE; pre-split by
// tokenizer.ggml.pre) or "llama" (SentencePiece-style scores, llama.cpp's SPM algorithm).
// end_ids(): eos/eot/eom ids from the metadata plus control tokens whose text ends a turn
// (<|im_end|>, <|eot_id|>, <|eom_id|>, <|end|>, <end_of_turn>, <|endoftext|>, <EOT>).
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const formats::GgufFile& gguf);
// From a Hugging Face tokenizer.json (model type BPE): byte-level (ByteLevel pre-tokenizer, e.g.
// Qwen's) or SentencePiece-style (byte_fallback with a Metaspace pre-tokenizer or a normalizer
// replacing " " by U+2581, e.g. Llama-2's, Mistral's, Gemma's), both with HF tokenizers' encode
// and decode. Reads bos/eos and add_bos_token from a tokenizer_config.json beside it when
// present; without add_bos_token, default_add_bos() follows the post_processor (a
// TemplateProcessing that starts with a special token, as Llama 3's, prepends it). end_ids() also
// gets the turn-ending added tokens above.
std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path);

// Wraps a tokenizer for a model with model_vocab_size >= its vocab_size() logits: ids in between
// (padding rows, sampled by a random or padded model) decode to "" with a one-time warning on
// stderr, as HF tokenizers' decode skips unknown ids; vocab_size() becomes model_vocab_size.
// Returns inner itself when the sizes are equal; throws when the model's is smaller.
std::unique_ptr<Tokenizer> pad_vocabulary(std::unique_ptr<Tokenizer> inner,
                                          int32_t model_vocab_size);

// Hand-written chat formats, chosen by signature of a Jinja template. Test oracles only: kvbench
// renders a model's own template with JinjaChatTemplate (jinja_chat_template.h); these check it.
enum class ChatFormat { kNone, kChatML, kLlama3, kGemma };
struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};
// By signature: "<|im_start|>" -> ChatML, "<|start_header_id|>" -> Llama-3, "<start_of_turn>"
// -> Gemma, anything else (or "") -> kNone.
ChatFormat detect_chat_format(const std::string& jinja_template);
const char* chat_format_name(ChatFormat f);  // "none", "chatml", "llama3", "gemma"
// The system message a ChatML template inserts when messages[0] is not a system message (SmolLM2:
// "You are a helpful AI assistant named SmolLM, trained by Hugging Face"), or "" if it has none.
std::string chat_default_system(const std::string& jinja_template);
// Renders messages (and, if add_generation_prompt, the opening of the assistant turn) exactly as
// the format's reference Jinja template does; the result is meant to be encoded with
// parse_special = true and add_bos = false.
// - ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then
//   "<|im_start|>assistant\n". If default_system is non-empty, messages is non-empty and
//   messages[0] is not a system message, "<|im_start|>system\n{default_system}<|im_end|>\n"
//   comes first (SmolLM2's template; pass chat_default_system(template) to reproduce it).
// - Llama-3: the official Meta template: "<|begin_of_text|>" (its bos_token) written literally
//   before the first message (so do not also add BOS), then
//   "<|start_header_id|>{role}<|end_header_id|>\n\n"
//   "{content | trim}<|eot_id|>" per message, then "<|start_header_id|>assistant"
//   "<|end_header_id|>\n\n". default_system, if given, is used as a system message when
//   messages[0] is not one.
// - Gemma: "<bos>" literally, then "<start_of_turn>{user|model}\n{content | trim}<end_of_turn>\n"
//   per message ("assistant" becomes "model"); a leading system message (or default_system) is
//   folded into the first user turn as "{system}\n\n{user}"; then "<start_of_turn>model\n".
//   Roles must alternate user/model, as Gemma's template requires.
// Throws kvb::Error on kNone, on an unknown role, or on a role order the template rejects.
std::string apply_chat_template(ChatFormat f, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt = true,
                                const std::string& default_system = "");

}  // namespace kvb::tokenizer
