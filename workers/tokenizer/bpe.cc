// Byte-level BPE (GPT-2 family): added tokens split out first, optional NFC, regex pre-split,
// bytes mapped to GPT-2's printable alphabet, then merges applied lowest rank first (leftmost on
// ties), as llama.cpp's llm_tokenizer_bpe_session and HF tokenizers' models::bpe do. Words are
// cached, so repeated words cost one hash lookup.
#include <array>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "common/error.h"
#include "workers/tokenizer/tokenizer_impl.h"
#include "workers/tokenizer/unicode.h"

namespace kvb::tokenizer {
namespace {

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeVocab v) : v_(std::move(v)), splitter_(v_.pre_patterns) {
    const size_t n = v_.tokens.size();
    KVB_CHECK(n > 0 && v_.kinds.size() == n)
        << v_.source << ": " << n << " tokens but " << v_.kinds.size() << " token types";
    token_to_id_.reserve(n);
    for (size_t i = 0; i < n; ++i) token_to_id_.emplace(v_.tokens[i], static_cast<int32_t>(i));
    // Vocabularies may lack rare bytes (SmolLM2 lacks 21, e.g. 0x04 and 0xF1-0xFF): such bytes
    // become <unk> as in HF BPE with unk_token, or are dropped without one (as llama.cpp does).
    int known_bytes = 0;
    for (int b = 0; b < 256; ++b) {
      auto it = token_to_id_.find(unicode::byte_to_unicode()[b]);
      byte_token_[b] = it != token_to_id_.end() ? it->second : v_.unk_id;
      known_bytes += it != token_to_id_.end();
    }
    KVB_CHECK(known_bytes >= 128) << v_.source << ": only " << known_bytes
                                  << " of the 256 byte-level symbols are in the vocabulary: not "
                                     "a byte-level BPE vocabulary";
    merges_ = make_merge_table(v_.merges, token_to_id_, v_.source);
    for (size_t i = 0; i < n; ++i) {
      if (v_.kinds[i] == TokenKind::kControl || v_.kinds[i] == TokenKind::kUserDefined) {
        specials_.add(v_.tokens[i], static_cast<int32_t>(i), v_.kinds[i] == TokenKind::kControl);
      }
    }
    bos_id_ = v_.bos_id;
    eos_id_ = v_.eos_id;
    end_ids_ = v_.end_ids;
    default_add_bos_ = v_.add_bos;
  }

  std::vector<int32_t> encode(const std::string& text, const EncodeOptions& opt) const override {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 2);
    if (opt.add_bos && bos_id_ >= 0) out.push_back(bos_id_);
    for (const auto& piece : specials_.split(text, opt.parse_special)) {
      if (piece.id >= 0) {
        out.push_back(piece.id);
        continue;
      }
      std::string raw = v_.nfc ? unicode::nfc(piece.text) : std::string(piece.text);
      if (v_.add_prefix_space && raw[0] != ' ') raw = " " + raw;
      for (std::string_view word : splitter_.split(raw)) encode_word(word, out);
    }
    return out;
  }

  std::string token_to_piece(int32_t id, bool skip_special) const override {
    KVB_CHECK(id >= 0 && id < vocab_size())
        << "token id " << id << " out of range [0, " << vocab_size() << ")";
    switch (v_.kinds[id]) {
      case TokenKind::kControl:
      case TokenKind::kUnknown:
        return skip_special ? std::string() : v_.tokens[id];
      case TokenKind::kUserDefined:
        return v_.tokens[id];
      default:
        return unicode::unicode_text_to_bytes(v_.tokens[id]);
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
  // Encodes one pre-token (raw bytes) and appends its ids.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    const std::string key(word);
    {
      std::lock_guard<std::mutex> lock(cache_mu_);
      auto it = cache_.find(key);
      if (it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> ids = merge_word(word);
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() > kMaxCacheEntries) cache_.clear();
    cache_.emplace(key, std::move(ids));
  }

  std::vector<int32_t> merge_word(std::string_view word) const {
    if (v_.ignore_merges) {
      auto it = token_to_id_.find(unicode::bytes_to_unicode_text(word));
      if (it != token_to_id_.end()) return {it->second};
    }
    std::vector<int32_t> ids(word.size());
    for (size_t i = 0; i < word.size(); ++i) ids[i] = byte_token_[static_cast<uint8_t>(word[i])];
    return apply_merges(std::move(ids), merges_);  // drops -1: a byte with no symbol, no <unk>
  }

  static constexpr size_t kMaxCacheEntries = 1 << 18;
  BpeVocab v_;
  RegexSplitter splitter_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  MergeTable merges_;
  std::array<int32_t, 256> byte_token_{};
  SpecialSplitter specials_;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace

MergeTable make_merge_table(const std::vector<std::pair<std::string, std::string>>& merges,
                            const std::unordered_map<std::string, int32_t>& token_to_id,
                            const std::string& source) {
  MergeTable table;
  table.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    auto ia = token_to_id.find(a), ib = token_to_id.find(b), im = token_to_id.find(a + b);
    KVB_CHECK(ia != token_to_id.end() && ib != token_to_id.end() && im != token_to_id.end())
        << source << ": merge " << r << " '" << a << " " << b
        << "' uses or produces a token that is not in the vocabulary";
    table.emplace(merge_pair_key(ia->second, ib->second),
                  std::make_pair(static_cast<int32_t>(r), im->second));  // first rank wins
  }
  return table;
}

std::vector<int32_t> apply_merges(std::vector<int32_t> word, const MergeTable& merges) {
  struct Sym {
    int32_t id;
    int prev, next;
    bool merged;  // absorbed into its left neighbour
  };
  if (word.empty()) return word;
  std::vector<Sym> syms(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    syms[i] = {word[i], int(i) - 1, i + 1 < word.size() ? int(i) + 1 : -1, false};
  }
  struct Cand {
    int32_t rank;
    int left, right;
    int32_t left_id, right_id, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> queue;
  auto push = [&](int l, int r) {
    if (l < 0 || r < 0 || syms[l].id < 0 || syms[r].id < 0) return;
    auto it = merges.find(merge_pair_key(syms[l].id, syms[r].id));
    if (it == merges.end()) return;
    queue.push({it->second.first, l, r, syms[l].id, syms[r].id, it->second.second});
  };
  for (size_t i = 0; i + 1 < word.size(); ++i) push(int(i), int(i) + 1);
  while (!queue.empty()) {
    const Cand c = queue.top();
    queue.pop();
    Sym& l = syms[c.left];
    // Stale if either side was merged since (a symbol's id only changes by merging).
    Sym& r = syms[c.right];
    if (l.merged || r.merged || l.id != c.left_id || l.next != c.right || r.id != c.right_id) {
      continue;
    }
    l.id = c.merged;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    r.merged = true;
    push(l.prev, c.left);
    push(c.left, l.next);
  }
  std::vector<int32_t> ids;
  for (int i = 0; i >= 0; i = syms[i].next) {
    if (syms[i].id >= 0) ids.push_back(syms[i].id);
  }
  return ids;
}

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeVocab vocab) {
  return std::make_unique<BpeTokenizer>(std::move(vocab));
}

}  // namespace kvb::tokenizer
