// llama2.c tokenizer.bin: int32 max_token_length, then per token f32 score, int32 length, bytes.
// Encoding and decoding follow karpathy/llama2.c run.c encode()/decode(): optional BOS, a dummy
// prefix " " token for non-empty text, one token per UTF-8 code point with "<0xXX>" byte fallback
// at id byte+3, then repeatedly merge the adjacent pair whose concatenation is the best-scoring
// token (leftmost on ties). run.c rescans all pairs per merge; a heap gives the same merges.
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <queue>
#include <unordered_map>

#include "common/error.h"
#include "kernels/formats/file_io.h"
#include "workers/tokenizer/tokenizer_impl.h"

namespace kvb::tokenizer {
namespace {

class Llama2cTokenizer final : public Tokenizer {
 public:
  Llama2cTokenizer(std::vector<std::string> pieces, std::vector<float> scores)
      : pieces_(std::move(pieces)), scores_(std::move(scores)) {
    for (size_t i = 0; i < pieces_.size(); ++i) {
      piece_to_id_.emplace(pieces_[i], static_cast<int32_t>(i));
    }
    bos_id_ = 1;
    eos_id_ = 2;
    end_ids_ = {2};
    default_add_bos_ = true;
  }

  std::vector<int32_t> encode(const std::string& text, const EncodeOptions& opt) const override {
    std::vector<int32_t> tokens;
    if (opt.add_bos) tokens.push_back(bos_id_);
    if (!text.empty()) {
      const int32_t dummy_prefix = find_token(" ");
      if (dummy_prefix >= 0) tokens.push_back(dummy_prefix);
    }
    // One token per code point (run.c: at most 4 bytes per buffer), else one token per byte.
    const size_t n = text.size();
    std::string buf;
    for (size_t i = 0; i < n; ++i) {
      const auto c = static_cast<uint8_t>(text[i]);
      if ((c & 0xC0) != 0x80) buf.clear();
      buf.push_back(static_cast<char>(c));
      const bool next_is_cont = i + 1 < n && (static_cast<uint8_t>(text[i + 1]) & 0xC0) == 0x80;
      if (next_is_cont && buf.size() < 4) continue;
      const int32_t id = find_token(buf);
      if (id >= 0) {
        tokens.push_back(id);
      } else {
        for (char b : buf) {
          const int32_t byte_id = static_cast<uint8_t>(b) + 3;
          KVB_CHECK(byte_id < vocab_size())
              << "llama2.c vocabulary of " << vocab_size() << " tokens has no byte token for "
              << int(static_cast<uint8_t>(b));
          tokens.push_back(byte_id);
        }
      }
      buf.clear();
    }
    merge(tokens);
    return tokens;
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
    // run.c strips the leading space of a piece after BOS; we also strip it at the start of a
    // sequence encoded without BOS, which is where encode() put its dummy prefix.
    if ((prev < 0 || prev == bos_id_) && !pieces_[id].empty() && pieces_[id][0] == ' ') {
      piece.erase(0, 1);
    }
    return piece;
  }

  std::string token_to_piece(int32_t id, bool skip_special) const override {
    KVB_CHECK(id >= 0 && id < vocab_size())
        << "token id " << id << " out of range [0, " << vocab_size() << ")";
    if (skip_special && is_special(id)) return "";
    const std::string& p = pieces_[id];
    unsigned hi = 0, lo = 0;
    if (p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>' && hex(p[3], hi) &&
        hex(p[4], lo)) {
      return std::string(1, static_cast<char>(hi * 16 + lo));
    }
    return p;
  }

  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  // <unk>, <s> and </s> (ids 0-2, as in every llama2.c export).
  bool is_special(int32_t id) const override { return id >= 0 && id <= 2; }
  int32_t find_token(const std::string& text) const override {
    auto it = piece_to_id_.find(text);
    return it == piece_to_id_.end() ? -1 : it->second;
  }

 private:
  static bool hex(char c, unsigned& v) {
    if (c >= '0' && c <= '9') {
      v = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      v = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      v = c - 'a' + 10;
    } else {
      return false;
    }
    return true;
  }

  // run.c's merge loop: the best-scoring pair (score > -1e10), leftmost on ties, until none.
  void merge(std::vector<int32_t>& tokens) const {
    const int n = static_cast<int>(tokens.size());
    std::vector<int> prev(n), next(n);
    for (int i = 0; i < n; ++i) {
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    struct Cand {
      float score;
      int left, right;
      int32_t left_id, right_id, merged;
      bool operator<(const Cand& o) const {  // priority_queue pops the largest
        return score != o.score ? score < o.score : left > o.left;
      }
    };
    std::priority_queue<Cand> queue;
    auto push = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      const int32_t id = find_token(pieces_[tokens[l]] + pieces_[tokens[r]]);
      if (id < 0 || !(scores_[id] > -1e10f)) return;
      queue.push({scores_[id], l, r, tokens[l], tokens[r], id});
    };
    for (int i = 0; i + 1 < n; ++i) push(i, i + 1);
    std::vector<bool> alive(n, true);
    while (!queue.empty()) {
      const Cand c = queue.top();
      queue.pop();
      if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right ||
          tokens[c.left] != c.left_id || tokens[c.right] != c.right_id) {
        continue;
      }
      tokens[c.left] = c.merged;
      alive[c.right] = false;
      next[c.left] = next[c.right];
      if (next[c.right] >= 0) prev[next[c.right]] = c.left;
      push(prev[c.left], c.left);
      push(c.left, next[c.left]);
    }
    std::vector<int32_t> out;
    out.reserve(n);
    for (int i = 0; i < n; ++i) {
      if (alive[i]) out.push_back(tokens[i]);
    }
    tokens = std::move(out);
  }

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t> piece_to_id_;  // first id of each piece wins
};

}  // namespace

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path, int32_t vocab_size) {
  // Read whole: bounded first, so that a model file given as the tokenizer is refused by its size
  // rather than read into memory (Llama 2's 32,000 tokens take 0.5 MiB).
  const uint64_t bytes = formats::regular_file_size(path, "llama2.c tokenizer");
  KVB_USAGE_CHECK(bytes <= kMaxTokenizerBytes)
      << path << ": " << bytes << " bytes; a llama2.c tokenizer.bin above "
      << (kMaxTokenizerBytes >> 20) << " MiB is not plausible (is it the model file?)";
  std::ifstream in(path, std::ios::binary);
  KVB_CHECK(in.good()) << "cannot open llama2.c tokenizer " << path;
  const std::vector<char> data((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
  KVB_CHECK(vocab_size > 0) << path << ": vocab_size must be positive, got " << vocab_size;
  auto read_i32 = [&](size_t off, const char* what, int32_t i) {
    KVB_CHECK(off + 4 <= data.size())
        << path << ": truncated llama2.c tokenizer: need " << what << " of token " << i
        << " at offset " << off << " but the file has " << data.size() << " bytes";
    int32_t v;
    std::memcpy(&v, data.data() + off, 4);
    return v;
  };
  KVB_CHECK(data.size() >= 4) << path << ": truncated llama2.c tokenizer: " << data.size()
                              << " bytes, no max_token_length header at offset 0";
  int32_t max_len;
  std::memcpy(&max_len, data.data(), 4);
  KVB_CHECK(max_len > 0 && max_len < (1 << 20))
      << path << ": bad max_token_length " << max_len << " at offset 0";
  std::vector<std::string> pieces(vocab_size);
  std::vector<float> scores(vocab_size);
  size_t off = 4;
  for (int32_t i = 0; i < vocab_size; ++i) {
    const int32_t score_bits = read_i32(off, "the score", i);
    std::memcpy(&scores[i], &score_bits, 4);
    // run.c's merge loop compares scores: a NaN breaks its ordering, an infinity wins or loses
    // every comparison (sentencepiece's exports hold finite scores).
    KVB_CHECK(std::isfinite(scores[i])) << path << ": token " << i << " has score " << scores[i]
                                        << " at offset " << off << "; expected a finite number";
    const int32_t len = read_i32(off + 4, "the length", i);
    KVB_CHECK(len >= 0 && len <= max_len)
        << path << ": token " << i << " has length " << len << " at offset " << off + 4
        << " (max_token_length " << max_len << ")";
    off += 8;
    KVB_CHECK(off + size_t(len) <= data.size())
        << path << ": truncated llama2.c tokenizer: token " << i << " needs " << len
        << " bytes at offset " << off << " but the file has " << data.size() << " bytes";
    pieces[i].assign(data.data() + off, size_t(len));
    off += len;
  }
  KVB_CHECK(off == data.size())
      << path << ": " << data.size() - off << " bytes remain at offset " << off << " after "
      << vocab_size << " tokens: the file holds more tokens than the model's vocab_size "
      << vocab_size;
  KVB_CHECK(vocab_size >= 3) << path << ": a llama2.c vocabulary needs <unk>, <s>, </s>";
  return std::make_unique<Llama2cTokenizer>(std::move(pieces), std::move(scores));
}

}  // namespace kvb::tokenizer
