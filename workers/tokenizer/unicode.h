// Unicode helpers for the tokenizers: UTF-8 stepping and encoding, GPT-2's byte <-> printable
// code point table (openai/gpt-2 encoder.py bytes_to_unicode), and NFC normalization (UAX #15)
// for tokenizer.json files whose normalizer is NFC (Qwen2/3).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvb::tokenizer::unicode {

// Length of the UTF-8 sequence introduced by `lead` (1 for ASCII and for stray continuation
// bytes, as llama.cpp's unicode_len_utf8 does).
size_t utf8_len(uint8_t lead);
// Decodes the code point at s[pos]; advances pos. Malformed sequences yield U+FFFD and consume
// one byte.
uint32_t next_codepoint(std::string_view s, size_t& pos);
void append_utf8(std::string& out, uint32_t cp);

// GPT-2 byte-level alphabet: every byte maps to one printable code point (its UTF-8 text here).
const std::array<std::string, 256>& byte_to_unicode();
// Inverse: the byte that a code point stands for, or -1 if the code point is not in the table.
int unicode_to_byte(uint32_t cp);
// Maps every byte of `text` through byte_to_unicode().
std::string bytes_to_unicode_text(std::string_view text);
// Inverse of bytes_to_unicode_text; code points outside the table are copied as UTF-8.
std::string unicode_text_to_bytes(std::string_view text);

// Canonical composition normal form.
std::string nfc(std::string_view text);

namespace detail {
struct CccRange {
  uint32_t first, last, ccc;
};
struct Decomposition {
  uint32_t cp, first, second;  // second == 0 for singleton decompositions
  uint32_t composes;           // 1 if (first, second) recomposes to cp under NFC
};
extern const CccRange kCccRanges[];
extern const size_t kNumCccRanges;
extern const Decomposition kDecompositions[];
extern const size_t kNumDecompositions;
}  // namespace detail

}  // namespace kvb::tokenizer::unicode
