// The SHA-256 of a model file, which every unit key of the model hashes (DESIGN.md "Work unit and
// its key"), read from the results store's digest cache (results/schema.sql `file_digests`) when
// the file is unchanged, so that resuming a sweep of a 16 GB model does not read it again.
#pragma once

#include <string>

#include "results/store.h"

namespace kvb::harness {

// stat(2) of the file at `path` (symbolic links followed), as the cache keys it: the canonical
// path, size, st_mtim in nanoseconds and st_ino. Throws naming the path when it cannot be read.
results::FileStamp file_stamp(const std::string& path);

struct ModelDigest {
  std::string sha256;
  bool cached = false;  // true: taken from the store; false: the file was read and hashed
};

// The stored digest when the file's stamp equals the one it was hashed under; otherwise reads the
// whole file, stores the digest under the stamp taken before reading (so a file changed while it
// was read is hashed again next time) and returns it. Logs which of the two happened. A
// directory (Hugging Face checkpoint folder): the SHA-256 of its files' names and digests
// (model_digest.cc folder_sha256), each file cached as above.
ModelDigest model_file_sha256(results::Store& store, const std::string& path);

}  // namespace kvb::harness
