// Minimal GGUF v3 writer for tests: metadata key/values only, zero tensors (ggml/docs/gguf.md:
// magic "GGUF", u32 version, u64 tensor count, u64 kv count, then key, u32 type, value; strings
// are u64 length + bytes; arrays are u32 element type + u64 count + elements), padded to 32.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace kvb::testing {

class GgufMetadataWriter {
 public:
  void add_string(const std::string& key, const std::string& v) {
    head(key, kString);
    str(v);
  }
  void add_u32(const std::string& key, uint32_t v) {
    head(key, kU32);
    pod(v);
  }
  void add_i32(const std::string& key, int32_t v) {
    head(key, kI32);
    pod(v);
  }
  void add_bool(const std::string& key, bool v) {
    head(key, kBool);
    pod(static_cast<uint8_t>(v));
  }
  void add_string_array(const std::string& key, const std::vector<std::string>& v) {
    head(key, kArray);
    pod(kString);
    pod(static_cast<uint64_t>(v.size()));
    for (const auto& s : v) str(s);
  }
  void add_i32_array(const std::string& key, const std::vector<int32_t>& v) { array(key, kI32, v); }
  void add_f32_array(const std::string& key, const std::vector<float>& v) { array(key, kF32, v); }

  // Writes the file; returns false if it cannot be written.
  bool write(const std::string& path) const {
    std::string out = "GGUF";
    append(out, uint32_t{3});
    append(out, uint64_t{0});  // tensors
    append(out, count_);
    out += body_;
    out.resize((out.size() + 31) / 32 * 32, '\0');  // data section alignment
    std::ofstream f(path, std::ios::binary);
    f.write(out.data(), static_cast<std::streamsize>(out.size()));
    return f.good();
  }

 private:
  static constexpr uint32_t kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9;
  template <typename T>
  static void append(std::string& s, T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    s.append(b, sizeof(T));
  }
  template <typename T>
  void pod(T v) {
    append(body_, v);
  }
  void str(const std::string& s) {
    pod(static_cast<uint64_t>(s.size()));
    body_ += s;
  }
  void head(const std::string& key, uint32_t type) {
    ++count_;
    str(key);
    pod(type);
  }
  template <typename T>
  void array(const std::string& key, uint32_t elem, const std::vector<T>& v) {
    head(key, kArray);
    pod(elem);
    pod(static_cast<uint64_t>(v.size()));
    for (T x : v) pod(x);
  }
  std::string body_;
  uint64_t count_ = 0;
};

}  // namespace kvb::testing
