// SentencePiece-style tokenizer.json (Llama-2, Mistral, Gemma): HF tokenizers' BPE model with
// byte_fallback (tokenizers/src/models/bpe/model.rs merge_word, word.rs merge_all) after the
// file's normalizer (Prepend, Replace, NFC) and optional pre-tokenizer (Metaspace,
// pre_tokenizers/metaspace.rs; Split on a string, MergedWithPrevious), decoded by its decoder chain
// (decoders/{byte_fallback,fuse,strip, metaspace}.rs, normalizers' Replace). Merges are applied by
// rank, not by token score: a tokenizer.json carries no scores, and a pair that is not in the merge
// list never merges even when its concatenation is a token (so llama.cpp's score-driven SPM in
// spm.cc is not equivalent).
#include <array>
#include <cstdio>

#include "common/error.h"
#include "workers/tokenizer/tokenizer_impl.h"
#include "workers/tokenizer/unicode.h"

namespace kvb::tokenizer {
namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out += to;
  }
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

// Strict UTF-8 validity, as Rust's String::from_utf8 (no overlongs, surrogates or > U+10FFFF).
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    size_t n;
    uint32_t cp, min;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      n = 2, cp = b & 0x1F, min = 0x80;
    } else if ((b & 0xF0) == 0xE0) {
      n = 3, cp = b & 0x0F, min = 0x800;
    } else if ((b & 0xF8) == 0xF0) {
      n = 4, cp = b & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<uint8_t>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

// The byte a "<0xXX>" token stands for (decoders/byte_fallback.rs: 6 bytes, u8::from_str_radix
// of the two between "<0x" and ">"), or -1.
int byte_of_token(const std::string& t) { return byte_token_value(t, true); }

class HfSpmTokenizer final : public Tokenizer {
 public:
  explicit HfSpmTokenizer(HfSpmVocab v) : v_(std::move(v)) {
    const BpeVocab& b = v_.bpe;
    const size_t n = b.tokens.size();
    KVB_CHECK(n > 0 && b.kinds.size() == n)
        << b.source << ": " << n << " tokens but " << b.kinds.size() << " token types";
    token_to_id_.reserve(n);
    for (size_t i = 0; i < n; ++i) token_to_id_.emplace(b.tokens[i], static_cast<int32_t>(i));
    merges_ = make_merge_table(b.merges, token_to_id_, b.source);
    for (int byte = 0; byte < 256; ++byte) {  // model.rs: format!("<{:#04X}>", b)
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", byte);
      auto it = token_to_id_.find(name);
      byte_id_[byte] = it != token_to_id_.end() ? it->second : -1;
    }
    for (size_t i = 0; i < n; ++i) {
      if (b.kinds[i] == TokenKind::kControl || b.kinds[i] == TokenKind::kUserDefined) {
        specials_.add(b.tokens[i], static_cast<int32_t>(i), b.kinds[i] == TokenKind::kControl);
      }
    }
    for (const auto& s : v_.decoder) {
      byte_fallback_decoder_ |= s.kind == HfDecodeStep::Kind::kByteFallback;
      if (s.kind == HfDecodeStep::Kind::kStrip && s.from == " ") strip_first_ += s.start;
      if (s.kind == HfDecodeStep::Kind::kMetaspace && s.drop_first) strip_first_ += 1;
    }
    bos_id_ = b.bos_id;
    eos_id_ = b.eos_id;
    end_ids_ = b.end_ids;
    default_add_bos_ = b.add_bos;
  }

  std::vector<int32_t> encode(const std::string& text, const EncodeOptions& opt) const override {
    std::vector<int32_t> out;
    if (opt.add_bos && bos_id_ >= 0) out.push_back(bos_id_);
    for (const auto& piece : specials_.split(text, opt.parse_special)) {
      if (piece.id >= 0) {
        out.push_back(piece.id);
        continue;
      }
      std::string s(piece.text);
      for (const auto& step : v_.normalizer) {
        switch (step.kind) {
          case HfTextStep::Kind::kReplace:
            replace_all(s, step.from, step.to);
            break;
          case HfTextStep::Kind::kPrepend:
            if (!s.empty()) s = step.to + s;
            break;
          case HfTextStep::Kind::kNfc:
            s = unicode::nfc(s);
            break;
        }
      }
      if (v_.metaspace) {
        // Prepend scheme "first" prepends only to the piece at offset 0 of the original text.
        const bool at_start = piece.text.data() == text.data();
        replace_all(s, " ", v_.replacement);
        if ((v_.prepend == MetaspacePrepend::kAlways ||
             (v_.prepend == MetaspacePrepend::kFirst && at_start)) &&
            s.compare(0, v_.replacement.size(), v_.replacement) != 0) {
          s = v_.replacement + s;
        }
      }
      if (!v_.split_after.empty()) {  // Split MergedWithPrevious: words end after the pattern
        size_t begin = 0;
        for (size_t hit = s.find(v_.split_after); hit != std::string::npos;
             hit = s.find(v_.split_after, begin)) {
          encode_word(std::string_view(s).substr(begin, hit + v_.split_after.size() - begin), out);
          begin = hit + v_.split_after.size();
        }
        encode_word(std::string_view(s).substr(begin), out);
        continue;
      }
      if (!v_.metaspace || !v_.split) {
        encode_word(s, out);
        continue;
      }
      // Split with MergedWithNext: each replacement character starts a new word.
      size_t begin = 0;
      for (size_t hit = s.find(v_.replacement, 1); hit != std::string::npos;
           hit = s.find(v_.replacement, hit + v_.replacement.size())) {
        encode_word(std::string_view(s).substr(begin, hit - begin), out);
        begin = hit;
      }
      encode_word(std::string_view(s).substr(begin), out);
    }
    return out;
  }

  // HF tokenizers' decode: token strings (special ones dropped when skip_special) through the
  // decoder chain, then concatenated.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::vector<std::string> toks;
    toks.reserve(ids.size());
    for (int32_t id : ids) {
      check_id(id);
      if (skip_special && is_special(id)) continue;
      toks.push_back(v_.bpe.tokens[id]);
    }
    for (const auto& step : v_.decoder) toks = apply_decode_step(step, std::move(toks));
    std::string out;
    for (const auto& t : toks) out += t;
    return out;
  }

  // One token on its own, for streaming: byte tokens give their raw byte (callers concatenate
  // partial UTF-8), other tokens go through the chain as a non-first token (no Strip).
  std::string token_to_piece(int32_t id, bool skip_special) const override {
    check_id(id);
    if (skip_special && is_special(id)) return "";
    std::string t = v_.bpe.tokens[id];
    if (byte_fallback_decoder_) {
      const int byte = byte_of_token(t);
      if (byte >= 0) return std::string(1, static_cast<char>(byte));
    }
    for (const auto& step : v_.decoder) {
      if (step.kind == HfDecodeStep::Kind::kReplace) replace_all(t, step.from, step.to);
      if (step.kind == HfDecodeStep::Kind::kMetaspace) replace_all(t, step.from, " ");
    }
    return t;
  }

  // At the start or after BOS, drops the leading spaces that the decoder's Strip (or Metaspace's
  // first-token rule) removes from the whole text.
  std::string token_to_piece_after(int32_t prev, int32_t id, bool skip_special) const override {
    std::string piece = token_to_piece(id, skip_special);
    if ((prev < 0 || prev == bos_id_) && !is_special(id)) {
      size_t k = 0;
      while (k < piece.size() && k < size_t(strip_first_) && piece[k] == ' ') ++k;
      piece.erase(0, k);
    }
    return piece;
  }

  int32_t vocab_size() const override { return static_cast<int32_t>(v_.bpe.tokens.size()); }
  bool is_special(int32_t id) const override {
    return id >= 0 && id < vocab_size() &&
           (v_.bpe.kinds[id] == TokenKind::kControl || v_.bpe.kinds[id] == TokenKind::kUnknown);
  }
  int32_t find_token(const std::string& text) const override {
    auto it = token_to_id_.find(text);
    return it == token_to_id_.end() ? -1 : it->second;
  }

 private:
  void check_id(int32_t id) const {
    KVB_CHECK(id >= 0 && id < vocab_size())
        << "token id " << id << " out of range [0, " << vocab_size() << ")";
  }

  // model.rs merge_word: characters in the vocabulary are symbols; others become their
  // "<0xXX>" byte tokens if all exist (byte_fallback), else <unk> (fused over consecutive
  // characters with fuse_unk). As in HF, a pending <unk> is emitted at the next known character or
  // at the end of the word, after any byte tokens in between.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    std::vector<int32_t> syms;
    bool unk_pending = false;
    const int32_t unk = v_.bpe.unk_id;
    for (size_t off = 0; off < word.size();) {
      const size_t len = std::min(unicode::utf8_len(uint8_t(word[off])), word.size() - off);
      const std::string_view ch = word.substr(off, len);
      off += len;
      auto it = token_to_id_.find(std::string(ch));
      if (it != token_to_id_.end()) {
        if (unk_pending) syms.push_back(unk);
        unk_pending = false;
        syms.push_back(it->second);
        continue;
      }
      if (v_.byte_fallback) {
        bool all = true;
        for (char c : ch) all &= byte_id_[static_cast<uint8_t>(c)] >= 0;
        if (all) {
          for (char c : ch) syms.push_back(byte_id_[static_cast<uint8_t>(c)]);
          continue;
        }
      }
      if (unk < 0) continue;  // no unk_token: HF drops the character
      if (unk_pending && !v_.fuse_unk) syms.push_back(unk);
      unk_pending = true;
    }
    if (unk_pending) syms.push_back(unk);
    const std::vector<int32_t> ids = apply_merges(std::move(syms), merges_);
    out.insert(out.end(), ids.begin(), ids.end());
  }

  static std::vector<std::string> apply_decode_step(const HfDecodeStep& step,
                                                    std::vector<std::string> toks) {
    using Kind = HfDecodeStep::Kind;
    switch (step.kind) {
      case Kind::kReplace:
        for (auto& t : toks) replace_all(t, step.from, step.to);
        return toks;
      case Kind::kByteFallback: {
        std::vector<std::string> out;
        std::string bytes;
        auto flush = [&] {
          if (bytes.empty()) return;
          if (valid_utf8(bytes)) {
            out.push_back(bytes);
          } else {
            for (size_t i = 0; i < bytes.size(); ++i) out.push_back("\xEF\xBF\xBD");  // U+FFFD
          }
          bytes.clear();
        };
        for (auto& t : toks) {
          const int byte = byte_of_token(t);
          if (byte >= 0) {
            bytes.push_back(static_cast<char>(byte));
            continue;
          }
          flush();
          out.push_back(std::move(t));
        }
        flush();
        return out;
      }
      case Kind::kFuse: {
        std::string all;
        for (const auto& t : toks) all += t;
        return {all};
      }
      case Kind::kStrip:
        for (auto& t : toks) {
          size_t head = 0, tail = t.size();
          for (int k = 0; k < step.start && t.compare(head, step.from.size(), step.from) == 0 &&
                          head < t.size();
               ++k) {
            head += step.from.size();
          }
          for (int k = 0; k < step.stop && tail >= head + step.from.size() &&
                          t.compare(tail - step.from.size(), step.from.size(), step.from) == 0;
               ++k) {
            tail -= step.from.size();
          }
          t = t.substr(head, tail - head);
        }
        return toks;
      case Kind::kMetaspace:
        for (size_t i = 0; i < toks.size(); ++i) {
          replace_all(toks[i], step.from, i == 0 && step.drop_first ? "" : " ");
        }
        return toks;
    }
    return toks;
  }

  HfSpmVocab v_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  MergeTable merges_;
  std::array<int32_t, 256> byte_id_{};
  SpecialSplitter specials_;
  bool byte_fallback_decoder_ = false;
  int strip_first_ = 0;  // leading spaces the decoder strips from the whole text
};

}  // namespace

std::unique_ptr<Tokenizer> make_hf_spm_tokenizer(HfSpmVocab vocab) {
  return std::make_unique<HfSpmTokenizer>(std::move(vocab));
}

}  // namespace kvb::tokenizer
