// Hugging Face tokenizer.json loader for model.type "BPE": vocab, merges ("a b" or ["a", "b"]),
// added_tokens, special ids. Byte-level files (a ByteLevel pre-tokenizer and decoder, e.g.
// Qwen2/3, SmolLM2): normalizer none or NFC (possibly in a Sequence), pre_tokenizer ByteLevel,
// Split with a Regex in "Isolated" mode, Digits, Sequence. Files whose pre_tokenizer has no
// ByteLevel step (SentencePiece-style: Llama-2, Mistral, Gemma) go to hf_tokenizer_json_spm.cc.
// Reference: huggingface/tokenizers serialization format.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "kernels/formats/file_io.h"
#include "workers/tokenizer/tokenizer_impl.h"

namespace kvb::tokenizer {
namespace {

using json = nlohmann::json;

struct Ctx {
  std::string path;
  const json& need(const json& obj, const std::string& key, const std::string& where) const {
    KVB_CHECK(obj.is_object() && obj.contains(key))
        << path << ": missing key '" << where << (where.empty() ? "" : ".") << key << "'";
    return obj.at(key);
  }
  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    KVB_FAIL() << path << ": key '" << key << "' " << what;
    __builtin_unreachable();  // KVB_FAIL throws
  }
  // obj[key] as a string / bool, `def` when absent; an error naming where.key for another type
  // (json::value would throw a type_error that names neither the file nor the key).
  std::string str(const json& obj, const char* key, const std::string& def,
                  const std::string& where) const {
    if (!obj.is_object() || !obj.contains(key)) return def;
    if (!obj[key].is_string()) bad(where + "." + key, "must be a string");
    return obj[key].get<std::string>();
  }
  bool flag(const json& obj, const char* key, bool def, const std::string& where) const {
    if (!obj.is_object() || !obj.contains(key)) return def;
    if (!obj[key].is_boolean()) bad(where + "." + key, "must be true or false");
    return obj[key].get<bool>();
  }
};

// "Regex" patterns go to PCRE2 as they are; "String" patterns are literal.
std::string split_pattern(const Ctx& c, const json& pat, const std::string& key) {
  if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) return pat["Regex"];
  if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
    std::string lit = pat["String"], out;
    for (char ch : lit) {
      if (std::string_view("\\^$.|?*+()[]{}").find(ch) != std::string_view::npos) out += '\\';
      out += ch;
    }
    return out;
  }
  c.bad(key, "must be {\"Regex\": string} or {\"String\": string}");
}

void add_pre_tokenizer(const Ctx& c, const json& p, const std::string& key, BpeVocab& v,
                       bool& byte_level) {
  KVB_CHECK(p.is_object() && p.contains("type") && p["type"].is_string())
      << c.path << ": key '" << key << ".type' must be a string";
  const std::string type = p["type"];
  if (type == "Sequence") {
    const json& list = c.need(p, "pretokenizers", key);
    if (!list.is_array()) c.bad(key + ".pretokenizers", "must be an array");
    for (size_t i = 0; i < list.size(); ++i) {
      add_pre_tokenizer(c, list[i], key + ".pretokenizers[" + std::to_string(i) + "]", v,
                        byte_level);
    }
  } else if (type == "ByteLevel") {
    if (c.flag(p, "add_prefix_space", false, key)) {
      if (!v.pre_patterns.empty()) {
        c.bad(key + ".add_prefix_space", "is only supported on the first pre-tokenizer");
      }
      v.add_prefix_space = true;
    }
    if (c.flag(p, "use_regex", true, key)) v.pre_patterns.push_back(kGpt2Pattern);
    byte_level = true;
  } else if (type == "Split") {
    const std::string behavior = c.str(p, "behavior", "", key);
    if (behavior != "Isolated") c.bad(key + ".behavior", "must be \"Isolated\" (supported)");
    if (c.flag(p, "invert", false, key)) c.bad(key + ".invert", "must be false (supported)");
    v.pre_patterns.push_back(split_pattern(c, c.need(p, "pattern", key), key + ".pattern"));
  } else if (type == "Digits") {
    v.pre_patterns.push_back(c.flag(p, "individual_digits", false, key) ? R"(\p{N})" : R"(\p{N}+)");
  } else {
    c.bad(key + ".type",
          "'" + type +
              "' is not supported (supported: Sequence, ByteLevel, Split, Digits; null or "
              "Metaspace for SentencePiece-style files)");
  }
}

// The byte-level reading: model.byte_fallback false; normalizer null, NFC, or a Sequence of those
// (transformers writes an empty Sequence for "none"); a ByteLevel step in the pre-tokenizer; a
// ByteLevel decoder.
void parse_byte_level_sections(const Ctx& c, const json& root, const json& model, BpeVocab& v) {
  const json& norm = root.contains("normalizer") ? root["normalizer"] : json();
  std::vector<std::pair<const json*, std::string>> norms = {{&norm, "normalizer"}};
  for (size_t k = 0; k < norms.size(); ++k) {
    const json& n = *norms[k].first;
    const std::string key = norms[k].second;  // a copy: push_back below reallocates
    if (n.is_null()) continue;
    const std::string t = c.str(n, "type", "", key);
    if (t == "NFC") {
      v.nfc = true;
    } else if (t == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
      for (size_t i = 0; i < n["normalizers"].size(); ++i) {
        norms.push_back({&n["normalizers"][i], key + ".normalizers[" + std::to_string(i) + "]"});
      }
    } else {
      c.bad(key + ".type", "'" + t + "' is not supported (supported: null, NFC, Sequence)");
    }
  }
  bool byte_level = false;
  add_pre_tokenizer(c, c.need(root, "pre_tokenizer", ""), "pre_tokenizer", v, byte_level);
  if (!byte_level) c.bad("pre_tokenizer", "has no ByteLevel step: not a byte-level BPE");
  if (model.contains("byte_fallback") && model["byte_fallback"] != false) {
    c.bad("model.byte_fallback", "must be false with a ByteLevel pre_tokenizer");
  }
  const json& dec = c.need(root, "decoder", "");
  if (!dec.is_object() || c.str(dec, "type", "", "decoder") != "ByteLevel") {
    c.bad("decoder.type", "must be \"ByteLevel\"");
  }
}

// bos_token / eos_token of a tokenizer_config.json: a string, {"content": ...}, or null.
std::string config_token(const json& cfg, const char* key) {
  if (!cfg.contains(key)) return "";
  const json& t = cfg[key];
  if (t.is_string()) return t;
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"];
  return "";
}

// The special token a TemplateProcessing post-processor puts before a single sequence
// ({"single": [{"SpecialToken": {"id": "<|begin_of_text|>"}}, {"Sequence": ...}]}), also inside
// a "Sequence" of processors; "" if none.
std::string template_leading_token(const json& root) {
  if (!root.contains("post_processor") || !root["post_processor"].is_object()) return "";
  std::vector<const json*> todo = {&root["post_processor"]};
  for (size_t i = 0; i < todo.size() && i < 16; ++i) {
    const json& p = *todo[i];
    const std::string type = p.is_object() && p.contains("type") && p["type"].is_string()
                                 ? p["type"].get<std::string>()
                                 : "";
    if (type == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
      for (const json& q : p["processors"]) todo.push_back(&q);
    } else if (type == "TemplateProcessing" && p.contains("single") && p["single"].is_array() &&
               !p["single"].empty()) {
      const json& first = p["single"][0];
      if (first.is_object() && first.contains("SpecialToken") &&
          first["SpecialToken"].is_object() && first["SpecialToken"].contains("id") &&
          first["SpecialToken"]["id"].is_string()) {
        return first["SpecialToken"]["id"];
      }
    }
  }
  return "";
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path) {
  const Ctx c{path};
  const uint64_t bytes = formats::regular_file_size(path, "tokenizer.json");
  KVB_USAGE_CHECK(bytes <= kMaxTokenizerBytes)
      << path << ": " << bytes << " bytes; a tokenizer.json above " << (kMaxTokenizerBytes >> 20)
      << " MiB is not plausible (is it the model file?)";
  std::ifstream in(path);
  KVB_CHECK(in.good()) << "cannot open tokenizer.json " << path;
  json root;
  try {
    root = json::parse(in);
  } catch (const json::exception& e) {
    KVB_FAIL() << path << ": not valid JSON: " << e.what();
  }
  KVB_CHECK(root.is_object()) << path << ": the top level must be a JSON object";

  const json& model = c.need(root, "model", "");
  const json& mtype = c.need(model, "type", "model");
  if (!mtype.is_string() || mtype != "BPE") {
    c.bad("model.type", "is " + mtype.dump() + "; only \"BPE\" is supported");
  }
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(k) && !model[k].is_null() && model[k] != "") {
      c.bad(std::string("model.") + k, "must be empty (not supported)");
    }
  }
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    c.bad("model.dropout", "must be null");
  }

  BpeVocab v;
  v.source = path;
  v.ignore_merges = model.value("ignore_merges", false);
  const json& vocab = c.need(model, "vocab", "model");
  if (!vocab.is_object() || vocab.empty()) c.bad("model.vocab", "must be a non-empty object");
  std::vector<std::pair<int64_t, std::string>> entries;  // (id, text, special kind later)
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0) {
      c.bad("model.vocab." + it.key(), "must be a non-negative integer id");
    }
    entries.emplace_back(it.value().get<int64_t>(), it.key());
    max_id = std::max(max_id, entries.back().first);
  }
  struct Added {
    int64_t id;
    std::string content;
    bool special;
  };
  std::vector<Added> added;
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    const json& list = root["added_tokens"];
    if (!list.is_array()) c.bad("added_tokens", "must be an array");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string key = "added_tokens[" + std::to_string(i) + "]";
      const json& id = c.need(list[i], "id", key);
      const json& content = c.need(list[i], "content", key);
      if (!id.is_number_integer() || id.get<int64_t>() < 0) c.bad(key + ".id", "must be an id");
      if (!content.is_string() || content.get<std::string>().empty()) {
        c.bad(key + ".content", "must be a non-empty string");
      }
      for (const char* k : {"lstrip", "rstrip", "single_word"}) {
        if (list[i].value(k, false)) c.bad(key + "." + k, "must be false (not supported)");
      }
      added.push_back(
          {id.get<int64_t>(), content.get<std::string>(), list[i].value("special", false)});
      max_id = std::max(max_id, added.back().id);
    }
  }
  KVB_CHECK(max_id < (int64_t(1) << 30)) << path << ": token id " << max_id << " is too large";
  v.tokens.assign(max_id + 1, std::string());
  v.kinds.assign(max_id + 1, TokenKind::kUndefined);
  for (const auto& [id, text] : entries) {
    KVB_CHECK(v.kinds[id] == TokenKind::kUndefined)
        << path << ": key 'model.vocab' gives id " << id << " to two tokens";
    v.tokens[id] = text;
    v.kinds[id] = TokenKind::kNormal;
  }
  for (const auto& a : added) {
    if (v.kinds[a.id] == TokenKind::kNormal && v.tokens[a.id] != a.content) {
      c.bad("added_tokens", "gives id " + std::to_string(a.id) + " to '" + a.content +
                                "' but model.vocab has '" + v.tokens[a.id] + "' there");
    }
    v.tokens[a.id] = a.content;
    v.kinds[a.id] = a.special ? TokenKind::kControl : TokenKind::kUserDefined;
  }
  for (size_t id = 0; id < v.kinds.size(); ++id) {
    KVB_CHECK(v.kinds[id] != TokenKind::kUndefined)
        << path << ": no token has id " << id << " (ids must be contiguous; key 'model.vocab')";
  }

  const json& merges = c.need(model, "merges", "model");
  if (!merges.is_array()) c.bad("model.merges", "must be an array");
  v.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {
      const std::string s = m;
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) {
        c.bad("model.merges[" + std::to_string(i) + "]", "'" + s + "' is not \"a b\"");
      }
      v.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      v.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      c.bad("model.merges[" + std::to_string(i) + "]", "must be \"a b\" or [\"a\", \"b\"]");
    }
  }

  c.need(root, "pre_tokenizer", "");
  const bool spm = is_sentencepiece_tokenizer_json(root);
  if (!spm) parse_byte_level_sections(c, root, model, v);

  // Special ids: tokenizer_config.json beside the file, then the turn-ending added tokens.
  auto id_of = [&](const std::string& text) -> int32_t {
    if (text.empty()) return -1;
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      if (v.tokens[i] == text) return static_cast<int32_t>(i);
    }
    return -1;
  };
  const auto cfg_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  bool add_bos_known = false;  // tokenizer_config.json has add_bos_token
  if (std::filesystem::exists(cfg_path)) {
    formats::regular_file_size(cfg_path.string(), "tokenizer_config.json");
    std::ifstream cin(cfg_path);
    json cfg;
    try {
      cfg = json::parse(cin);
    } catch (const json::exception& e) {
      KVB_FAIL() << cfg_path.string() << ": not valid JSON: " << e.what();
    }
    v.bos_id = id_of(config_token(cfg, "bos_token"));
    v.eos_id = id_of(config_token(cfg, "eos_token"));
    if (cfg.contains("add_bos_token") && !cfg["add_bos_token"].is_null()) {
      KVB_CHECK(cfg["add_bos_token"].is_boolean())
          << cfg_path.string() << ": key 'add_bos_token' must be true or false";
      v.add_bos = cfg["add_bos_token"].get<bool>() && v.bos_id >= 0;
      add_bos_known = true;
    }
  }
  // Without add_bos_token (e.g. Llama 3's PreTrainedTokenizerFast), the post-processor decides:
  // a TemplateProcessing whose "single" template starts with a special token prepends it.
  if (!add_bos_known) {
    const int32_t lead = id_of(template_leading_token(root));
    if (lead >= 0 && (v.bos_id < 0 || v.bos_id == lead)) {
      v.bos_id = lead;
      v.add_bos = true;
    }
  }
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    if (!model["unk_token"].is_string()) c.bad("model.unk_token", "must be a string or null");
    v.unk_id = id_of(model["unk_token"]);
    if (v.unk_id < 0) c.bad("model.unk_token", "names a token that is not in the vocabulary");
  }
  add_unique(v.end_ids, v.eos_id);
  for (const auto& a : added) {
    if (a.special && is_end_of_generation_text(a.content)) {
      add_unique(v.end_ids, static_cast<int32_t>(a.id));
    }
  }
  if (v.eos_id < 0 && !v.end_ids.empty()) v.eos_id = v.end_ids.front();
  if (spm) return make_hf_spm_tokenizer(path, root, std::move(v));
  return make_bpe_tokenizer(std::move(v));
}

}  // namespace kvb::tokenizer
