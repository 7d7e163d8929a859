// One error type and one family of check macros for all host code (STYLE.md "Errors").
// Messages carry "<file>:<line> <what> [rank r host h]"; main() turns them into exit codes.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace kvb {

// Exit-code class of an error: usage/config errors exit 2, runtime failures exit 1.
// kOutOfMemory: a device allocation failed (cudaErrorMemoryAllocation, cuBLAS ALLOC_FAILED): a
// runtime error that a sweep records as the unit's `oom` status, like std::bad_alloc on the host.
enum class ErrorKind { kRuntime, kUsage, kOutOfMemory };

class Error : public std::runtime_error {
 public:
  Error(std::string msg, ErrorKind kind = ErrorKind::kRuntime)
      : std::runtime_error(std::move(msg)), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Rank and host used in error messages and log prefixes; set once by main (and by MPI init).
void set_process_identity(int rank, int world_size);
int process_rank();
int process_world_size();
const std::string& process_host();

namespace detail {
// Collects a streamed message and throws kvb::Error when destroyed (used by KVB_CHECK(...) << ...).
class ErrorBuilder {
 public:
  ErrorBuilder(const char* file, int line, const char* what, ErrorKind kind);
  [[noreturn]] ~ErrorBuilder() noexcept(false);
  template <typename T>
  ErrorBuilder& operator<<(const T& v) {
    msg_ << v;
    return *this;
  }

 private:
  std::ostringstream msg_;
  const char* file_;
  int line_;
  std::string what_;
  ErrorKind kind_;
};
struct Voidify {
  void operator&(const ErrorBuilder&) {}
};
}  // namespace detail
}  // namespace kvb

// KVB_CHECK(cond) << "context";  throws kvb::Error naming the failed condition.
#define KVB_CHECK(cond)                                                                      \
  (cond) ? (void)0                                                                         \
         : ::kvb::detail::Voidify() & ::kvb::detail::ErrorBuilder(__FILE__, __LINE__,      \
                                                                  "check failed: " #cond,  \
                                                                  ::kvb::ErrorKind::kRuntime)
// KVB_USAGE_CHECK: same, for bad user input (exit code 2).
#define KVB_USAGE_CHECK(cond)                                                               \
  (cond) ? (void)0                                                                          \
         : ::kvb::detail::Voidify() & ::kvb::detail::ErrorBuilder(__FILE__, __LINE__, "",   \
                                                                  ::kvb::ErrorKind::kUsage)
// KVB_FAIL() << "..."; unconditional runtime error.
#define KVB_FAIL() \
  ::kvb::detail::ErrorBuilder(__FILE__, __LINE__, "", ::kvb::ErrorKind::kRuntime)
#define KVB_USAGE_FAIL() \
  ::kvb::detail::ErrorBuilder(__FILE__, __LINE__, "", ::kvb::ErrorKind::kUsage)
// Invariants of our own code (not user input); always on, they are cheap where used.
#define KVB_ASSERT(cond) KVB_CHECK(cond) << "internal invariant violated; "
