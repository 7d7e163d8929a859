// Reading an untrusted model file through a descriptor, shared by the GGUF and safetensors
// readers: open a regular file read-only (its size bounds every later count and offset), and
// read exactly n bytes at an offset.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <string>

namespace kvb::formats {

// An open file descriptor, closed on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens path read-only into *fd and returns the file's size. Throws a usage error (the path came
// from the user) if it cannot be opened or is not a regular file; `kind` names the expected
// format in the message ("GGUF", "safetensors"). The open does not block on a FIFO.
uint64_t open_regular(const std::string& path, const char* kind, Fd* fd);

// For a file read through a path (std::ifstream) rather than open_regular: stats it, following
// symbolic links, and returns its size. Throws a usage error naming `what` ("model file",
// "tokenizer") and the path if it is not a regular file: a FIFO would block the open forever, a
// device (/dev/zero) would never end. A missing file is left to the caller's open, which names it.
uint64_t regular_file_size(const std::string& path, const char* what);

// pread that retries short reads and EINTR; throws, naming the path and the offset, on errors and
// on early end of file.
void pread_fully(int fd, const std::string& path, uint64_t offset, void* dst, uint64_t n);

}  // namespace kvb::formats
