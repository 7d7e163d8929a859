// SentencePiece-style vocabularies (GGUF tokenizer.ggml.model "llama") with llama.cpp's SPM
// algorithm (llama-vocab.cpp llm_tokenizer_spm_session): spaces become U+2581, a space is
// prefixed to text at the start and after each special token (add_space_prefix), UTF-8
// characters are merged pairwise by highest token score (leftmost on ties), and characters with
// no token fall back to "<0xXX>" byte tokens.
#include <algorithm>
#include <array>
#include <queue>
#include <unordered_map>

#include "common/error.h"
#include "workers/tokenizer/tokenizer_impl.h"
#include "workers/tokenizer/unicode.h"

namespace kvb::tokenizer {
namespace {

constexpr char kSpace[] = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's space

std::string escape_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  for (char c : text) {
    if (c == ' ') {
      out += kSpace;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string unescape_spaces(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, 3, kSpace) == 0) {
      out.push_back(' ');
      i += 3;
    } else {
      out.push_back(text[i++]);
    }
  }
  return out;
}

// "<0xXX>" -> the byte, or -1 (llama.cpp's reading: two hex digits).
int parse_byte_token(const std::string& t) { return byte_token_value(t, false); }

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(SpmVocab v) : v_(std::move(v)) {
    const size_t n = v_.tokens.size();
    KVB_CHECK(n > 0 && v_.scores.size() == n && v_.kinds.size() == n)
        << v_.source << ": " << n << " tokens, " << v_.scores.size() << " scores, "
        << v_.kinds.size() << " token types (must be equal and non-zero)";
    token_to_id_.reserve(n);
    byte_id_.fill(-1);
    for (size_t i = 0; i < n; ++i) {
      const auto id = static_cast<int32_t>(i);
      token_to_id_.emplace(v_.tokens[i], id);
      if (v_.kinds[i] == TokenKind::kByte) {
        const int b = parse_byte_token(v_.tokens[i]);
        KVB_CHECK(b >= 0) << v_.source << ": byte token " << i << " '" << v_.tokens[i]
                          << "' is not of the form <0xXX>";
        byte_id_[b] = id;
      }
      if (v_.kinds[i] == TokenKind::kControl || v_.kinds[i] == TokenKind::kUserDefined) {
        specials_.add(v_.tokens[i], id, v_.kinds[i] == TokenKind::kControl);
      }
    }
    for (int b = 0; b < 256; ++b) {  // llama.cpp byte_to_token: "<0xXX>", else the 1-byte text
      if (byte_id_[b] >= 0) continue;
      auto it = token_to_id_.find(std::string(1, static_cast<char>(b)));
      byte_id_[b] = it != token_to_id_.end() ? it->second : v_.unk_id;
    }
    bos_id_ = v_.bos_id;
    eos_id_ = v_.eos_id;
    end_ids_ = v_.end_ids;
    default_add_bos_ = v_.add_bos;
  }

  std::vector<int32_t> encode(const std::string& text, const EncodeOptions& opt) const override {
    std::vector<int32_t> out;
    if (opt.add_bos && bos_id_ >= 0) out.push_back(bos_id_);
    bool prev_special = true;  // the text start counts as "after a special token"
    for (const auto& piece : specials_.split(text, opt.parse_special)) {
      if (piece.id >= 0) {
        out.push_back(piece.id);
        prev_special = true;
        continue;
      }
      std::string raw = (v_.add_space_prefix && prev_special) ? " " : "";
      raw += piece.text;
      encode_raw(escape_spaces(raw), out);
      prev_special = false;
    }
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::string out;
    int32_t prev = -1;
    for (int32_t id : ids) {
      out += token_to_piece_after(prev, id, skip_special);
      prev = id;
    }
    return out;
  }

  std::string token_to_piece_after(int32_t prev, int32_t id, bool skip_special) const override {
    std::string piece = token_to_piece(id, skip_special);
    const bool at_start = prev < 0 || prev == bos_id_;
    if (v_.add_space_prefix && at_start && v_.kinds[id] == TokenKind::kNormal && !piece.empty() &&
        piece[0] == ' ') {
      piece.erase(0, 1);
    }
    return piece;
  }

  std::string token_to_piece(int32_t id, bool skip_special) const override {
    KVB_CHECK(id >= 0 && id < vocab_size())
        << "token id " << id << " out of range [0, " << vocab_size() << ")";
    switch (v_.kinds[id]) {
      case TokenKind::kNormal:
        return unescape_spaces(v_.tokens[id]);
      case TokenKind::kByte:
        return std::string(1, static_cast<char>(parse_byte_token(v_.tokens[id])));
      case TokenKind::kUnknown:
        return skip_special ? std::string() : "\xE2\x96\x85";  // llama.cpp renders unk as U+2585
      case TokenKind::kControl:
        return skip_special ? std::string() : v_.tokens[id];
      default:  // user-defined, unused
        return v_.tokens[id];
    }
  }

  int32_t vocab_size() const override { return static_cast<int32_t>(v_.tokens.size()); }
  bool is_special(int32_t id) const override {
    return id >= 0 && id < vocab_size() &&
           (v_.kinds[id] == TokenKind::kControl || v_.kinds[id] == TokenKind::kUnknown);
  }
  int32_t find_token(const std::string& text) const override {
    auto it = token_to_id_.find(text);
    return it == token_to_id_.end() ? -1 : it->second;
  }

 private:
  void encode_raw(const std::string& text, std::vector<int32_t>& out) const {
    struct Sym {
      size_t start, len;
      int prev, next;
    };
    std::vector<Sym> syms;
    for (size_t off = 0; off < text.size();) {
      const size_t len = std::min(unicode::utf8_len(uint8_t(text[off])), text.size() - off);
      const int idx = static_cast<int>(syms.size());
      syms.push_back({off, len, idx - 1, off + len < text.size() ? idx + 1 : -1});
      off += len;
    }
    if (syms.empty()) return;
    struct Cand {
      float score;
      int left, right;
      size_t len;                            // merged length: a stale candidate no longer matches
      bool operator<(const Cand& o) const {  // priority_queue pops the largest
        return score != o.score ? score < o.score : left > o.left;
      }
    };
    std::priority_queue<Cand> queue;
    auto push = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      const size_t len = syms[l].len + syms[r].len;
      auto it = token_to_id_.find(text.substr(syms[l].start, len));
      if (it == token_to_id_.end()) return;
      queue.push({v_.scores[it->second], l, r, len});
    };
    for (size_t i = 1; i < syms.size(); ++i) push(int(i) - 1, int(i));
    while (!queue.empty()) {
      const Cand c = queue.top();
      queue.pop();
      Sym& l = syms[c.left];
      Sym& r = syms[c.right];
      if (l.len == 0 || r.len == 0 || l.len + r.len != c.len || l.next != c.right) continue;
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) syms[r.next].prev = c.left;
      push(l.prev, c.left);
      push(c.left, l.next);
    }
    for (int i = 0; i >= 0; i = syms[i].next) {
      const std::string piece = text.substr(syms[i].start, syms[i].len);
      auto it = token_to_id_.find(piece);
      if (it != token_to_id_.end()) {
        out.push_back(it->second);
        continue;
      }
      for (char ch : piece) {  // merged symbols are always tokens; only single chars get here
        const int32_t id = byte_id_[static_cast<uint8_t>(ch)];
        KVB_CHECK(id >= 0) << v_.source << ": no byte token or <unk> for byte "
                           << int(static_cast<uint8_t>(ch));
        out.push_back(id);
      }
    }
  }

  SpmVocab v_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::array<int32_t, 256> byte_id_{};
  SpecialSplitter specials_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(SpmVocab vocab) {
  return std::make_unique<SpmTokenizer>(std::move(vocab));
}

int byte_token_value(const std::string& t, bool allow_plus) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (allow_plus && t[3] == '+') return hex(t[4]);  // from_str_radix accepts a leading '+'
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace kvb::tokenizer
