// GGUF v2/v3 reader (ggml docs/gguf.md): header, metadata, tensor infos and lazily read tensor
// data. The file is untrusted input: every count, length, type id, shape and offset is checked
// against the file size before it is used to allocate or seek, so a malformed file throws
// kvb::Error (naming the path, the byte offset or key/tensor, and what was expected) instead of
// crashing or allocating absurd amounts of memory.
#include "workers/formats/gguf.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "common/error.h"
#include "kernels/cpu/dequant.h"
#include "kernels/formats/file_io.h"

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host");

namespace kvb::formats {
namespace {

constexpr uint32_t kMagic = 0x46554747;     // "GGUF" read as a little-endian u32
constexpr uint64_t kMaxKeyLen = 65535;      // gguf.md: keys are at most 2^16-1 bytes
constexpr uint64_t kMaxTensorNameLen = 64;  // gguf.md: tensor names are at most 64 bytes
constexpr uint32_t kMaxDims = 4;            // GGML_MAX_DIMS
// Smallest possible encodings, used to bound counts before anything is allocated.
// A KV: key length, value type, a u8 value. A tensor info: name length, n_dims, one dim, type,
// offset.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
constexpr size_t kReadChunk = size_t{1} << 16;
constexpr uint64_t kMaxReserve = uint64_t{1} << 16;  // elements reserved ahead of reading them

// Sequential, buffered, bounds-checked reader of the header region.
class Reader {
 public:
  Reader(int fd, const std::string& path, uint64_t size) : fd_(fd), path_(path), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  // Copies n bytes or throws naming what was being read and where.
  void read(void* dst, uint64_t n, const std::string& what) {
    KVB_CHECK(n <= remaining()) << path_ << ": truncated at offset " << pos_ << " while reading "
                                << what << " (" << n << " bytes expected, " << remaining()
                                << " left in a " << size_ << "-byte file)";
    auto* out = static_cast<uint8_t*>(dst);
    while (n > 0) {
      if (pos_ >= buf_start_ + buf_.size() || pos_ < buf_start_) fill();
      const uint64_t in_buf = buf_start_ + buf_.size() - pos_;
      const uint64_t take = std::min(n, in_buf);
      std::memcpy(out, buf_.data() + (pos_ - buf_start_), take);
      out += take;
      pos_ += take;
      n -= take;
    }
  }
  template <typename T>
  T read_le(const std::string& what) {
    T v;
    read(&v, sizeof(v), what);
    return v;
  }
  // gguf_string: u64 length, then that many bytes (no terminator).
  std::string read_string(const std::string& what, uint64_t max_len) {
    const uint64_t at = pos_;
    const uint64_t len = read_le<uint64_t>(what + " length");
    KVB_CHECK(len <= max_len) << path_ << ": " << what << " at offset " << at << " has length "
                              << len << ", expected at most " << max_len;
    KVB_CHECK(len <= remaining()) << path_ << ": " << what << " at offset " << at << " has length "
                                  << len << " but only " << remaining()
                                  << " bytes remain in the file";
    std::string s(static_cast<size_t>(len), '\0');
    read(s.data(), len, what);
    return s;
  }

 private:
  void fill() {
    buf_start_ = pos_;
    buf_.resize(static_cast<size_t>(std::min<uint64_t>(kReadChunk, size_ - pos_)));
    pread_fully(fd_, path_, buf_start_, buf_.data(), buf_.size());
  }
  int fd_;
  const std::string& path_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t buf_start_ = 0;
  std::vector<uint8_t> buf_;
};

using VType = GgufValue::Type;

// Encoded size of a scalar value type; 0 for string and array (variable length).
uint64_t scalar_size(VType t) {
  switch (t) {
    case VType::kU8:
    case VType::kI8:
    case VType::kBool:
      return 1;
    case VType::kU16:
    case VType::kI16:
      return 2;
    case VType::kU32:
    case VType::kI32:
    case VType::kF32:
      return 4;
    case VType::kU64:
    case VType::kI64:
    case VType::kF64:
      return 8;
    default:
      return 0;
  }
}
bool is_integer(VType t) {
  return t == VType::kU8 || t == VType::kI8 || t == VType::kU16 || t == VType::kI16 ||
         t == VType::kU32 || t == VType::kI32 || t == VType::kU64 || t == VType::kI64;
}
bool is_float(VType t) { return t == VType::kF32 || t == VType::kF64; }

// Decodes one scalar of type t from its little-endian bytes into v's i/u (integers, bool) or f.
void decode_scalar(VType t, const uint8_t* p, GgufValue* v) {
  auto load = [p](auto x) {
    std::memcpy(&x, p, sizeof(x));
    return x;
  };
  auto set_unsigned = [v](uint64_t x) {
    v->u = x;
    v->i = static_cast<int64_t>(x);
  };
  auto set_signed = [v](int64_t x) {
    v->i = x;
    v->u = static_cast<uint64_t>(x);
  };
  switch (t) {
    case VType::kU8:
    case VType::kBool:
      return set_unsigned(load(uint8_t{}));
    case VType::kU16:
      return set_unsigned(load(uint16_t{}));
    case VType::kU32:
      return set_unsigned(load(uint32_t{}));
    case VType::kU64:
      return set_unsigned(load(uint64_t{}));
    case VType::kI8:
      return set_signed(load(int8_t{}));
    case VType::kI16:
      return set_signed(load(int16_t{}));
    case VType::kI32:
      return set_signed(load(int32_t{}));
    case VType::kI64:
      return set_signed(load(int64_t{}));
    case VType::kF32:
      v->f = load(float{});
      return;
    case VType::kF64:
      v->f = load(double{});
      return;
    default:
      return;
  }
}

// A key or tensor name for messages: quoted, control bytes escaped, long names cut short.
std::string quoted(const std::string& s) {
  constexpr size_t kMaxShown = 96;
  std::string out = "'";
  for (size_t k = 0; k < s.size() && k < kMaxShown; ++k) {
    const auto c = static_cast<unsigned char>(s[k]);
    if (c < 0x20 || c == 0x7F || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > kMaxShown) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out + "'";
}

}  // namespace

std::string quoted_name(const std::string& s) { return quoted(s); }

namespace {

std::string dims_str(const std::vector<uint64_t>& dims) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < dims.size(); ++i) os << (i ? ", " : "") << dims[i];
  os << "]";
  return os.str();
}

// How a tensor's byte size follows from its type (for size errors): "(Q5_0: 96 elements = 3
// blocks of 22 bytes)". Only called for tensors whose type has block info.
std::string size_str(const GgufTensorInfo& ti) {
  size_t block_bytes = 0, block_elems = 1;
  kernels::cpu::ggml_block_info(ti.type, &block_bytes, &block_elems);
  std::ostringstream os;
  os << "(" << ggml_type_name(ti.type) << ": " << ti.num_elements
     << " elements = " << ti.num_elements / block_elems << " blocks of " << block_bytes
     << " bytes)";
  return os.str();
}

// Reads one metadata value of type `type_id` for `key` (whose entry starts at key_off).
GgufValue read_value(Reader& r, const std::string& path, const std::string& key, uint64_t key_off,
                     uint32_t type_id) {
  const uint64_t type_off = r.pos() - 4;
  KVB_CHECK(type_id <= static_cast<uint32_t>(VType::kF64))
      << path << ": metadata key " << quoted(key) << " (entry at offset " << key_off
      << ") has unknown value type id " << type_id << " at offset " << type_off
      << ", expected 0..12";
  GgufValue v;
  v.type = static_cast<VType>(type_id);
  const std::string what = "value of metadata key " + quoted(key);
  if (v.type == VType::kString) {
    v.s = r.read_string(what, r.remaining());
    return v;
  }
  if (v.type != VType::kArray) {
    uint8_t buf[8];
    r.read(buf, scalar_size(v.type), what);
    decode_scalar(v.type, buf, &v);
    KVB_CHECK(v.type != VType::kBool || v.u <= 1)
        << path << ": bool " << what << " at offset " << (r.pos() - 1) << " is " << v.u
        << ", expected 0 or 1";
    return v;
  }
  const uint64_t elem_off = r.pos();
  const uint32_t elem_id = r.read_le<uint32_t>("element type of array " + what);
  KVB_CHECK(elem_id <= static_cast<uint32_t>(VType::kF64))
      << path << ": metadata key " << quoted(key) << " is an array with unknown element type id "
      << elem_id << " at offset " << elem_off << ", expected 0..12";
  v.elem_type = static_cast<VType>(elem_id);
  KVB_CHECK(v.elem_type != VType::kArray)
      << path << ": metadata key " << quoted(key) << " at offset " << key_off
      << " is a nested array, which is not supported (expected an array of scalars or strings)";
  const uint64_t len_off = r.pos();
  const uint64_t len = r.read_le<uint64_t>("length of array " + what);
  // Strings take at least their 8-byte length; bound the count before allocating.
  const uint64_t min_elem = v.elem_type == VType::kString ? 8 : scalar_size(v.elem_type);
  KVB_CHECK(len <= r.remaining() / min_elem)
      << path << ": metadata key " << quoted(key) << ": array length " << len << " at offset "
      << len_off << " needs at least " << min_elem << " bytes per element but only "
      << r.remaining() << " bytes remain in the file";
  v.arr_len = static_cast<size_t>(len);
  // Vectors grow as bytes are actually consumed, so a lying length cannot reserve more than
  // kMaxReserve elements up front; total memory stays proportional to the file size.
  const size_t reserve = static_cast<size_t>(std::min<uint64_t>(len, kMaxReserve));
  if (v.elem_type == VType::kString) {
    v.arr_s.reserve(reserve);
    for (uint64_t k = 0; k < len; ++k) {
      v.arr_s.push_back(r.read_string(what + " element " + std::to_string(k), r.remaining()));
    }
    return v;
  }
  const bool floats = is_float(v.elem_type);
  if (floats) {
    v.arr_f.reserve(reserve);
  } else {
    v.arr_i.reserve(reserve);
  }
  const uint64_t esize = scalar_size(v.elem_type);
  constexpr uint64_t kChunkElems = 4096;
  uint8_t chunk[kChunkElems * 8];
  GgufValue tmp;
  for (uint64_t k0 = 0; k0 < len; k0 += kChunkElems) {
    const uint64_t n = std::min(kChunkElems, len - k0);
    r.read(chunk, n * esize, what);
    for (uint64_t k = 0; k < n; ++k) {
      decode_scalar(v.elem_type, chunk + k * esize, &tmp);
      if (floats) {
        v.arr_f.push_back(tmp.f);
      } else {
        KVB_CHECK(v.elem_type != VType::kBool || tmp.u <= 1)
            << path << ": bool array " << what << " element " << (k0 + k) << " is " << tmp.u
            << ", expected 0 or 1";
        v.arr_i.push_back(tmp.i);
      }
    }
  }
  return v;
}

}  // namespace

const char* ggml_type_name(uint32_t type) { return kernels::cpu::ggml_type_name(type); }

const char* gguf_value_type_name(GgufValue::Type type) {
  static constexpr const char* kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                           "bool", "string", "array", "u64", "i64", "f64"};
  const auto t = static_cast<uint32_t>(type);
  return t < sizeof(kNames) / sizeof(kNames[0]) ? kNames[t] : "unknown";
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->parse();
  return f;
}

void GgufFile::parse() {
  const std::string& path = path_;
  Fd fd;
  file_size_ = open_regular(path, "GGUF", &fd);
  Reader r(fd.fd, path, file_size_);

  // ---- header: magic, version, counts
  KVB_CHECK(file_size_ >= 4)
      << path << ": file is " << file_size_
      << " bytes, too short for the GGUF magic (expected 'GGUF' at offset 0)";
  const uint32_t magic = r.read_le<uint32_t>("magic");
  KVB_CHECK(magic == kMagic) << path << ": bad magic 0x" << std::hex << magic << std::dec
                             << " at offset 0 (expected 'GGUF', 0x46554747); not a GGUF file";
  version_ = r.read_le<uint32_t>("version");
  KVB_CHECK(version_ != 0x02000000u && version_ != 0x03000000u)
      << path << ": GGUF version field at offset 4 reads " << version_
      << ", which looks like a big-endian GGUF file; only little-endian files are supported";
  KVB_CHECK(version_ == 2 || version_ == 3)
      << path << ": unsupported GGUF version " << version_
      << " at offset 4 (expected 2 or 3; version 1 used 32-bit counts and is not supported)";
  const uint64_t n_tensors = r.read_le<uint64_t>("tensor_count");
  const uint64_t n_kv = r.read_le<uint64_t>("metadata_kv_count");
  KVB_CHECK(n_kv <= r.remaining() / kMinKvBytes)
      << path << ": metadata_kv_count " << n_kv << " at offset 16 is impossible: each entry needs "
      << "at least " << kMinKvBytes << " bytes and only " << r.remaining() << " remain";
  KVB_CHECK(n_tensors <= r.remaining() / kMinTensorInfoBytes)
      << path << ": tensor_count " << n_tensors << " at offset 8 is impossible: each tensor info "
      << "needs at least " << kMinTensorInfoBytes << " bytes and only " << r.remaining()
      << " remain";

  // ---- metadata key/values
  for (uint64_t k = 0; k < n_kv; ++k) {
    const uint64_t key_off = r.pos();
    std::string key = r.read_string("metadata key #" + std::to_string(k), kMaxKeyLen);
    KVB_CHECK(!key.empty()) << path << ": metadata key #" << k << " at offset " << key_off
                            << " is empty (expected a non-empty key)";
    const uint32_t type_id = r.read_le<uint32_t>("value type of metadata key " + quoted(key));
    GgufValue v = read_value(r, path, key, key_off, type_id);
    KVB_CHECK(kv_.count(key) == 0) << path << ": duplicate metadata key " << quoted(key)
                                   << " at offset " << key_off << " (keys must be unique)";
    kv_.emplace(std::move(key), std::move(v));
  }
  alignment_ = 32;  // gguf.md GGUF_DEFAULT_ALIGNMENT
  if (auto it = kv_.find("general.alignment"); it != kv_.end()) {
    KVB_CHECK(it->second.type == VType::kU32)
        << path << ": metadata key 'general.alignment' has type "
        << gguf_value_type_name(it->second.type) << ", expected u32";
    const uint64_t a = it->second.u;
    KVB_CHECK(a > 0 && (a & (a - 1)) == 0)
        << path << ": general.alignment is " << a << ", expected a power of two > 0";
    alignment_ = a;
  }

  // ---- tensor infos
  tensors_.reserve(static_cast<size_t>(std::min(n_tensors, kMaxReserve)));
  for (uint64_t t = 0; t < n_tensors; ++t) {
    const uint64_t info_off = r.pos();
    GgufTensorInfo ti;
    ti.name = r.read_string("name of tensor #" + std::to_string(t), kMaxTensorNameLen);
    const std::string who =
        "tensor " + quoted(ti.name) + " (info at offset " + std::to_string(info_off) + ")";
    const uint32_t n_dims = r.read_le<uint32_t>("n_dimensions of " + who);
    KVB_CHECK(n_dims >= 1 && n_dims <= kMaxDims)
        << path << ": " << who << " has " << n_dims << " dimensions, expected 1.." << kMaxDims;
    ti.dims.resize(n_dims);
    ti.num_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      ti.dims[d] = r.read_le<uint64_t>("dimensions of " + who);
      KVB_CHECK(ti.dims[d] > 0 && ti.dims[d] <= static_cast<uint64_t>(INT64_MAX))
          << path << ": " << who << " dimension " << d << " is " << ti.dims[d]
          << ", expected 1..INT64_MAX";
      KVB_CHECK(!__builtin_mul_overflow(ti.num_elements, ti.dims[d], &ti.num_elements) &&
                ti.num_elements <= static_cast<uint64_t>(INT64_MAX))
          << path << ": " << who << " shape " << dims_str(ti.dims) << " overflows 63 bits";
    }
    const uint64_t type_off = r.pos();
    ti.type = r.read_le<uint32_t>("type of " + who);
    size_t block_bytes = 0, block_elems = 0;
    KVB_CHECK(kernels::cpu::ggml_block_info(ti.type, &block_bytes, &block_elems))
        << path << ": " << who << " has ggml type id " << ti.type << " (" << ggml_type_name(ti.type)
        << ") at offset " << type_off
        << ", which is not supported; expected one of: " << kernels::cpu::supported_type_names();
    KVB_CHECK(ti.dims[0] % block_elems == 0)
        << path << ": " << who << " of type " << ggml_type_name(ti.type) << " has row length "
        << ti.dims[0] << ", expected a multiple of the block size " << block_elems;
    KVB_CHECK(!__builtin_mul_overflow(ti.num_elements / block_elems, block_bytes, &ti.num_bytes))
        << path << ": " << who << " byte size overflows 64 bits";
    ti.offset = r.read_le<uint64_t>("data offset of " + who);
    KVB_CHECK(tensor_index_.count(ti.name) == 0)
        << path << ": duplicate tensor name " << quoted(ti.name) << " at offset " << info_off;
    tensor_index_.emplace(ti.name, tensors_.size());
    tensors_.push_back(std::move(ti));
  }

  // ---- data section: starts at the next multiple of the alignment
  data_offset_ = (r.pos() + alignment_ - 1) / alignment_ * alignment_;  // no overflow: pos <= size
  for (const GgufTensorInfo& ti : tensors_) {
    KVB_CHECK(ti.offset % alignment_ == 0)
        << path << ": tensor " << quoted(ti.name) << " data offset " << ti.offset
        << " is not aligned, expected a multiple of " << alignment_;
    KVB_CHECK(data_offset_ <= file_size_ && ti.offset <= file_size_ - data_offset_ &&
              ti.num_bytes <= file_size_ - data_offset_ - ti.offset)
        << path << ": tensor " << quoted(ti.name) << " data [" << ti.offset << ", +" << ti.num_bytes
        << ") " << size_str(ti) << " relative to the data section at " << data_offset_
        << " extends past the end of the file (" << file_size_ << " bytes)";
  }
  std::vector<const GgufTensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const GgufTensorInfo& ti : tensors_) by_offset.push_back(&ti);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const GgufTensorInfo& a = *by_offset[k - 1];
    const GgufTensorInfo& b = *by_offset[k];
    KVB_CHECK(a.offset + a.num_bytes <= b.offset)  // no overflow: both lie inside the file
        << path << ": tensors " << quoted(a.name) << " [" << a.offset << ", "
        << a.offset + a.num_bytes << ") and " << quoted(b.name) << " [" << b.offset << ", "
        << b.offset + b.num_bytes << ") overlap in the data section; " << quoted(a.name) << " "
        << size_str(a);
  }
}

// ---- metadata accessors

namespace {
[[noreturn]] void wrong_type(const std::string& path, const std::string& key, const GgufValue& v,
                             const char* expected) {
  std::string found = gguf_value_type_name(v.type);
  if (v.type == VType::kArray) found += std::string(" of ") + gguf_value_type_name(v.elem_type);
  KVB_FAIL() << path << ": metadata key " << quoted(key) << " has type " << found << ", expected "
             << expected;
  __builtin_unreachable();
}
}  // namespace

const GgufValue& GgufFile::get(const std::string& key) const {
  auto it = kv_.find(key);
  KVB_CHECK(it != kv_.end()) << path_ << ": metadata key " << quoted(key) << " not found";
  return it->second;
}

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type != VType::kString) wrong_type(path_, key, v, "string");
  return v.s;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = get(key);
  if (!is_integer(v.type) && v.type != VType::kBool) wrong_type(path_, key, v, "an integer");
  KVB_CHECK(v.type != VType::kU64 || v.u <= static_cast<uint64_t>(INT64_MAX))
      << path_ << ": metadata key " << quoted(key) << " is the u64 " << v.u
      << ", expected a value that fits in i64";
  return v.i;
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type != VType::kBool) wrong_type(path_, key, v, "bool");
  return v.u != 0;
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = get(key);
  if (is_float(v.type)) return v.f;
  if (v.type == VType::kU64) return static_cast<double>(v.u);
  if (is_integer(v.type)) return static_cast<double>(v.i);
  wrong_type(path_, key, v, "f32, f64 or an integer");
}

int64_t GgufFile::get_int_or(const std::string& key, int64_t def) const {
  return has(key) ? get_int(key) : def;
}
bool GgufFile::get_bool_or(const std::string& key, bool def) const {
  return has(key) ? get_bool(key) : def;
}
double GgufFile::get_float_or(const std::string& key, double def) const {
  return has(key) ? get_float(key) : def;
}
std::string GgufFile::get_string_or(const std::string& key, const std::string& def) const {
  return has(key) ? get_string(key) : def;
}

const std::vector<std::string>& GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type != VType::kArray || v.elem_type != VType::kString) {
    wrong_type(path_, key, v, "array of string");
  }
  return v.arr_s;
}

const std::vector<int64_t>& GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type != VType::kArray || !(is_integer(v.elem_type) || v.elem_type == VType::kBool)) {
    wrong_type(path_, key, v, "array of integers");
  }
  if (v.elem_type == VType::kU64) {
    for (size_t k = 0; k < v.arr_i.size(); ++k) {
      KVB_CHECK(v.arr_i[k] >= 0) << path_ << ": metadata key " << quoted(key) << " element " << k
                                 << " is a u64 above INT64_MAX, expected a value that fits in i64";
    }
  }
  return v.arr_i;
}

const std::vector<double>& GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type != VType::kArray || !is_float(v.elem_type)) {
    wrong_type(path_, key, v, "array of f32 or f64");
  }
  return v.arr_f;
}

// ---- tensors

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::tensor_or_throw(const std::string& name) const {
  const GgufTensorInfo* ti = find_tensor(name);
  KVB_CHECK(ti != nullptr) << path_ << ": no tensor named " << quoted(name) << " (the file has "
                           << tensors_.size() << " tensors)";
  return *ti;
}

void GgufFile::read_at(uint64_t offset, void* dst, uint64_t n) const {
  Fd fd;
  const uint64_t size = open_regular(path_, "GGUF", &fd);
  KVB_CHECK(size == file_size_) << path_ << ": file size changed from " << file_size_ << " to "
                                << size << " bytes since it was opened";
  pread_fully(fd.fd, path_, offset, dst, n);
}

void GgufFile::check_finite(const GgufTensorInfo& ti, const void* data, uint64_t first,
                            uint64_t count) const {
  size_t block_bytes = 0, block_elems = 0;
  if (!kernels::cpu::ggml_block_info(ti.type, &block_bytes, &block_elems)) return;
  if (first % block_bytes != 0 || count % block_bytes != 0) return;  // not whole blocks
  const int64_t bad =
      kernels::cpu::first_nonfinite_block(ti.type, data, count / block_bytes * block_elems);
  if (bad < 0) return;
  const uint64_t block = first / block_bytes + static_cast<uint64_t>(bad);
  const char* fix = "the file is damaged or was written wrong; download or convert it again";
  if (block_elems == 1) {  // F32, F16, BF16: the element and its value
    float v = 0;
    kernels::cpu::dequantize(ti.type, static_cast<const uint8_t*>(data) + bad * block_bytes, &v,
                             1);
    KVB_FAIL() << path_ << ": tensor " << quoted(ti.name) << " ("
               << kernels::cpu::ggml_type_name(ti.type) << "): " << ti.name << "[" << block
               << "] = " << v << " is not a finite number; " << fix;
  }
  KVB_FAIL() << path_ << ": tensor " << quoted(ti.name) << " ("
             << kernels::cpu::ggml_type_name(ti.type) << ") block " << block << " (elements "
             << block * block_elems << ".." << (block + 1) * block_elems - 1
             << ") has a scale that is not a finite number (NaN or Inf): " << fix;
}

std::vector<uint8_t> GgufFile::load_raw(const std::string& name) const {
  return load_raw(name, 0, tensor_or_throw(name).num_bytes);  // bounds checked at open
}

std::vector<uint8_t> GgufFile::load_raw(const std::string& name, uint64_t first,
                                        uint64_t count) const {
  const GgufTensorInfo& ti = tensor_or_throw(name);
  KVB_CHECK(first <= ti.num_bytes && count <= ti.num_bytes - first)
      << path_ << ": bytes [" << first << ", " << first + count << ") of tensor " << quoted(name)
      << " leave its " << ti.num_bytes << " bytes";
  std::vector<uint8_t> raw(static_cast<size_t>(count));
  read_at(data_offset_ + ti.offset + first, raw.data(), count);
  check_finite(ti, raw.data(), first, count);
  return raw;
}

std::vector<float> GgufFile::load_f32(const std::string& name) const {
  const GgufTensorInfo& ti = tensor_or_throw(name);
  std::vector<float> out(static_cast<size_t>(ti.num_elements));
  if (ti.type == static_cast<uint32_t>(GgmlType::kF32)) {
    read_at(data_offset_ + ti.offset, out.data(), ti.num_bytes);
    check_finite(ti, out.data(), 0, ti.num_bytes);
    return out;
  }
  const std::vector<uint8_t> raw = load_raw(name);
  kernels::cpu::dequantize(ti.type, raw.data(), out.data(), out.size());
  return out;
}

std::vector<float> GgufFile::load_f32(const std::string& name,
                                      const std::vector<uint64_t>& dims) const {
  const GgufTensorInfo& ti = tensor_or_throw(name);
  KVB_CHECK(ti.dims == dims) << path_ << ": tensor " << quoted(name) << " has shape "
                             << dims_str(ti.dims) << " (ggml order), expected " << dims_str(dims);
  return load_f32(name);
}

}  // namespace kvb::formats
