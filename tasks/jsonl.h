// A validated JSON-lines reader for the data-set tasks (TASKS.md "Data sets"). Input files are
// treated as hostile: lines and item counts are bounded, every line must be a JSON object, and
// every error names the file and line (and the key, for missing or wrong-typed fields), so a
// user can fix the file without a debugger. A missing file names how to obtain it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvb::tasks {

struct JsonlReadOptions {
  std::string option;         // the task option that names the file, e.g. "data_dir"
  std::string how_to_obtain;  // one sentence for the missing-file message
  size_t limit = 0;           // stop after this many items (0: read them all)
  size_t max_line_bytes = size_t{64} << 20;
  std::string limit_hint;  // how to raise max_line_bytes, for the over-long-line message
  size_t max_items = 2'000'000;
  size_t max_total_bytes = size_t{2} << 30;
};

// One parsed line. Accessors throw kvb::Error "<file>:<line>: key '<key>' ..." on a missing or
// wrong-typed field; an absent key and a JSON null are both "missing".
class JsonlItem {
 public:
  JsonlItem(std::shared_ptr<const std::string> file, size_t line, nlohmann::json value)
      : file_(std::move(file)), line_(line), value_(std::move(value)) {}
  const std::string& file() const { return *file_; }
  size_t line() const { return line_; }  // 1-based line number in the file
  const nlohmann::json& json() const { return value_; }
  bool has(const std::string& key) const;  // present and not null

  std::string str(const std::string& key) const;
  std::string str_or(const std::string& key, const std::string& def) const;
  int64_t integer(const std::string& key) const;
  std::optional<int64_t> integer_opt(const std::string& key) const;
  std::vector<std::string> str_list(const std::string& key) const;
  std::optional<std::vector<std::string>> str_list_opt(const std::string& key) const;
  // Throws kvb::Error "<file>:<line>: <what>" (a usage error: the data is the user's input).
  [[noreturn]] void fail(const std::string& what) const;

 private:
  const nlohmann::json& at(const std::string& key, const char* expected) const;

  std::shared_ptr<const std::string> file_;
  size_t line_;
  nlohmann::json value_;
};

// Sample ids key the results (a unit is a model, a task, a sample id, a policy, ...): two items
// with one id would make one unit, and the second item would silently never run. Each data task
// adds every sample's id here; a repeat is a usage error naming the file, the id and both lines.
class UniqueSampleIds {
 public:
  // `source` says where the ids come from, for the message: "key '_id'", "the id: field 'qid'".
  explicit UniqueSampleIds(std::string source) : source_(std::move(source)) {}
  void add(const std::string& id, const JsonlItem& item);

 private:
  std::string source_;
  std::unordered_map<std::string, size_t> line_of_;
};

// All items of a file, in file order; a gzip file (by its magic bytes, whatever its name) is
// read through zlib, its decompressed size bounded like a plain file's. Blank lines are skipped;
// CRLF line ends and a UTF-8 BOM are accepted; every other line must parse as one JSON object
// (strings must be valid UTF-8: an invalid byte is reported with its offset and its key). A file
// without items is a usage error naming it and its task option. The open never blocks: a FIFO
// with no writer reads as empty; a device (/dev/zero), a directory or a socket is a usage error
// naming the path, before any open (common/file_io.h).
struct JsonlFile {
  std::string path;
  std::vector<JsonlItem> items;
};
JsonlFile read_jsonl(const std::string& path, const JsonlReadOptions& options);

// Python's str.strip(): removes leading and trailing whitespace as Python defines it (ASCII
// whitespace, \x1c-\x1f, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F,
// U+3000), so prompts built from the same fields match the Python references byte for byte.
std::string py_strip(std::string_view s);

// Reads a whole text file (perplexity corpora), bounded by max_bytes; a missing file names the
// option and how to obtain it. As read_jsonl, the open never blocks on a FIFO, and what is neither a
// regular file nor a FIFO is refused before it.
std::string read_text_file(const std::string& path, const std::string& option,
                           const std::string& how_to_obtain, size_t max_bytes);

}  // namespace kvb::tasks
