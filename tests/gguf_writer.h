// Minimal in-memory GGUF v2/v3 writer for tests (layout of ggml docs/gguf.md): metadata of every
// value type, tensors with raw block data laid out in order and padded to the alignment. It also
// records where each structural field lies, so fuzz tests can truncate or overwrite exactly there.
// Header-only; test code only (it trusts its caller and checks nothing).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

namespace kvb::testing {

class GgufWriter {
 public:
  // GGUF metadata value type ids (gguf.md gguf_metadata_value_type).
  enum VType : uint32_t {
    kU8 = 0,
    kI8 = 1,
    kU16 = 2,
    kI16 = 3,
    kU32 = 4,
    kI32 = 5,
    kF32 = 6,
    kBool = 7,
    kString = 8,
    kArray = 9,
    kU64 = 10,
    kI64 = 11,
    kF64 = 12
  };
  // What a recorded field holds; fuzzers overwrite kCount/kLength/kOffset/kDim (u64) and kType
  // (u32).
  enum class FieldKind {
    kMagic,
    kVersion,
    kCount,
    kLength,
    kType,
    kDim,
    kOffset,
    kBytes,
    kPadding
  };
  struct Field {
    FieldKind kind;
    uint64_t offset;  // absolute, in the output of bytes()
    uint64_t size;
  };

  explicit GgufWriter(uint32_t version = 3) : version_(version) {}

  // Sets general.alignment (written as a u32 KV) and uses it for the layout.
  void set_alignment(uint32_t alignment) {
    alignment_ = alignment;
    add_scalar<uint32_t>("general.alignment", kU32, alignment);
  }
  uint64_t alignment() const { return alignment_; }

  template <typename T>
  void add_scalar(const std::string& key, uint32_t type, T value) {
    begin_kv(key, type);
    put(kv_, &value, sizeof(value), FieldKind::kBytes);
  }
  void add_bool(const std::string& key, bool value) { add_scalar<uint8_t>(key, kBool, value); }
  void add_string(const std::string& key, const std::string& value) {
    begin_kv(key, kString);
    put_string(value);
  }
  template <typename T>
  void add_array(const std::string& key, uint32_t elem_type, const std::vector<T>& values) {
    begin_kv(key, kArray);
    put_u32(kv_, elem_type, FieldKind::kType);
    put_u64(kv_, values.size(), FieldKind::kLength);
    if (!values.empty()) put(kv_, values.data(), values.size() * sizeof(T), FieldKind::kBytes);
  }
  void add_string_array(const std::string& key, const std::vector<std::string>& values) {
    begin_kv(key, kArray);
    put_u32(kv_, kString, FieldKind::kType);
    put_u64(kv_, values.size(), FieldKind::kLength);
    for (const std::string& s : values) put_string(s);
  }
  // A KV with an arbitrary type id and payload (for malformed-file tests).
  void add_raw_kv(const std::string& key, uint32_t type, const std::vector<uint8_t>& payload) {
    begin_kv(key, type);
    if (!payload.empty()) put(kv_, payload.data(), payload.size(), FieldKind::kBytes);
  }

  // A tensor: dims in ggml order, raw bytes as stored. offset: by default the next aligned
  // position after the previous tensor; pass one to place it elsewhere (tests of bad offsets).
  void add_tensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type,
                  const std::vector<uint8_t>& data, int64_t offset = -1) {
    tensors_.push_back({name, dims, type, data, offset});
  }

  // Serializes the file; fields() then describes it. Tensor data offsets of tensors without an
  // explicit one are assigned in order; the returned offsets are relative to the data section.
  std::vector<uint8_t> bytes() {
    fields_.clear();
    std::vector<uint8_t> out;
    put(out, "GGUF", 4, FieldKind::kMagic);
    put_u32(out, version_, FieldKind::kVersion);
    put_u64(out, tensors_.size(), FieldKind::kCount);
    put_u64(out, num_kv_, FieldKind::kCount);
    const uint64_t kv_base = out.size();
    out.insert(out.end(), kv_.begin(), kv_.end());
    for (const Field& f : kv_fields_) fields_.push_back({f.kind, f.offset + kv_base, f.size});
    uint64_t next = 0;
    offsets_.clear();
    for (const Tensor& t : tensors_) {
      const uint64_t off = t.offset >= 0 ? static_cast<uint64_t>(t.offset) : next;
      offsets_.push_back(off);
      next = align(std::max(next, off + t.data.size()));
      put_u64(out, t.name.size(), FieldKind::kLength);
      put(out, t.name.data(), t.name.size(), FieldKind::kBytes);
      put_u32(out, static_cast<uint32_t>(t.dims.size()), FieldKind::kCount);
      for (uint64_t d : t.dims) put_u64(out, d, FieldKind::kDim);
      put_u32(out, t.type, FieldKind::kType);
      put_u64(out, off, FieldKind::kOffset);
    }
    pad(out);
    data_offset_ = out.size();
    for (size_t k = 0; k < tensors_.size(); ++k) {
      const Tensor& t = tensors_[k];
      if (out.size() < data_offset_ + offsets_[k]) out.resize(data_offset_ + offsets_[k], 0);
      if (out.size() < data_offset_ + offsets_[k] + t.data.size()) {
        out.resize(data_offset_ + offsets_[k] + t.data.size(), 0);
      }
      if (!t.data.empty()) {
        std::memcpy(out.data() + data_offset_ + offsets_[k], t.data.data(), t.data.size());
      }
      fields_.push_back({FieldKind::kBytes, data_offset_ + offsets_[k], t.data.size()});
      pad(out);
    }
    return out;
  }
  const std::vector<Field>& fields() const { return fields_; }
  const std::vector<uint64_t>& tensor_offsets() const { return offsets_; }  // after bytes()
  uint64_t data_offset() const { return data_offset_; }                     // after bytes()

  // Written beside the target and renamed over it: ctest runs a suite's tests as processes two at
  // a time, and one may load a shared fixture file while another rewrites it.
  static bool write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) return false;
    const bool ok = bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    if (std::fclose(f) != 0 || !ok) {
      std::remove(tmp.c_str());
      return false;
    }
    return std::rename(tmp.c_str(), path.c_str()) == 0;
  }

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::vector<uint8_t> data;
    int64_t offset;
  };
  uint64_t align(uint64_t x) const { return (x + alignment_ - 1) / alignment_ * alignment_; }
  void pad(std::vector<uint8_t>& out) {
    const uint64_t n = align(out.size()) - out.size();
    if (n) fields_.push_back({FieldKind::kPadding, out.size(), n});
    out.resize(out.size() + n, 0);
  }
  void put(std::vector<uint8_t>& out, const void* p, size_t n, FieldKind kind) {
    auto& fields = &out == &kv_ ? kv_fields_ : fields_;
    fields.push_back({kind, out.size(), n});
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  }
  void put_u32(std::vector<uint8_t>& out, uint32_t v, FieldKind kind) { put(out, &v, 4, kind); }
  void put_u64(std::vector<uint8_t>& out, uint64_t v, FieldKind kind) { put(out, &v, 8, kind); }
  void put_string(const std::string& s) {
    put_u64(kv_, s.size(), FieldKind::kLength);
    if (!s.empty()) put(kv_, s.data(), s.size(), FieldKind::kBytes);
  }
  void begin_kv(const std::string& key, uint32_t type) {
    ++num_kv_;
    put_string(key);
    put_u32(kv_, type, FieldKind::kType);
  }

  uint32_t version_;
  uint64_t alignment_ = 32;
  uint64_t num_kv_ = 0;
  std::vector<uint8_t> kv_;
  std::vector<Field> kv_fields_;
  std::vector<Tensor> tensors_;
  std::vector<Field> fields_;
  std::vector<uint64_t> offsets_;
  uint64_t data_offset_ = 0;
};

}  // namespace kvb::testing
