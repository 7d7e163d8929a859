// safetensors reader and checkpoint-folder weight set (kernels/formats/safetensors.h). The rules
// are the reference implementation's (safetensors/src/tensor.rs: header size limit, offsets
// ordered, contiguous and covering the data section, byte size = elements * dtype size).
#include "kernels/formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "kernels/cpu/dequant.h"
#include "kernels/formats/file_io.h"

namespace kvb::formats {
namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // safetensors' MAX_HEADER_SIZE
constexpr uint64_t kMaxDims = 8;
constexpr uint64_t kMaxIndexBytes = 64ull << 20;
constexpr size_t kChunkElems = size_t{1} << 20;  // f16/bf16 conversion buffer: 2 MiB

std::string shape_str(const std::vector<uint64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

// A non-negative JSON integer (nlohmann parses those as unsigned).
bool json_u64(const json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<uint64_t>();
  return true;
}

}  // namespace

uint64_t safetensors_dtype_bytes(const std::string& d) {
  static const std::map<std::string, uint64_t> kBytes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = kBytes.find(d);
  return it == kBytes.end() ? 0 : it->second;
}

bool safetensors_dtype_convertible(const std::string& d) {
  return d == "F32" || d == "F16" || d == "BF16";
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->parse();
  return f;
}

void SafetensorsFile::parse() {
  const std::string& path = path_;
  Fd fd;
  file_size_ = open_regular(path, "safetensors", &fd);
  KVB_CHECK(file_size_ >= 8) << path << ": file is " << file_size_
                             << " bytes, too short for the 8-byte header length";
  uint8_t len_bytes[8];
  pread_fully(fd.fd, path, 0, len_bytes, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];  // little-endian
  KVB_CHECK(n <= file_size_ - 8) << path << ": header length " << n
                                 << " (bytes 0-7) runs past the end of the file (" << file_size_
                                 << " bytes); the file is truncated or not safetensors";
  KVB_CHECK(n <= kMaxHeaderBytes) << path << ": header length " << n << " exceeds the format's "
                                  << "limit of " << kMaxHeaderBytes << " bytes";
  KVB_CHECK(n >= 2) << path << ": header length " << n << " is too short for a JSON object";
  data_offset_ = 8 + n;
  const uint64_t data_len = file_size_ - data_offset_;
  std::string text(n, '\0');
  pread_fully(fd.fd, path, 8, text.data(), n);
  json header;
  // The format nests three levels ({name: {dtype, shape: [dims], data_offsets: [b, e]}}) with
  // short arrays; refusing anything deeper or longer while parsing keeps the parsed document a
  // small multiple of the header's size (a megabyte-long "shape" is refused, not built).
  int array_len = 0;
  auto guard = [&](int depth, json::parse_event_t event, json&) {
    KVB_CHECK(depth <= 3) << path << ": the header nests deeper than {name: {key: [values]}}";
    if (event == json::parse_event_t::array_start) array_len = 0;
    if (event == json::parse_event_t::value && depth == 3) {
      KVB_CHECK(++array_len <= static_cast<int>(kMaxDims))
          << path << ": an array in the header has more than " << kMaxDims << " entries";
    }
    return true;
  };
  try {
    header = json::parse(text, guard);
  } catch (const json::exception& e) {
    KVB_FAIL() << path << ": the header (bytes 8.." << data_offset_
               << ") is not valid JSON: " << e.what();
  }
  KVB_CHECK(header.is_object()) << path << ": the header must be a JSON object, got a "
                                << header.type_name();
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      KVB_CHECK(v.is_object()) << path << ": header key '__metadata__' must be an object";
      for (auto m = v.begin(); m != v.end(); ++m) {
        KVB_CHECK(m.value().is_string())
            << path << ": header key '__metadata__." << m.key() << "' must be a string";
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string who = path + ": tensor '" + name + "'";
    KVB_CHECK(v.is_object() && v.contains("dtype") && v.contains("shape") &&
              v.contains("data_offsets"))
        << who << " must be an object with keys dtype, shape and data_offsets";
    SafetensorsTensorInfo t;
    t.name = name;
    KVB_CHECK(v["dtype"].is_string()) << who << ": key 'dtype' must be a string";
    t.dtype = v["dtype"].get<std::string>();
    t.dtype_bytes = safetensors_dtype_bytes(t.dtype);
    KVB_CHECK(t.dtype_bytes > 0) << who << ": unknown dtype '" << t.dtype
                                 << "' (key 'dtype'; safetensors defines BOOL, U8, I8, F8_E5M2, "
                                    "F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64)";
    const json& shape = v["shape"];
    KVB_CHECK(shape.is_array() && shape.size() <= kMaxDims)
        << who << ": key 'shape' must be an array of at most " << kMaxDims << " integers";
    t.num_elements = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      uint64_t dim = 0;
      KVB_CHECK(json_u64(shape[d], &dim)) << who << ": key 'shape[" << d << "]' is "
                                          << shape[d].dump() << ", expected a non-negative integer";
      t.shape.push_back(dim);
      KVB_CHECK(!__builtin_mul_overflow(t.num_elements, dim, &t.num_elements) &&
                t.num_elements <= static_cast<uint64_t>(INT64_MAX))
          << who << ": shape " << shape.dump() << " overflows 63 bits";
    }
    uint64_t bytes = 0;
    KVB_CHECK(!__builtin_mul_overflow(t.num_elements, t.dtype_bytes, &bytes))
        << who << ": shape " << shape.dump() << " times " << t.dtype_bytes
        << " bytes overflows 64 bits";
    const json& off = v["data_offsets"];
    KVB_CHECK(off.is_array() && off.size() == 2 && json_u64(off[0], &t.begin) &&
              json_u64(off[1], &t.end))
        << who << ": key 'data_offsets' must be [begin, end] (non-negative integers), got "
        << off.dump();
    KVB_CHECK(t.begin <= t.end && t.end <= data_len)
        << who << ": data_offsets [" << t.begin << ", " << t.end
        << "] lie outside the data section (" << data_len << " bytes after the header)";
    KVB_CHECK(t.end - t.begin == bytes)
        << who << ": data_offsets [" << t.begin << ", " << t.end << "] hold " << t.end - t.begin
        << " bytes, but shape " << shape_str(t.shape) << " of " << t.dtype << " needs " << bytes;
    index_[name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }
  // Offsets ordered, without overlap or holes, covering the data section (as safetensors
  // requires: a hole could hide data, an overlap makes two tensors alias).
  std::vector<const SafetensorsTensorInfo*> order;
  for (const auto& t : tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t expected = 0;
  const SafetensorsTensorInfo* prev = nullptr;
  for (const auto* t : order) {
    KVB_CHECK(t->begin >= expected)
        << path << ": tensor '" << t->name << "' (data_offsets [" << t->begin << ", " << t->end
        << "]) overlaps tensor '" << (prev ? prev->name : "") << "', which ends at " << expected;
    KVB_CHECK(t->begin == expected)
        << path << ": bytes " << expected << ".." << t->begin << " of the data section belong to "
        << "no tensor (a hole before tensor '" << t->name << "')";
    expected = t->end;
    prev = t;
  }
  KVB_CHECK(expected == data_len) << path << ": the tensors cover " << expected
                                  << " bytes of the data section, but it has " << data_len
                                  << " (trailing bytes belong to no tensor)";
}

const SafetensorsTensorInfo* SafetensorsFile::find_tensor(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<float> SafetensorsFile::load_f32(const std::string& name,
                                             const std::vector<uint64_t>& shape) const {
  const SafetensorsTensorInfo* t = find_tensor(name);
  KVB_CHECK(t != nullptr) << path_ << ": no tensor named '" << name << "'";
  KVB_CHECK(t->shape == shape) << path_ << ": tensor '" << name << "' has shape "
                               << shape_str(t->shape) << ", expected " << shape_str(shape);
  KVB_CHECK(safetensors_dtype_convertible(t->dtype))
      << path_ << ": tensor '" << name << "' has dtype " << t->dtype
      << "; kvbench reads F32, F16 and BF16 weights";
  Fd fd;
  const uint64_t size = open_regular(path_, "safetensors", &fd);
  KVB_CHECK(size == file_size_) << path_ << ": the file changed size since it was opened ("
                                << file_size_ << " -> " << size << " bytes)";
  std::vector<float> out(t->num_elements);
  const uint64_t at = data_offset_ + t->begin;
  if (t->dtype == "F32") {
    pread_fully(fd.fd, path_, at, out.data(), t->num_elements * 4);  // little-endian host
    return out;
  }
  std::vector<uint16_t> buf(std::min<uint64_t>(t->num_elements, kChunkElems));
  const bool bf16 = t->dtype == "BF16";
  for (uint64_t done = 0; done < t->num_elements;) {
    const uint64_t n = std::min<uint64_t>(buf.size(), t->num_elements - done);
    pread_fully(fd.fd, path_, at + 2 * done, buf.data(), 2 * n);
    for (uint64_t i = 0; i < n; ++i) {
      out[done + i] = bf16 ? kernels::cpu::bf16_to_f32(buf[i]) : kernels::cpu::fp16_to_f32(buf[i]);
    }
    done += n;
  }
  return out;
}

std::unique_ptr<SafetensorsSet> SafetensorsSet::open_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  auto set = std::unique_ptr<SafetensorsSet>(new SafetensorsSet());
  set->dir_ = dir;
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  // transformers' order: model.safetensors when present, else the index's shards.
  if (!fs::exists(single, ec) && fs::exists(index, ec)) {
    const std::string ipath = index.string();
    set->source_ = ipath;
    KVB_USAGE_CHECK(fs::is_regular_file(index, ec)) << ipath << ": not a regular file";
    const uint64_t bytes = fs::file_size(index, ec);
    KVB_CHECK(!ec && bytes <= kMaxIndexBytes) << ipath << ": " << bytes << " bytes; an index above "
                                              << kMaxIndexBytes << " bytes is not plausible";
    std::ifstream in(index);
    json root;
    try {
      root = json::parse(in);
    } catch (const json::exception& e) {
      KVB_FAIL() << ipath << ": not valid JSON: " << e.what();
    }
    KVB_CHECK(root.is_object() && root.contains("weight_map") && root["weight_map"].is_object())
        << ipath << ": key 'weight_map' missing or not an object {tensor name: shard file}";
    KVB_CHECK(!root["weight_map"].empty()) << ipath << ": key 'weight_map' is empty";
    std::map<std::string, size_t> shard_of_file;
    for (auto it = root["weight_map"].begin(); it != root["weight_map"].end(); ++it) {
      const std::string key = "weight_map." + it.key();
      KVB_CHECK(it.value().is_string()) << ipath << ": key '" << key << "' must be a file name";
      const std::string file = it.value().get<std::string>();
      // A plain file name in the folder: no path separators, no "..", nothing absolute.
      KVB_CHECK(!file.empty() && file.find('/') == std::string::npos &&
                file.find('\\') == std::string::npos && file != "." && file != "..")
          << ipath << ": key '" << key << "' is '" << file
          << "'; shards must be plain file names in the checkpoint folder";
      auto [sit, added] = shard_of_file.emplace(file, set->files_.size());
      if (added) {
        const fs::path shard = fs::path(dir) / file;
        KVB_USAGE_CHECK(fs::is_regular_file(shard, ec))
            << ipath << ": key '" << key << "' names shard '" << file << "', which is missing from "
            << dir << " (download every shard the index lists)";
        set->files_.push_back(SafetensorsFile::open(shard.string()));
      }
      const SafetensorsFile& f = *set->files_[sit->second];
      KVB_CHECK(f.find_tensor(it.key()) != nullptr)
          << ipath << ": key '" << key << "' names shard '" << file << "', but " << f.path()
          << " has no tensor '" << it.key() << "'";
      set->file_of_[it.key()] = sit->second;
    }
    return set;
  }
  KVB_USAGE_CHECK(fs::exists(single, ec))
      << dir << ": no model.safetensors or model.safetensors.index.json (kvbench reads "
      << "safetensors checkpoints; PyTorch .bin files are not read)";
  set->source_ = single.string();
  set->files_.push_back(SafetensorsFile::open(single.string()));
  for (const auto& t : set->files_[0]->tensors()) set->file_of_[t.name] = 0;
  return set;
}

const SafetensorsTensorInfo* SafetensorsSet::find_tensor(const std::string& name,
                                                         const SafetensorsFile** file) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) return nullptr;
  const SafetensorsFile& f = *files_[it->second];
  if (file) *file = &f;
  return f.find_tensor(name);
}

void SafetensorsSet::expect_tensor(const std::string& name,
                                   const std::vector<uint64_t>& shape) const {
  const SafetensorsFile* f = nullptr;
  const SafetensorsTensorInfo* t = find_tensor(name, &f);
  KVB_CHECK(t != nullptr) << source_ << ": no tensor named '" << name
                          << "' (the loader needs it; the checkpoint has " << file_of_.size()
                          << " tensors)";
  KVB_CHECK(t->shape == shape) << f->path() << ": tensor '" << name << "' has shape "
                               << shape_str(t->shape) << ", expected " << shape_str(shape)
                               << " (from config.json)";
  KVB_CHECK(safetensors_dtype_convertible(t->dtype))
      << f->path() << ": tensor '" << name << "' has dtype " << t->dtype
      << "; kvbench reads F32, F16 and BF16 weights";
}

std::vector<float> SafetensorsSet::load_f32(const std::string& name,
                                            const std::vector<uint64_t>& shape) const {
  const SafetensorsFile* f = nullptr;
  KVB_CHECK(find_tensor(name, &f) != nullptr) << source_ << ": no tensor named '" << name << "'";
  return f->load_f32(name, shape);
}

}  // namespace kvb::formats
