// The regular-file check of every user-named file before it is read (common/file_io.h).
#include "common/file_io.h"

#include <system_error>

#include "common/error.h"

namespace kvb {

std::string non_regular_file_kind(std::filesystem::file_type type) {
  using std::filesystem::file_type;
  switch (type) {
    case file_type::regular:
    case file_type::not_found:
    case file_type::none:
      return "";
    case file_type::fifo:
      return "a FIFO (named pipe)";
    case file_type::directory:
      return "a directory";
    case file_type::character:
      return "a character device";
    case file_type::block:
      return "a block device";
    case file_type::socket:
      return "a socket";
    default:
      return "of an unknown type";
  }
}

std::string non_regular_file_kind(const std::string& path) {
  std::error_code ec;
  // status() follows symbolic links; a dangling one is not_found, like a missing file.
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (ec) return "";  // cannot be examined (a path component is not a folder, no permission)
  return non_regular_file_kind(st.type());
}

void require_regular_file(const std::string& path, const std::string& what,
                          const std::string& fix) {
  const std::string kind = non_regular_file_kind(path);
  KVB_USAGE_CHECK(kind.empty()) << what << " '" << path << "' is " << kind
                                << ", not a regular file" << (fix.empty() ? "" : "; " + fix);
}

}  // namespace kvb
