// Tokenizer base-class behaviour and the helpers every vocabulary shares: the added-token
// splitter (leftmost-longest, as HF tokenizers' AddedVocabulary; control tokens only with
// parse_special, as llama.cpp's tokenizer_st_partition) and the end-of-generation token texts.
#include "workers/tokenizer/tokenizer.h"

#include <algorithm>

#include "common/error.h"
#include "workers/tokenizer/tokenizer_impl.h"

namespace kvb::tokenizer {

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) out += token_to_piece(id, skip_special);
  return out;
}

bool Tokenizer::is_end(int32_t id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}

void SpecialSplitter::add(const std::string& text, int32_t id, bool control) {
  KVB_CHECK(!text.empty()) << "added token " << id << " has empty text";
  if (!texts_.insert(text).second) return;  // the first id with this text wins
  // Keep each bucket ordered longest first (after equally long ones) so the first hit is longest.
  auto& bucket = by_byte_[static_cast<uint8_t>(text[0])];
  auto at = std::upper_bound(bucket.begin(), bucket.end(), text.size(),
                             [](size_t size, const Entry& e) { return size > e.text.size(); });
  bucket.insert(at, {text, id, control});
}

std::vector<SpecialSplitter::Piece> SpecialSplitter::split(std::string_view text,
                                                           bool parse_special) const {
  std::vector<Piece> pieces;
  size_t raw_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const Entry* hit = nullptr;
    for (const auto& e : by_byte_[static_cast<uint8_t>(text[pos])]) {
      if (e.control && !parse_special) continue;
      if (text.compare(pos, e.text.size(), e.text) == 0) {
        hit = &e;  // candidates are sorted longest first
        break;
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    if (pos > raw_start) pieces.push_back({-1, text.substr(raw_start, pos - raw_start)});
    pieces.push_back({hit->id, text.substr(pos, hit->text.size())});
    pos += hit->text.size();
    raw_start = pos;
  }
  if (raw_start < text.size()) pieces.push_back({-1, text.substr(raw_start)});
  return pieces;
}

bool is_end_of_generation_text(const std::string& text) {
  static const char* const kTexts[] = {"<|im_end|>",    "<|eot_id|>",    "<|eom_id|>", "<|end|>",
                                       "<end_of_turn>", "<|endoftext|>", "<EOT>",      "_<EOT>"};
  for (const char* t : kTexts) {
    if (text == t) return true;
  }
  return false;
}

void add_unique(std::vector<int32_t>& ids, int32_t id) {
  if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
}

}  // namespace kvb::tokenizer
