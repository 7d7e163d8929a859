// The SentencePiece-style sections of a Hugging Face tokenizer.json (Llama-2, Mistral, Gemma 3):
// model.byte_fallback / fuse_unk, normalizer (Prepend, Replace with a String pattern, NFC,
// Sequence), pre_tokenizer (null, Metaspace, or Split on a String MergedWithPrevious), decoder
// (Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence). Every field is validated; errors name
// the file and the key. Reference: huggingface/tokenizers 0.21 serialization (normalizers/,
// pre_tokenizers/metaspace.rs, decoders/).
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "workers/tokenizer/tokenizer_impl.h"
#include "workers/tokenizer/unicode.h"

namespace kvb::tokenizer {
namespace {

using json = nlohmann::json;

struct Ctx {
  const std::string& path;
  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    KVB_FAIL() << path << ": key '" << key << "' " << what;
    __builtin_unreachable();  // KVB_FAIL throws
  }
  const json& need(const json& obj, const std::string& key, const std::string& where) const {
    if (!obj.is_object() || !obj.contains(key)) bad(where + "." + key, "is missing");
    return obj.at(key);
  }
  std::string string(const json& obj, const std::string& key, const std::string& where) const {
    const json& s = need(obj, key, where);
    if (!s.is_string()) bad(where + "." + key, "must be a string, not " + s.dump());
    return s;
  }
  std::string one_char(const json& obj, const std::string& key, const std::string& where) const {
    const std::string s = string(obj, key, where);
    size_t pos = 0;
    if (s.empty() || (unicode::next_codepoint(s, pos), pos != s.size())) {
      bad(where + "." + key, "must be exactly one character, not \"" + s + "\"");
    }
    return s;
  }
  bool flag(const json& obj, const std::string& key, const std::string& where, bool dflt) const {
    if (!obj.contains(key) || obj[key].is_null()) return dflt;
    if (!obj[key].is_boolean()) bad(where + "." + key, "must be true or false");
    return obj[key].get<bool>();
  }
  std::string type(const json& obj, const std::string& where) const {
    if (!obj.is_object()) bad(where, "must be an object with a \"type\"");
    return string(obj, "type", where);
  }
  // A Replace's {"String": s} pattern (Regex patterns are not supported).
  std::string literal_pattern(const json& obj, const std::string& where) const {
    const json& pat = need(obj, "pattern", where);
    if (!pat.is_object() || !pat.contains("String") || !pat["String"].is_string() ||
        pat["String"].get<std::string>().empty()) {
      bad(where + ".pattern", "must be {\"String\": non-empty string} (Regex is not supported)");
    }
    return pat["String"];
  }
};

// Metaspace's prepend_scheme, or the older add_prefix_space flag (true = "always").
MetaspacePrepend prepend_scheme(const Ctx& c, const json& p, const std::string& where) {
  if (p.contains("prepend_scheme") && !p["prepend_scheme"].is_null()) {
    const std::string s = c.string(p, "prepend_scheme", where);
    if (s == "always") return MetaspacePrepend::kAlways;
    if (s == "first") return MetaspacePrepend::kFirst;
    if (s == "never") return MetaspacePrepend::kNever;
    c.bad(where + ".prepend_scheme",
          "is \"" + s + "\"; must be \"always\", \"first\" or \"never\"");
  }
  return c.flag(p, "add_prefix_space", where, true) ? MetaspacePrepend::kAlways
                                                    : MetaspacePrepend::kNever;
}

void add_normalizer(const Ctx& c, const json& n, const std::string& key, HfSpmVocab& v, int depth) {
  if (n.is_null()) return;
  const std::string t = c.type(n, key);
  if (t == "Sequence" && depth < 8) {
    const json& list = c.need(n, "normalizers", key);
    if (!list.is_array()) c.bad(key + ".normalizers", "must be an array");
    for (size_t i = 0; i < list.size(); ++i) {
      add_normalizer(c, list[i], key + ".normalizers[" + std::to_string(i) + "]", v, depth + 1);
    }
  } else if (t == "Replace") {
    v.normalizer.push_back(
        {HfTextStep::Kind::kReplace, c.literal_pattern(n, key), c.string(n, "content", key)});
  } else if (t == "Prepend") {
    v.normalizer.push_back({HfTextStep::Kind::kPrepend, "", c.string(n, "prepend", key)});
  } else if (t == "NFC") {
    v.normalizer.push_back({HfTextStep::Kind::kNfc, "", ""});
  } else {
    c.bad(key + ".type", "'" + t +
                             "' is not supported in a SentencePiece-style tokenizer.json "
                             "(supported: null, Sequence, Replace, Prepend, NFC)");
  }
}

HfDecodeStep step(HfDecodeStep::Kind kind, std::string from = "", std::string to = "") {
  HfDecodeStep s;
  s.kind = kind;
  s.from = std::move(from);
  s.to = std::move(to);
  return s;
}

void add_decoder(const Ctx& c, const json& d, const std::string& key, HfSpmVocab& v, int depth) {
  if (d.is_null()) return;
  const std::string t = c.type(d, key);
  using Kind = HfDecodeStep::Kind;
  if (t == "Sequence" && depth < 8) {
    const json& list = c.need(d, "decoders", key);
    if (!list.is_array()) c.bad(key + ".decoders", "must be an array");
    for (size_t i = 0; i < list.size(); ++i) {
      add_decoder(c, list[i], key + ".decoders[" + std::to_string(i) + "]", v, depth + 1);
    }
  } else if (t == "Replace") {
    v.decoder.push_back(
        step(Kind::kReplace, c.literal_pattern(d, key), c.string(d, "content", key)));
  } else if (t == "ByteFallback") {
    v.decoder.push_back(step(Kind::kByteFallback));
  } else if (t == "Fuse") {
    v.decoder.push_back(step(Kind::kFuse));
  } else if (t == "Strip") {
    HfDecodeStep s = step(Kind::kStrip, c.one_char(d, "content", key));
    for (const char* k : {"start", "stop"}) {
      const json& n = c.need(d, k, key);
      if (!n.is_number_unsigned() || n.get<uint64_t>() > 1024) {
        c.bad(key + "." + k, "must be an integer in [0, 1024], not " + n.dump());
      }
      (std::string(k) == "start" ? s.start : s.stop) = n.get<int>();
    }
    v.decoder.push_back(s);
  } else if (t == "Metaspace") {
    HfDecodeStep s = step(Kind::kMetaspace, c.one_char(d, "replacement", key));
    s.drop_first = prepend_scheme(c, d, key) != MetaspacePrepend::kNever;
    v.decoder.push_back(s);
  } else {
    c.bad(key + ".type", "'" + t +
                             "' is not supported in a SentencePiece-style tokenizer.json "
                             "(supported: null, Sequence, Replace, ByteFallback, Fuse, Strip, "
                             "Metaspace)");
  }
}

}  // namespace

namespace {
bool has_byte_level_step(const json& pre, int depth) {
  if (!pre.is_object() || !pre.contains("type") || depth > 8) return false;
  if (pre["type"] == "ByteLevel") return true;
  if (pre["type"] != "Sequence" || !pre.contains("pretokenizers")) return false;
  if (!pre["pretokenizers"].is_array()) return false;
  for (const json& p : pre["pretokenizers"]) {
    if (has_byte_level_step(p, depth + 1)) return true;
  }
  return false;
}
}  // namespace

bool is_sentencepiece_tokenizer_json(const json& root) {
  return !has_byte_level_step(root.at("pre_tokenizer"), 0);
}

std::unique_ptr<Tokenizer> make_hf_spm_tokenizer(const std::string& path, const json& root,
                                                 BpeVocab bpe) {
  const Ctx c{path};
  HfSpmVocab v;
  const json& model = root.at("model");
  v.byte_fallback = c.flag(model, "byte_fallback", "model", false);
  v.fuse_unk = c.flag(model, "fuse_unk", "model", false);
  add_normalizer(c, root.contains("normalizer") ? root["normalizer"] : json(), "normalizer", v, 0);
  const json& pre = root.at("pre_tokenizer");
  const std::string pre_type = pre.is_null() ? "" : c.type(pre, "pre_tokenizer");
  if (pre_type == "Metaspace") {
    v.metaspace = true;
    v.replacement = c.one_char(pre, "replacement", "pre_tokenizer");
    v.prepend = prepend_scheme(c, pre, "pre_tokenizer");
    v.split = c.flag(pre, "split", "pre_tokenizer", true);
  } else if (pre_type == "Split") {
    v.split_after = c.literal_pattern(pre, "pre_tokenizer");
    if (c.string(pre, "behavior", "pre_tokenizer") != "MergedWithPrevious") {
      c.bad("pre_tokenizer.behavior",
            "must be \"MergedWithPrevious\" in a SentencePiece-style tokenizer.json (supported)");
    }
    if (c.flag(pre, "invert", "pre_tokenizer", false)) {
      c.bad("pre_tokenizer.invert", "must be false (supported)");
    }
  } else if (!pre.is_null()) {
    c.bad("pre_tokenizer.type",
          "'" + pre_type +
              "' is not supported (supported: a ByteLevel step, possibly in a Sequence with "
              "Split and Digits, for byte-level BPE; null, Metaspace or Split "
              "MergedWithPrevious for SentencePiece-style BPE)");
  }
  add_decoder(c, c.need(root, "decoder", ""), "decoder", v, 0);
  if (v.normalizer.empty() && !v.metaspace) {
    c.bad("pre_tokenizer",
          "is null and the normalizer does not replace spaces: neither a "
          "byte-level nor a SentencePiece-style BPE (expected a Metaspace "
          "pre_tokenizer or a Replace \" \" -> \"\xE2\x96\x81\" normalizer)");
  }
  // HF matches normalized added tokens in the normalized text (after Prepend / Replace), which
  // this reading does not reproduce; all known SentencePiece-style files use normalized: false.
  if (!v.normalizer.empty() && root.contains("added_tokens") && root["added_tokens"].is_array()) {
    const json& list = root["added_tokens"];
    for (size_t i = 0; i < list.size(); ++i) {
      if (c.flag(list[i], "normalized", "added_tokens[" + std::to_string(i) + "]", false)) {
        c.bad("added_tokens[" + std::to_string(i) + "].normalized",
              "must be false when the file has a normalizer (not supported)");
      }
    }
  }
  v.bpe = std::move(bpe);
  return make_hf_spm_tokenizer(std::move(v));
}

}  // namespace kvb::tokenizer
