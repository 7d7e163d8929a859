// A YAML tree that remembers each node's file and line, loaded with includes, and the schema
// checks the sweep config is walked with (harness/yaml_tree.h).
#include "harness/yaml_tree.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include "common/error.h"
#include "common/file_io.h"

namespace kvb::harness::yamlcfg {
namespace fs = std::filesystem;

const Entry* Node::find(const std::string& key) const {
  for (const Entry& e : map) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

[[noreturn]] void fail_at(const std::string& file, int line, const std::string& key,
                          const std::string& what) {
  KVB_USAGE_FAIL() << file << ":" << line << ": " << key << ": " << what;
}
[[noreturn]] void fail(const Node& at, const std::string& key, const std::string& what) {
  fail_at(at.file, at.line, key, what);
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

namespace {
// Bounds on the tree built from YAML. Aliases share nodes in yaml-cpp, so a few lines can name an
// exponential number of nodes ("billion laughs") or themselves (`x: &a [*a]`): the conversion
// counts every node it builds and watches its own ancestors, and fails naming the key instead of
// running out of stack or memory.
constexpr int64_t kMaxNodes = 100000;  // nodes of all files of one config, includes counted
constexpr int kMaxDepth = 64;
constexpr int kMaxFileLoads = 256;  // include files read for one config, repeats counted
constexpr size_t kMaxIncludeDepth = 32;  // files including files including files ...

struct Converter {
  const std::string& file;
  int64_t& nodes;                     // shared over all the files of one config
  std::vector<YAML::Node> ancestors;  // collections on the way down (cycle check)
  std::vector<std::string> key_path;  // for messages: "tasks[0].options"

  std::string where() const {
    std::string k;
    for (const std::string& p : key_path) k += (k.empty() || p[0] == '[' ? "" : ".") + p;
    return k.empty() ? "(top level)" : k;
  }

  Node convert(const YAML::Node& y, int fallback_line) {
    Node n;
    n.file = file;
    n.line = y.Mark().is_null() ? fallback_line : y.Mark().line + 1;
    if (++nodes > kMaxNodes) {
      fail(n, where(),
           "the config expands to more than " + std::to_string(kMaxNodes) +
               " YAML nodes (aliases that repeat aliases?); write the lists out or shorten them");
    }
    const bool collection = y.IsSequence() || y.IsMap();
    if (collection) {
      for (const YAML::Node& a : ancestors) {
        if (a.is(y)) fail(n, where(), "an alias refers to a node that contains it (a cycle)");
      }
      if (static_cast<int>(ancestors.size()) >= kMaxDepth) {
        fail(n, where(), "nested deeper than " + std::to_string(kMaxDepth) + " levels");
      }
      ancestors.push_back(y);
    }
    switch (y.Type()) {
      case YAML::NodeType::Scalar:
        n.kind = Node::Kind::kScalar;
        n.scalar = y.Scalar();
        break;
      case YAML::NodeType::Sequence:
        n.kind = Node::Kind::kSeq;
        for (const auto& item : y) {
          key_path.push_back(std::string(1, '[').append(std::to_string(n.seq.size())) + ']');
          n.seq.push_back(convert(item, n.line));
          key_path.pop_back();
        }
        break;
      case YAML::NodeType::Map: {
        n.kind = Node::Kind::kMap;
        std::unordered_set<std::string> seen;
        for (const auto& kv : y) {
          const int key_line = kv.first.Mark().is_null() ? n.line : kv.first.Mark().line + 1;
          if (!kv.first.IsScalar()) fail_at(file, key_line, "(key)", "keys must be plain names");
          const std::string key = kv.first.Scalar();
          if (!seen.insert(key).second)
            fail_at(file, key_line, key, "key given twice in one mapping");
          key_path.push_back(key);
          n.map.push_back({key, key_line, convert(kv.second, key_line)});
          key_path.pop_back();
        }
        break;
      }
      default:
        n.kind = Node::Kind::kNull;
    }
    if (collection) ancestors.pop_back();
    return n;
  }
};

// Maps merge key by key (recursively); anything else in `over` replaces `base`.
Node merge(const Node& base, const Node& over) {
  if (base.kind != Node::Kind::kMap || over.kind != Node::Kind::kMap) return over;
  Node out = base;
  out.file = over.file;
  out.line = over.line;
  for (const Entry& e : over.map) {
    auto it = std::find_if(out.map.begin(), out.map.end(),
                           [&](const Entry& b) { return b.key == e.key; });
    if (it == out.map.end()) {
      out.map.push_back(e);
    } else {
      it->value = merge(it->value, e.value);
      it->key_line = e.key_line;
    }
  }
  return out;
}

}  // namespace

// A path written in `at`'s file, resolved against that file's folder.
std::string resolve_path(const Node& at, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  return (fs::path(at.file).parent_path() / p).lexically_normal().string();
}

// Loads one file and its includes (depth first; later includes override earlier ones and the
// file itself overrides them all).
Node load_tree(const std::string& path, LoadState& state, const Node* site,
               const std::string& site_key) {
  auto refuse = [&](const std::string& why) {
    if (site) fail(*site, site_key, why);
    KVB_USAGE_FAIL() << "config file '" << path << "': " << why;
  };
  if (++state.file_loads > kMaxFileLoads) {
    refuse("more than " + std::to_string(kMaxFileLoads) +
           " include files read for one config (an include diamond that repeats files?); "
           "include each shared file once, from the top file");
  }
  if (state.chain.size() >= kMaxIncludeDepth) {
    refuse("includes nested deeper than " + std::to_string(kMaxIncludeDepth) + " files (" +
           join(state.chain, " -> ") + " -> " + path + "); flatten them");
  }
  // Before the open: a FIFO would block it forever, a device (/dev/zero) never end.
  if (const std::string kind = non_regular_file_kind(path); !kind.empty()) {
    const std::string why = "'" + path + "' is " + kind + ", not a regular file; give a YAML file";
    if (site) fail(*site, site_key, why);
    KVB_USAGE_FAIL() << "config file " << why;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) {
    const std::string why = std::string("cannot read '") + path + "': " + std::strerror(errno);
    if (site) fail(*site, site_key, why);
    KVB_USAGE_FAIL() << "cannot read config file '" << path << "': " << std::strerror(errno);
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  const std::string own = buf.str();
  std::string& text = state.text;
  if (site)
    text += (text.empty() || text.back() == '\n' ? "" : "\n") + std::string("# --- include: ") +
            path + "\n";
  text += own;
  YAML::Node y;
  try {
    const std::vector<YAML::Node> docs = YAML::LoadAll(own);
    if (docs.size() > 1) {
      const int line = docs[1].Mark().is_null() ? 1 : docs[1].Mark().line + 1;
      fail_at(path, line, "(document)",
              "a second YAML document ('---'); a config is one document: remove the '---' "
              "separator or move the rest into an include: file");
    }
    if (!docs.empty()) y = docs[0];
  } catch (const YAML::Exception& e) {
    KVB_USAGE_FAIL() << path << ":" << e.mark.line + 1 << ":" << e.mark.column + 1
                     << ": invalid YAML: " << e.msg;
  }
  Converter conv{path, state.nodes, {}, {}};
  Node root = conv.convert(y, 1);
  root.line = 1;
  if (root.kind == Node::Kind::kNull) root.kind = Node::Kind::kMap;  // an empty file
  if (root.kind != Node::Kind::kMap) {
    fail(root, "(top level)", "a config is a mapping of keys (models:, tasks:, policies:, ...)");
  }
  std::vector<std::string>& chain = state.chain;
  chain.push_back(path);
  Node merged;
  merged.kind = Node::Kind::kMap;
  if (const Entry* inc = root.find("include")) {
    std::vector<const Node*> items;
    if (inc->value.kind == Node::Kind::kScalar) items.push_back(&inc->value);
    for (const Node& n : inc->value.seq) items.push_back(&n);
    if (items.empty() ||
        (inc->value.kind != Node::Kind::kScalar && inc->value.kind != Node::Kind::kSeq)) {
      fail(inc->value, "include", "expected a file name or a list of file names");
    }
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string key =
          inc->value.kind == Node::Kind::kSeq ? "include[" + std::to_string(i) + "]" : "include";
      if (items[i]->kind != Node::Kind::kScalar) fail(*items[i], key, "expected a file name");
      const std::string target = resolve_path(*items[i], items[i]->scalar);
      for (const std::string& c : chain) {
        if (fs::path(c).lexically_normal() == fs::path(target).lexically_normal()) {
          fail(*items[i], key, "include cycle: " + join(chain, " -> ") + " -> " + target);
        }
      }
      merged = merge(merged, load_tree(target, state, items[i], key));
    }
    root.map.erase(std::find_if(root.map.begin(), root.map.end(),
                                [](const Entry& e) { return e.key == "include"; }));
  }
  chain.pop_back();
  Node out = merge(merged, root);
  out.file = path;
  out.line = 1;
  return out;
}

Node parse_text(const std::string& text, const std::string& name) {
  YAML::Node y;
  try {
    y = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    KVB_USAGE_FAIL() << name << ":" << e.mark.line + 1 << ":" << e.mark.column + 1
                     << ": invalid YAML: " << e.msg;
  }
  int64_t nodes = 0;
  Converter conv{name, nodes, {}, {}};
  Node root = conv.convert(y, 1);
  root.line = 1;
  if (root.kind == Node::Kind::kNull) root.kind = Node::Kind::kMap;
  return root;
}

// ---- schema helpers ---------------------------------------------------------------------------
// A mapping whose keys must come from `allowed`.
const Node& expect_map(const Node& n, const std::string& key,
                       const std::vector<std::string>& allowed) {
  if (n.kind != Node::Kind::kMap) fail(n, key, "expected a mapping with keys: " + join(allowed));
  for (const Entry& e : n.map) {
    if (std::find(allowed.begin(), allowed.end(), e.key) == allowed.end()) {
      fail_at(n.file, e.key_line, key.empty() ? e.key : key + "." + e.key,
              "unknown key '" + e.key + "'; allowed keys: " + join(allowed));
    }
  }
  return n;
}

std::string scalar(const Node& n, const std::string& key) {
  if (n.kind != Node::Kind::kScalar) fail(n, key, "expected a single value");
  return n.scalar;
}

int64_t to_int(const Node& n, const std::string& key, int64_t lo, int64_t hi) {
  const std::string s = scalar(n, key);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE) fail(n, key, "'" + s + "' is not an integer");
  if (v < lo || v > hi) {
    fail(
        n, key,
        std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return v;
}

double to_double(const Node& n, const std::string& key) {
  const std::string s = scalar(n, key);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v)) fail(n, key, "'" + s + "' is not a number");
  return v;
}

// A single value or a list: the items with their key paths.
std::vector<std::pair<const Node*, std::string>> items_of(const Node& n, const std::string& key) {
  std::vector<std::pair<const Node*, std::string>> out;
  if (n.kind == Node::Kind::kSeq) {
    for (size_t i = 0; i < n.seq.size(); ++i)
      out.push_back({&n.seq[i], key + "[" + std::to_string(i) + "]"});
    if (out.empty()) fail(n, key, "the list is empty");
  } else if (n.kind == Node::Kind::kNull) {
    fail(n, key, "needs a value");
  } else {
    out.push_back({&n, key});
  }
  return out;
}

}  // namespace kvb::harness::yamlcfg
