// safetensors reader (huggingface/safetensors, docs "format"): an 8-byte little-endian header
// length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__":
// {string: string}}, then the data section. Every offset, dtype and shape is checked against the
// file before use, with the reference implementation's rules (N <= 100 MB and within the file;
// offsets inside the data section, ordered without overlap or holes and covering it exactly;
// end - begin == prod(shape) * dtype size, without overflow). Tensor data is read lazily, one
// tensor at a time, and converted to f32 (F32, F16, BF16), so a loader's peak host memory is the
// f32 weights plus one tensor's chunk. Also the checkpoint folder's weights: one
// model.safetensors, or the shards model.safetensors.index.json names. Errors are kvb::Error
// naming the file and the tensor or JSON key.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kvb::formats {

struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype;            // "F32", "BF16", ... as in the header
  uint64_t dtype_bytes = 0;     // bytes per element
  std::vector<uint64_t> shape;  // row-major, shape[0] outermost (PyTorch order)
  uint64_t begin = 0, end = 0;  // byte range relative to the data section
  uint64_t num_elements = 0;
};

// Bytes per element of a safetensors dtype name, or 0 for a name the format does not define.
uint64_t safetensors_dtype_bytes(const std::string& dtype);
// Whether load_f32 converts the dtype (F32, F16, BF16).
bool safetensors_dtype_convertible(const std::string& dtype);

class SafetensorsFile {
 public:
  // Reads and validates the header; no tensor data is read. Throws naming the file and the field.
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t data_offset() const { return data_offset_; }  // 8 + N
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  const SafetensorsTensorInfo* find_tensor(const std::string& name) const;  // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor converted to f32, row-major; `shape` is checked first (PyTorch order).
  std::vector<float> load_f32(const std::string& name, const std::vector<uint64_t>& shape) const;

 private:
  void parse();
  std::string path_;
  uint64_t file_size_ = 0;
  uint64_t data_offset_ = 0;
  std::vector<SafetensorsTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint folder's weights: dir/model.safetensors (preferred when both exist, as
// transformers' from_pretrained prefers it), or dir/model.safetensors.index.json
// ({"weight_map": {tensor: shard file}}; shards are plain file names in dir, each tensor present
// in the shard the index names).
class SafetensorsSet {
 public:
  static std::unique_ptr<SafetensorsSet> open_dir(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  // nullptr if no file holds the tensor; `file` (optional) receives the file that holds it.
  const SafetensorsTensorInfo* find_tensor(const std::string& name,
                                           const SafetensorsFile** file = nullptr) const;
  // Throws naming the tensor, the file (or index) and the shapes when absent or of another shape,
  // or when its dtype is not one load_f32 converts. No data is read.
  void expect_tensor(const std::string& name, const std::vector<uint64_t>& shape) const;
  std::vector<float> load_f32(const std::string& name, const std::vector<uint64_t>& shape) const;
  // Where the tensor list came from, for error messages ("dir/model.safetensors" or the index).
  const std::string& source() const { return source_; }

 private:
  std::string dir_;
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> file_of_;  // tensor name -> files_ index
};

}  // namespace kvb::formats
