// Model file digests through the store's cache (harness/model_digest.h).
#include "harness/model_digest.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "common/log.h"
#include "common/sha256.h"

namespace kvb::harness {

results::FileStamp file_stamp(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path canonical = std::filesystem::canonical(path, ec);
  if (ec) KVB_FAIL() << "model file '" << path << "': " << ec.message();
  struct stat st {};
  if (::stat(canonical.c_str(), &st) != 0) {
    KVB_FAIL() << "model file '" << path << "': stat: " << std::strerror(errno);
  }
  results::FileStamp s;
  s.path = canonical.string();
  s.size = static_cast<int64_t>(st.st_size);
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  s.inode = static_cast<int64_t>(st.st_ino);
  return s;
}

namespace {

// A Hugging Face checkpoint folder's digest: SHA-256 of the lines "<file name> <file SHA-256>\n"
// over the files kvbench reads from it (config.json, tokenizer.json, tokenizer_config.json,
// chat_template.jinja, model.safetensors.index.json and every *.safetensors), sorted by name;
// each file's digest goes through the cache. Other files (README.md, .gitattributes) do not
// change the key.
ModelDigest folder_sha256(results::Store& store, const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    const bool read = n == "config.json" || n == "tokenizer.json" ||
                      n == "tokenizer_config.json" || n == "chat_template.jinja" ||
                      n == "model.safetensors.index.json" ||
                      (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0);
    if (read && e.is_regular_file()) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  std::string lines;
  bool cached = true;
  for (const std::string& n : names) {
    const ModelDigest d = model_file_sha256(store, (fs::path(dir) / n).string());
    lines += n + " " + d.sha256 + "\n";
    cached = cached && d.cached;
  }
  return {sha256_hex(lines), cached};
}

}  // namespace

ModelDigest model_file_sha256(results::Store& store, const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return folder_sha256(store, path);
  const results::FileStamp stamp = file_stamp(path);
  if (std::optional<std::string> sha = store.cached_digest(stamp)) {
    KVB_LOG_INFO << "model " << stamp.path << ": SHA-256 from the digest cache (size, mtime and "
                 << "inode unchanged)";
    return {*sha, true};
  }
  KVB_LOG_INFO << "model " << stamp.path << ": hashing " << stamp.size / (1 << 20)
               << " MiB (SHA-256; kept in the database for the next start)";
  ModelDigest d{sha256_file(stamp.path), false};
  store.remember_digest(stamp, d.sha256);
  return d;
}

}  // namespace kvb::harness
