// Logging to stderr, prefixed with rank and host on multi-rank runs (STYLE.md "Output").
// Levels: 0 error, 1 warn, 2 info (default), 3 debug; set with kvbench -v / --verbose (debug)
// or KVB_LOG_LEVEL.
#pragma once

#include <sstream>
#include <string>

namespace kvb {
enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };
void set_log_level(LogLevel level);
LogLevel log_level();
void log_line(LogLevel level, const std::string& text);

namespace detail {
class LogBuilder {
 public:
  explicit LogBuilder(LogLevel level) : level_(level) {}
  ~LogBuilder() { log_line(level_, msg_.str()); }
  template <typename T>
  LogBuilder& operator<<(const T& v) {
    msg_ << v;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream msg_;
};
}  // namespace detail
}  // namespace kvb

#define KVB_LOG(level)                                                  \
  if (static_cast<int>(::kvb::LogLevel::level) > static_cast<int>(::kvb::log_level())) { \
  } else                                                                \
    ::kvb::detail::LogBuilder(::kvb::LogLevel::level)
#define KVB_LOG_INFO KVB_LOG(kInfo)
#define KVB_LOG_WARN KVB_LOG(kWarn)
#define KVB_LOG_DEBUG KVB_LOG(kDebug)
