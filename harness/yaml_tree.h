// The sweep config's YAML as a tree that remembers each node's file and line (so that every error
// reads "<file>:<line>: <key path>: <what>"), loaded with its includes merged, and the checks the
// schema walk in sweep_config.cc is written with. All failures are kvb usage errors.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvb::harness::yamlcfg {

struct Entry;
struct Node {
  enum class Kind { kNull, kScalar, kSeq, kMap };
  Kind kind = Kind::kNull;
  std::string file;
  int line = 1;  // 1-based
  std::string scalar;
  std::vector<Node> seq;
  std::vector<Entry> map;
  const Entry* find(const std::string& key) const;
};
struct Entry {
  std::string key;
  int key_line = 1;
  Node value;
};

[[noreturn]] void fail_at(const std::string& file, int line, const std::string& key,
                          const std::string& what);
[[noreturn]] void fail(const Node& at, const std::string& key, const std::string& what);
std::string join(const std::vector<std::string>& v, const std::string& sep = ", ");

// A path written in `at`'s file, resolved against that file's folder.
std::string resolve_path(const Node& at, const std::string& p);
// What loading one config carries across its files: `text` collects each file's text for
// provenance, `chain` detects include cycles, `nodes` and `file_loads` count the work so that
// aliases and include diamonds fail fast (with the key) instead of expanding exponentially.
struct LoadState {
  std::vector<std::string> chain;
  std::string text;
  int64_t nodes = 0;
  int file_loads = 0;
};
// Loads one file and its includes (depth first; later includes override earlier ones and the
// file itself overrides them all). `site`/`site_key` name the include that asked for this file.
// A directory, a second YAML document, a cycle of aliases or of includes, includes nested more
// than 32 files deep, more than 100000 nodes or 256 include files are usage errors.
Node load_tree(const std::string& path, LoadState& state, const Node* site,
               const std::string& site_key);

// One YAML document from memory (a config stored in a database), without includes; `name` stands
// for the file in messages. Invalid YAML is a usage error.
Node parse_text(const std::string& text, const std::string& name);

// A mapping whose keys must come from `allowed`.
const Node& expect_map(const Node& n, const std::string& key,
                       const std::vector<std::string>& allowed);
std::string scalar(const Node& n, const std::string& key);
int64_t to_int(const Node& n, const std::string& key, int64_t lo, int64_t hi);
double to_double(const Node& n, const std::string& key);
// A single value or a list: the items with their key paths.
std::vector<std::pair<const Node*, std::string>> items_of(const Node& n, const std::string& key);

}  // namespace kvb::harness::yamlcfg
