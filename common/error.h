// One error type and one family of check macros for all host code (STYLE.md "Errors").
// The message is written for the user: what is wrong with their input and how to fix it, plus
// "[rank r host h]" on multi-rank runs. Where it was raised ("<file>:<line> check failed: <cond>")
// travels beside it (Error::origin) for the debug log (kvbench -v); a failed call of a library
// (CUDA, SQLite) keeps its function in the message. A check without text and KVB_ASSERT are
// our own bugs: their message says "internal error" and keeps the location. main() turns
// errors into exit codes.
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
  Error(std::string msg, ErrorKind kind = ErrorKind::kRuntime, std::string origin = "")
      : std::runtime_error(std::move(msg)), kind_(kind), origin_(std::move(origin)) {}
  ErrorKind kind() const { return kind_; }
  // Where a check macro raised it: "<file>:<line> check failed: <cond>" (or "<file>:<line>
  // <call>" for a failed library call); empty for an Error built by hand. Not part of what():
  // the CLI logs it at debug level (-v / --verbose / KVB_LOG_LEVEL=3).
  const std::string& origin() const { return origin_; }

 private:
  ErrorKind kind_;
  std::string origin_;
};

// Rank and host used in error messages and log prefixes; set once by main (and by MPI init).
void set_process_identity(int rank, int world_size);
int process_rank();
int process_world_size();
const std::string& process_host();

namespace detail {
// What raised an error: a failed library call (`what` is the call; its function is kept in the
// message: CUDA, SQLite), a failed check of input (KVB_CHECK, KVB_USAGE_CHECK, KVB_FAIL: the
// streamed text is the message; without text it is an internal error) or a broken invariant of our
// own code (KVB_ASSERT: always an internal error).
enum class ErrorSource { kCall, kCheck, kAssert };

// Collects a streamed message and throws kvb::Error when destroyed (used by KVB_CHECK(...) << ...).
class ErrorBuilder {
 public:
  ErrorBuilder(const char* file, int line, const char* what, ErrorKind kind,
               ErrorSource source = ErrorSource::kCall);
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
  ErrorSource source_;
};
struct Voidify {
  void operator&(const ErrorBuilder&) {}
};
}  // namespace detail
}  // namespace kvb

// KVB_CHECK(cond) << "context";  throws kvb::Error whose message is the context: write it for
// the user (the file, line and key of their input that is wrong, and how to fix it).
#define KVB_CHECK(cond)                                                                           \
  (cond) ? (void)0                                                                                \
         : ::kvb::detail::Voidify() &                                                             \
               ::kvb::detail::ErrorBuilder(__FILE__, __LINE__, #cond, ::kvb::ErrorKind::kRuntime, \
                                           ::kvb::detail::ErrorSource::kCheck)
// KVB_USAGE_CHECK: same, for bad user input (exit code 2).
#define KVB_USAGE_CHECK(cond)                                                                   \
  (cond) ? (void)0                                                                              \
         : ::kvb::detail::Voidify() &                                                           \
               ::kvb::detail::ErrorBuilder(__FILE__, __LINE__, #cond, ::kvb::ErrorKind::kUsage, \
                                           ::kvb::detail::ErrorSource::kCheck)
// KVB_FAIL() << "..."; unconditional runtime error.
#define KVB_FAIL()                                                                \
  ::kvb::detail::ErrorBuilder(__FILE__, __LINE__, "", ::kvb::ErrorKind::kRuntime, \
                              ::kvb::detail::ErrorSource::kCheck)
#define KVB_USAGE_FAIL()                                                        \
  ::kvb::detail::ErrorBuilder(__FILE__, __LINE__, "", ::kvb::ErrorKind::kUsage, \
                              ::kvb::detail::ErrorSource::kCheck)
// Invariants of our own code (not user input); always on, they are cheap where used. The
// message says "internal error" and names the condition and the source location.
#define KVB_ASSERT(cond)                                                                          \
  (cond) ? (void)0                                                                                \
         : ::kvb::detail::Voidify() &                                                             \
               ::kvb::detail::ErrorBuilder(__FILE__, __LINE__, #cond, ::kvb::ErrorKind::kRuntime, \
                                           ::kvb::detail::ErrorSource::kAssert)
