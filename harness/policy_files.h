// The files a policy reads enter its units' keys by content, never by path (DESIGN.md "Work unit
// and its key"): a Python policy's script (policy `python`, option `file=PATH`). Editing the
// script re-runs its units; moving or copying it re-runs nothing. The path stays in the options
// the units table shows and the worker runs (it opens the file there).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

namespace kvb::harness {

// The policy whose option names a file read by the worker, and that option.
inline constexpr char kPythonPolicy[] = "python";
inline constexpr char kPythonPolicyFileOption[] = "file";
// duo_attention's option naming the folder of its head scores, keyed by its two files' content.
inline constexpr char kDuoPolicy[] = "duo_attention";
inline constexpr char kDuoPatternsOption[] = "patterns";
// qfilter's option naming its filters file (the Q-Filters authors' model.safetensors).
inline constexpr char kQFilterPolicy[] = "qfilter";
inline constexpr char kQFilterFiltersOption[] = "filters";
// Whether `option` of `policy` names a path the worker opens (it resolves against the config's
// folder).
inline bool is_policy_path_option(const std::string& policy, const std::string& option) {
  return (policy == kPythonPolicy && option == kPythonPolicyFileOption) ||
         (policy == kDuoPolicy && option == kDuoPatternsOption) ||
         (policy == kQFilterPolicy && option == kQFilterFiltersOption);
}

// SHA-256 of files, each read once per sweep (the sweep's coordinator keeps one for all its plan
// expansions): cached by canonical path, size and modification time, so an edited file is read
// again and an unchanged one is not.
class FileDigests {
 public:
  // Lowercase hex of the file's content. A missing file, or one that is not a regular file, is a
  // usage error naming the path and `what` ("policy python option file").
  std::string sha256(const std::string& path, const std::string& what);
  int files_read() const { return files_read_; }  // how many times a file was read and hashed

 private:
  std::map<std::tuple<std::string, int64_t, int64_t>, std::string> cache_;
  int files_read_ = 0;
};

// The policy's options as its unit keys hash them: for policy `python`, option `file` becomes
// "sha256:<hex>" of the file's content (a relative path resolves against `base_dir`, the config
// file's folder, as task file options do); for duo_attention, option `patterns` becomes
// "sha256:<tsv hex>,<config.json hex>"; for qfilter, option `filters` becomes "sha256:<hex>" of
// the file; any other policy's options as given.
std::map<std::string, std::string> keyed_policy_options(
    const std::string& policy, const std::map<std::string, std::string>& options,
    const std::string& base_dir, FileDigests& digests);

}  // namespace kvb::harness
