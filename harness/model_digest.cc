// Model file digests through the store's cache (harness/model_digest.h).
#include "harness/model_digest.h"

#include <sys/stat.h>

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

ModelDigest model_file_sha256(results::Store& store, const std::string& path) {
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
