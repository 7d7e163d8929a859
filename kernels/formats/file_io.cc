// Descriptor-level reads for the model file readers (kernels/formats/file_io.h).
#include "kernels/formats/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/file_io.h"

namespace kvb::formats {

uint64_t open_regular(const std::string& path, const char* kind, Fd* fd) {
  // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer, forever; on a regular
  // file it changes nothing (reads of regular files never block in that sense).
  fd->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  KVB_USAGE_CHECK(fd->fd >= 0) << "cannot open " << kind << " file '" << path
                               << "': " << std::strerror(errno);
  struct stat st {};
  KVB_CHECK(::fstat(fd->fd, &st) == 0) << path << ": fstat failed: " << std::strerror(errno);
  if (!S_ISREG(st.st_mode)) {
    // The path's type, for the message (the descriptor's own was checked).
    const std::string type = non_regular_file_kind(path);
    KVB_USAGE_FAIL() << path << ": not a regular file (expected a " << kind << " file); it is "
                     << (type.empty() ? "of an unknown type" : type);
  }
  return static_cast<uint64_t>(st.st_size);
}

uint64_t regular_file_size(const std::string& path, const char* what) {
  require_regular_file(path, what);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;  // missing: the caller's open names it
  return static_cast<uint64_t>(st.st_size);
}

void pread_fully(int fd, const std::string& path, uint64_t offset, void* dst, uint64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(n, size_t{1} << 30));
    const ssize_t got = ::pread(fd, out, want, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    KVB_CHECK(got >= 0) << path << ": read of " << n << " bytes at offset " << offset
                        << " failed: " << std::strerror(errno);
    KVB_CHECK(got > 0) << path << ": unexpected end of file at offset " << offset << " (" << n
                       << " more bytes expected; was the file truncated after opening?)";
    out += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
}

}  // namespace kvb::formats
