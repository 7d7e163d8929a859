// kvb::Error construction and the process identity used in messages.
#include "common/error.h"

#include <unistd.h>

#include <climits>
#include <cstring>

namespace kvb {
namespace {
int g_rank = 0;
int g_world = 1;
std::string& host_storage() {
  static std::string host = [] {
    char buf[HOST_NAME_MAX + 1] = {0};
    if (gethostname(buf, sizeof(buf) - 1) != 0) return std::string("unknown");
    return std::string(buf);
  }();
  return host;
}
}  // namespace

void set_process_identity(int rank, int world_size) {
  g_rank = rank;
  g_world = world_size;
}
int process_rank() { return g_rank; }
int process_world_size() { return g_world; }
const std::string& process_host() { return host_storage(); }

namespace detail {
ErrorBuilder::ErrorBuilder(const char* file, int line, const char* what, ErrorKind kind)
    : file_(file), line_(line), what_(what), kind_(kind) {}

ErrorBuilder::~ErrorBuilder() noexcept(false) {
  std::string text = msg_.str();
  std::ostringstream full;
  if (kind_ == ErrorKind::kUsage) {
    // User-facing errors read as a sentence; the source location is noise for them.
    full << text;
  } else {
    const char* base = std::strrchr(file_, '/');
    full << (base ? base + 1 : file_) << ":" << line_ << " ";
    if (!what_.empty()) full << what_ << (text.empty() ? "" : ": ");
    full << text;
  }
  if (g_world > 1) full << " [rank " << g_rank << " host " << process_host() << "]";
  throw Error(full.str(), kind_);
}
}  // namespace detail
}  // namespace kvb
