// SHA-256 (FIPS 180-4; the test vectors are those of FIPS 180-2 appendix B). Used for unit keys
// (DESIGN.md "Work unit and its key"), config hashes and model-file hashes. Self-contained: no
// crypto library, since the hash only identifies content and needs no side-channel hardening.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvb {

// Streaming hasher: update() any number of times, then digest() once (further calls are an
// internal error).
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t len);
  void update(std::string_view s) { update(s.data(), s.size()); }
  std::array<uint8_t, 32> digest();
  std::string hex_digest();  // 64 lowercase hex characters

 private:
  void compress(const uint8_t* block);  // block: 64 bytes

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_;
  size_t buffered_ = 0;     // bytes waiting in buffer_
  uint64_t total_len_ = 0;  // message length so far, bytes
  bool finished_ = false;
};

// Lowercase hex SHA-256 of a string.
std::string sha256_hex(std::string_view data);
// Lowercase hex SHA-256 of a file's bytes, read in chunks; throws kvb::Error naming the file when
// it cannot be opened or read.
std::string sha256_file(const std::string& path);

}  // namespace kvb
