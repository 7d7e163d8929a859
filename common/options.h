// Generic key=value options (policy options from --policy-opt, task options from --task-opt, and
// their YAML twins) with typed getters that validate ranges and choices. Every key must be read
// by its owner; check_all_used() then rejects unknown keys, naming the allowed ones.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace kvb {

// One documented parameter: `kvbench ls` prints these.
struct ParamDoc {
  std::string name;
  std::string default_value;
  std::string description;
  std::vector<std::string> choices = {};  // empty: free value
};

class Options {
 public:
  Options() = default;
  // kind: how messages name an option, e.g. "policy option" or "task option".
  explicit Options(std::map<std::string, std::string> kv, std::string kind = "policy option")
      : kv_(std::move(kv)), kind_(std::move(kind)) {}
  void set(const std::string& key, const std::string& value) { kv_[key] = value; }
  void set_kind(const std::string& kind) { kind_ = kind; }
  const std::map<std::string, std::string>& values() const { return kv_; }
  bool has(const std::string& key) const { return kv_.count(key) != 0; }

  std::string get_string(const std::string& key, const std::string& def,
                         const std::vector<std::string>& choices = {}) const;
  int get_int(const std::string& key, int def, int min_value, int max_value) const;
  double get_double(const std::string& key, double def, double min_value, double max_value) const;
  bool get_bool(const std::string& key, bool def) const;
  // Comma-separated integers ("1024,2048"), each within [min_value, max_value].
  std::vector<int> get_int_list(const std::string& key, const std::vector<int>& def, int min_value,
                                int max_value) const;
  // From "key=value" strings of a repeatable flag (e.g. --task-opt); a malformed or repeated
  // entry is a usage error naming the flag.
  static Options from_key_values(const std::vector<std::string>& entries, const std::string& flag,
                                 const std::string& kind);
  // Throws a usage error naming the first key no getter read; owner: e.g. "policy h2o".
  void check_all_used(const std::string& owner, const std::vector<ParamDoc>& params) const;

 private:
  std::map<std::string, std::string> kv_;
  std::string kind_ = "policy option";
  mutable std::map<std::string, bool> used_;
};

}  // namespace kvb
