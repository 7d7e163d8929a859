// GGUF v2/v3 reader: header, metadata key/values, tensor infos, alignment, and tensor data
// dequantized to f32 (types F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K,
// Q5_K, Q6_K, IQ4_NL, IQ4_XS: kernels/cpu/dequant.h, which also holds the block-size table).
// Reference: ggml/docs/gguf.md and ggml-quants.c block layouts. Every size, offset and count is
// checked against the file before use; violations throw kvb::Error naming the file, offset or key.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace kvb::formats {

// ggml_type ids as stored in GGUF tensor infos.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kBF16 = 30,
};
const char* ggml_type_name(uint32_t type);  // "Q4_K", or "unknown" for ids we do not know
// A metadata key or tensor name from a file, for messages: in single quotes, control bytes escaped
// as \xNN, cut after 96 bytes.
std::string quoted_name(const std::string& s);

// One metadata value. Arrays hold scalars of one type (nested arrays are rejected as unsupported).
struct GgufValue {
  enum class Type : uint32_t {
    kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
    kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12
  };
  Type type = Type::kU8;
  Type elem_type = Type::kU8;  // for arrays
  // Scalars: integers (incl. bool) in i and u (the same bits: i for signed types, u for unsigned;
  // a u64 above INT64_MAX reads as negative in i), floats in f, strings in s.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string s;
  // Arrays: one of these is filled according to elem_type: integers and bools in arr_i (u64
  // elements bit-cast), f32/f64 in arr_f, strings in arr_s.
  std::vector<int64_t> arr_i;
  std::vector<double> arr_f;
  std::vector<std::string> arr_s;
  size_t arr_len = 0;
};
const char* gguf_value_type_name(GgufValue::Type type);  // "u32", "string", "array", ...

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // ggml order: dims[0] is the fastest-varying (row length)
  uint32_t type = 0;
  uint64_t offset = 0;         // relative to the start of the data section
  uint64_t num_elements = 0;
  uint64_t num_bytes = 0;      // on disk
};

class GgufFile {
 public:
  // Opens and validates the header, metadata and tensor infos (tensor data is read lazily).
  // Throws kvb::Error on any malformed, truncated or unsupported content.
  static std::unique_ptr<GgufFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute offset of the data section
  uint64_t file_size() const { return file_size_; }

  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  const GgufValue& get(const std::string& key) const;  // throws naming the key if absent
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }

  // Typed accessors: throw naming the key and the expected type if absent or of the wrong type.
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;          // any integer type (and bool)
  bool get_bool(const std::string& key) const;            // bool only
  bool get_bool_or(const std::string& key, bool def) const;
  double get_float(const std::string& key) const;         // f32/f64 (and integers)
  int64_t get_int_or(const std::string& key, int64_t def) const;
  double get_float_or(const std::string& key, double def) const;
  std::string get_string_or(const std::string& key, const std::string& def) const;
  const std::vector<std::string>& get_string_array(const std::string& key) const;
  const std::vector<int64_t>& get_int_array(const std::string& key) const;  // integer/bool elems
  const std::vector<double>& get_float_array(const std::string& key) const;  // f32/f64 elems

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;  // nullptr if absent

  // Reads a tensor and dequantizes it to f32 in ggml element order (row-major with dims[0]
  // fastest). Throws if the tensor is absent (naming it) or its type is unsupported.
  std::vector<float> load_f32(const std::string& name) const;
  // Same, checking the shape first: expected dims in ggml order.
  std::vector<float> load_f32(const std::string& name, const std::vector<uint64_t>& dims) const;
  // Raw bytes of a tensor as stored (for hashing, tests and the native weights).
  std::vector<uint8_t> load_raw(const std::string& name) const;
  // Bytes [first, first + count) of the tensor's data; throws when the range leaves it.
  // Every load refuses a tensor with a non-finite element (F32, F16, BF16) or block scale
  // (kernels/cpu/dequant.h first_nonfinite_block), naming the tensor and the block; a range that
  // is not whole blocks is not checked.
  std::vector<uint8_t> load_raw(const std::string& name, uint64_t first, uint64_t count) const;

 private:
  void parse();  // fills everything below from path_; the parser lives in gguf.cc
  const GgufTensorInfo& tensor_or_throw(const std::string& name) const;
  // Reads n bytes at the absolute file offset `offset` into dst (reopens the file by path).
  void read_at(uint64_t offset, void* dst, uint64_t n) const;
  // Throws when bytes [first, first + count) of tensor ti, at data, hold a non-finite element or
  // block scale (whole blocks only).
  void check_finite(const GgufTensorInfo& ti, const void* data, uint64_t first,
                    uint64_t count) const;

  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace kvb::formats
