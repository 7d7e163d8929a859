// kvb::Options: typed, validated key=value options.
#include "common/options.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "common/error.h"

namespace kvb {

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}
}  // namespace

std::string Options::get_string(const std::string& key, const std::string& def,
                                      const std::vector<std::string>& choices) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) return def;
  used_[key] = true;
  if (!choices.empty()) {
    KVB_USAGE_CHECK(std::find(choices.begin(), choices.end(), it->second) != choices.end())
        << kind_ << " " << key << "=" << it->second << " is not allowed; choose one of: "
        << join(choices);
  }
  return it->second;
}

int Options::get_int(const std::string& key, int def, int min_value, int max_value) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) return def;
  used_[key] = true;
  char* end = nullptr;
  const long v = std::strtol(it->second.c_str(), &end, 10);
  KVB_USAGE_CHECK(!it->second.empty() && *end == '\0')
      << kind_ << " " << key << "=" << it->second << " is not an integer";
  KVB_USAGE_CHECK(v >= min_value && v <= max_value)
      << kind_ << " " << key << "=" << v << " is outside [" << min_value << ", " << max_value
      << "]";
  return static_cast<int>(v);
}

double Options::get_double(const std::string& key, double def, double min_value,
                                 double max_value) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) return def;
  used_[key] = true;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  KVB_USAGE_CHECK(!it->second.empty() && *end == '\0' && std::isfinite(v))
      << kind_ << " " << key << "=" << it->second << " is not a number";
  KVB_USAGE_CHECK(v >= min_value && v <= max_value)
      << kind_ << " " << key << "=" << v << " is outside [" << min_value << ", " << max_value
      << "]";
  return v;
}

bool Options::get_bool(const std::string& key, bool def) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) return def;
  used_[key] = true;
  const std::string& v = it->second;
  if (v == "true" || v == "1" || v == "yes") return true;
  if (v == "false" || v == "0" || v == "no") return false;
  KVB_USAGE_FAIL() << kind_ << " " << key << "=" << v << " is not a boolean (true/false)";
}

void Options::check_all_used(const std::string& owner,
                                   const std::vector<ParamDoc>& params) const {
  for (const auto& [key, value] : kv_) {
    if (used_.count(key)) continue;
    std::vector<std::string> names;
    for (const auto& p : params) names.push_back(p.name);
    KVB_USAGE_FAIL() << owner << " has no option '" << key << "'"
                     << "; its options: " << join(names);
  }
}

std::vector<int> Options::get_int_list(const std::string& key, const std::vector<int>& def,
                                       int min_value, int max_value) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) return def;
  used_[key] = true;
  std::vector<int> out;
  const std::string& s = it->second;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    const std::string item = s.substr(start, comma - start);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    KVB_USAGE_CHECK(!item.empty() && *end == '\0')
        << kind_ << " " << key << "=" << s << ": '" << item << "' is not an integer";
    KVB_USAGE_CHECK(v >= min_value && v <= max_value)
        << kind_ << " " << key << ": " << v << " is outside [" << min_value << ", " << max_value
        << "]";
    out.push_back(static_cast<int>(v));
    start = comma + 1;
  }
  return out;
}

Options Options::from_key_values(const std::vector<std::string>& entries, const std::string& flag,
                                 const std::string& kind) {
  Options opts({}, kind);
  for (const std::string& e : entries) {
    const size_t eq = e.find('=');
    KVB_USAGE_CHECK(eq != std::string::npos && eq > 0)
        << flag << " '" << e << "' is not key=value (e.g. " << flag << " name=value)";
    const std::string key = e.substr(0, eq);
    KVB_USAGE_CHECK(!opts.has(key)) << flag << " " << key << " given twice";
    opts.set(key, e.substr(eq + 1));
  }
  return opts;
}

}  // namespace kvb
