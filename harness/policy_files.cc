// Policy files in unit keys by content (harness/policy_files.h).
#include "harness/policy_files.h"

#include <filesystem>

#include "common/error.h"
#include "common/file_io.h"
#include "common/sha256.h"
#include "harness/model_digest.h"

namespace kvb::harness {

std::string FileDigests::sha256(const std::string& path, const std::string& what) {
  std::error_code ec;
  KVB_USAGE_CHECK(std::filesystem::exists(path, ec))
      << what << " '" << path << "' does not exist; give the path of the file (relative paths "
      << "resolve against the config file's folder)";
  require_regular_file(path, what);  // a FIFO would block the read below
  const results::FileStamp stamp = file_stamp(path);
  const auto key = std::make_tuple(stamp.path, stamp.size, stamp.mtime_ns);
  if (const auto it = cache_.find(key); it != cache_.end()) return it->second;
  ++files_read_;
  return cache_[key] = sha256_file(stamp.path);
}

std::map<std::string, std::string> keyed_policy_options(
    const std::string& policy, const std::map<std::string, std::string>& options,
    const std::string& base_dir, FileDigests& digests) {
  std::map<std::string, std::string> keyed = options;
  const auto dir = options.find(kDuoPatternsOption);
  if (policy == kDuoPolicy && dir != options.end()) {
    std::filesystem::path path = dir->second;
    if (path.is_relative() && !base_dir.empty()) path = std::filesystem::path(base_dir) / path;
    const std::string what = std::string("policy ") + kDuoPolicy + " option " + kDuoPatternsOption;
    keyed[kDuoPatternsOption] =
        "sha256:" +
        digests.sha256((path / "full_attention_heads.tsv").lexically_normal().string(), what) +
        "," + digests.sha256((path / "config.json").lexically_normal().string(), what);
    return keyed;
  }
  const char* option = policy == kPythonPolicy    ? kPythonPolicyFileOption
                       : policy == kQFilterPolicy ? kQFilterFiltersOption
                                                  : nullptr;
  const auto file = option ? options.find(option) : options.end();
  if (file == options.end()) return keyed;
  std::filesystem::path path = file->second;
  if (path.is_relative() && !base_dir.empty()) path = std::filesystem::path(base_dir) / path;
  keyed[option] = "sha256:" + digests.sha256(path.lexically_normal().string(),
                                             "policy " + policy + " option " + option);
  return keyed;
}

}  // namespace kvb::harness
