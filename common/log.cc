// stderr logger; one write per line so lines of different ranks do not interleave mid-line.
#include "common/log.h"

#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include "common/error.h"

namespace kvb {
namespace {
LogLevel initial_level() {
  const char* env = std::getenv("KVB_LOG_LEVEL");
  if (env && *env >= '0' && *env <= '3') return static_cast<LogLevel>(*env - '0');
  return LogLevel::kInfo;
}
LogLevel g_level = initial_level();
std::mutex g_mutex;
}  // namespace

void set_log_level(LogLevel level) { g_level = level; }
LogLevel log_level() { return g_level; }

void log_line(LogLevel level, const std::string& text) {
  static const char kTag[] = {'E', 'W', 'I', 'D'};
  std::string line = "[kvb ";
  if (process_world_size() > 1) {
    line += "r" + std::to_string(process_rank()) + "/" + std::to_string(process_world_size()) +
            " " + process_host() + " ";
  }
  line += kTag[static_cast<int>(level)];
  line += "] ";
  line += text;
  line += '\n';
  std::lock_guard<std::mutex> lock(g_mutex);
  ssize_t ignored = ::write(2, line.data(), line.size());
  (void)ignored;
}
}  // namespace kvb
