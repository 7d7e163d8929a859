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
ErrorBuilder::ErrorBuilder(const char* file, int line, const char* what, ErrorKind kind,
                           ErrorSource source)
    : file_(file), line_(line), what_(what), kind_(kind), source_(source) {}

ErrorBuilder::~ErrorBuilder() noexcept(false) {
  const std::string text = msg_.str();
  const char* base = std::strrchr(file_, '/');
  const std::string where = std::string(base ? base + 1 : file_) + ":" + std::to_string(line_);
  std::string origin = where;
  if (!what_.empty()) origin += (source_ == ErrorSource::kCall ? " " : " check failed: ") + what_;
  std::ostringstream full;
  if (source_ == ErrorSource::kAssert || (source_ == ErrorSource::kCheck && text.empty())) {
    // Not the user's input but our bug: say so, and keep what a bug report needs.
    full << "internal error (a bug in kvbench): "
         << (what_.empty() ? std::string("unexpected failure") : "check failed: " + what_)
         << (text.empty() ? "" : ": ") << text << " (" << where << ")";
  } else if (source_ == ErrorSource::kCall) {
    // A library call that failed (CUDA, cuBLAS, SQLite): its function names the operation; the
    // C++ arguments are for the debug log.
    full << what_.substr(0, what_.find('(')) << (text.empty() ? " failed" : ": ") << text;
  } else {
    // A check of input: its text says what is wrong and how to fix it; the location and the
    // C++ condition are for the debug log (Error::origin).
    full << text;
  }
  if (g_world > 1) full << " [rank " << g_rank << " host " << process_host() << "]";
  throw Error(full.str(), kind_, origin);
}
}  // namespace detail
}  // namespace kvb
