// run_sandboxed: a forked child under an allocation guard and a deadline (render_sandbox.h).
#include "workers/tokenizer/render_sandbox.h"

#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace kvb::tokenizer {
namespace {

// The child's answer on the pipe: one status byte, an 8-byte length, then that many bytes.
constexpr char kOk = 'O', kFailed = 'F', kLimit = 'L';
constexpr int kLimitExit = 3;

// Armed on the child's render thread only (t_guard is null everywhere else, in every process).
struct AllocGuard {
  const char* stack_base = nullptr;
  SandboxLimits limits;
  int fd = -1;
  int64_t live = 0;
  uint64_t steps = 0;
};
thread_local AllocGuard* t_guard = nullptr;

bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool write_record(int fd, char status, const char* payload, uint64_t n) {
  char head[9];
  head[0] = status;
  std::memcpy(head + 1, &n, 8);
  return write_all(fd, head, 9) && write_all(fd, payload, n);
}

// Ends the child from inside an allocation: no unwinding (a recursion thousands of levels deep
// would rebuild its error message at every level), no allocation (we are in operator new).
[[noreturn]] void trip(const AllocGuard& g, const char* text) {
  t_guard = nullptr;
  write_record(g.fd, kLimit, text, std::strlen(text));
  ::_exit(kLimitExit);
}

void before_allocation(AllocGuard& g, size_t n) {
  char buf[320];
  const char* here = static_cast<const char*>(__builtin_frame_address(0));
  const size_t stack = g.stack_base > here ? static_cast<size_t>(g.stack_base - here) : 0;
  if (stack > g.limits.max_stack_bytes) {
    std::snprintf(buf, sizeof buf,
                  "recursion depth limit: the render went deeper than %zu KiB of stack (about "
                  "%zu levels of a macro or a recursive loop calling itself)",
                  g.limits.max_stack_bytes >> 10, g.limits.max_stack_bytes / 2600);
    trip(g, buf);
  }
  if (++g.steps > g.limits.max_steps) {
    std::snprintf(buf, sizeof buf,
                  "evaluation step limit: the render made more than %llu steps (counted as the "
                  "interpreter's allocations; a real template makes a few thousand)",
                  static_cast<unsigned long long>(g.limits.max_steps));
    trip(g, buf);
  }
  if (g.live + static_cast<int64_t>(n) > static_cast<int64_t>(g.limits.max_live_bytes)) {
    std::snprintf(buf, sizeof buf,
                  "memory limit: the render built more than %zu MiB of values (asked for %zu "
                  "bytes more while holding %lld)",
                  g.limits.max_live_bytes >> 20, n, static_cast<long long>(g.live));
    trip(g, buf);
  }
}

struct ChildJob {
  const std::function<std::string()>* work;
  AllocGuard guard;
};

void* child_render(void* arg) {
  ChildJob& job = *static_cast<ChildJob*>(arg);
  AllocGuard& g = job.guard;
  g.stack_base = static_cast<const char*>(__builtin_frame_address(0));
  std::string out;
  char status = kOk;
  t_guard = &g;
  try {
    out = (*job.work)();
  } catch (const std::exception& e) {
    status = kFailed;
    t_guard = nullptr;
    out = e.what();
  } catch (...) {
    status = kFailed;
    t_guard = nullptr;
    out = "unknown exception";
  }
  t_guard = nullptr;
  if (status == kOk && out.size() > g.limits.max_output_bytes) {
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "output size limit: the render wrote %zu bytes, more than %zu MiB", out.size(),
                  g.limits.max_output_bytes >> 20);
    trip(g, buf);
  }
  write_record(g.fd, status, out.data(), out.size());
  ::_exit(0);
}

// The child: isolated from the caller's signals and life, bounded in address space as a backstop
// (the guard counts operator new; this also bounds anything allocated with malloc), then the work.
[[noreturn]] void run_child(int fd, const std::function<std::string()>& work,
                            const SandboxLimits& limits, pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGCHLD, SIGSEGV,
                SIGBUS, SIGABRT, SIGFPE, SIGILL}) {
    ::signal(s, SIG_DFL);
  }
  ::signal(SIGPIPE, SIG_IGN);
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    unsigned long long pages = 0;
    if (std::fscanf(f, "%llu", &pages) == 1) {
      const rlim_t room = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) +
                          2 * limits.max_live_bytes + limits.max_output_bytes +
                          limits.thread_stack_bytes + (rlim_t{256} << 20);
      rlimit cur{};
      if (::getrlimit(RLIMIT_AS, &cur) == 0 && (cur.rlim_cur == RLIM_INFINITY || cur.rlim_cur > room)) {
        rlimit lim{room, cur.rlim_max};
        ::setrlimit(RLIMIT_AS, &lim);
      }
    }
    std::fclose(f);
  }
  ChildJob job;  // lives until _exit: this frame never returns
  job.work = &work;
  job.guard.limits = limits;
  job.guard.fd = fd;
  pthread_attr_t attr;
  pthread_t thread;
  if (::pthread_attr_init(&attr) == 0 &&
      ::pthread_attr_setstacksize(&attr, limits.thread_stack_bytes) == 0 &&
      ::pthread_create(&thread, &attr, child_render, &job) == 0) {
    ::pthread_join(thread, nullptr);  // child_render _exit()s; not reached
    ::_exit(1);
  }
  child_render(&job);  // no thread: this stack (the guard measures from here)
  ::_exit(1);
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  const char* descr = ::sigdescr_np(sig);
  std::string s = "signal " + std::to_string(sig);
  if (abbrev) s += std::string(" (SIG") + abbrev + (descr ? std::string(": ") + descr : "") + ")";
  return s;
}

}  // namespace

SandboxResult run_sandboxed(const std::function<std::string()>& work, const SandboxLimits& limits) {
  SandboxResult r;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    r.status = SandboxResult::Status::kUnavailable;
    r.message = std::string("cannot create a pipe for the isolated renderer: ") + std::strerror(errno);
    return r;
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    r.status = SandboxResult::Status::kUnavailable;
    r.message = std::string("cannot start the isolated renderer (fork): ") + std::strerror(err);
    return r;
  }
  if (pid == 0) {
    ::close(fds[0]);
    run_child(fds[1], work, limits, parent);
  }
  ::close(fds[1]);

  // Read the answer until the child closes the pipe (it exits), or the deadline.
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration<double>(limits.seconds);
  const size_t cap = limits.max_output_bytes + 9 + 4096;
  std::string data;
  bool timed_out = false, too_long = false;
  char buf[65536];
  for (;;) {
    const double left = std::chrono::duration<double>(deadline - clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;  // the loop's clock decides
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    data.append(buf, static_cast<size_t>(n));
    if (data.size() > cap) {
      too_long = true;
      break;
    }
  }
  ::close(fds[0]);
  if (timed_out || too_long) ::kill(pid, SIGKILL);
  int st = 0;
  pid_t w;
  do {
    w = ::waitpid(pid, &st, 0);
  } while (w < 0 && errno == EINTR);

  if (timed_out) {
    r.status = SandboxResult::Status::kLimit;
    char msg[200];
    std::snprintf(msg, sizeof msg,
                  "time limit: the render took longer than %g s (stopped; a real template takes "
                  "milliseconds)",
                  limits.seconds);
    r.message = msg;
    return r;
  }
  if (too_long) {
    r.status = SandboxResult::Status::kLimit;
    r.message = "output size limit: the render wrote more than " +
                std::to_string(limits.max_output_bytes >> 20) + " MiB";
    return r;
  }
  uint64_t len = 0;
  if (data.size() >= 9) std::memcpy(&len, data.data() + 1, 8);
  const bool complete = data.size() >= 9 && data.size() - 9 == len;
  if (complete && (data[0] == kOk || data[0] == kFailed || data[0] == kLimit)) {
    r.status = data[0] == kOk       ? SandboxResult::Status::kOk
               : data[0] == kFailed ? SandboxResult::Status::kFailed
                                    : SandboxResult::Status::kLimit;
    (r.status == SandboxResult::Status::kOk ? r.output : r.message) = data.substr(9);
    return r;
  }
  r.status = SandboxResult::Status::kCrashed;
  if (w == pid && WIFSIGNALED(st)) {
    r.message = "the renderer died with " + signal_name(WTERMSIG(st));
    if (WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS) {
      r.message += " (a recursion deeper than its " +
                   std::to_string(limits.thread_stack_bytes >> 20) + " MiB stack?)";
    }
  } else if (w == pid && WIFEXITED(st)) {
    r.message = "the renderer exited with status " + std::to_string(WEXITSTATUS(st)) +
                " without an answer";
  } else {
    r.message = "the renderer ended without an answer";
  }
  return r;
}

}  // namespace kvb::tokenizer

// kvbench's replacement of the global allocation functions (the standard's replaceable
// operator new / delete): malloc and free, plus the sandbox's count on a thread where it is armed.
// Everywhere else the cost is one thread-local load per allocation. The array, nothrow and sized
// forms of libstdc++ call these.
void* operator new(std::size_t n) {
  using kvb::tokenizer::t_guard;
  if (t_guard != nullptr) [[unlikely]] {
    kvb::tokenizer::before_allocation(*t_guard, n);
  }
  void* p = std::malloc(n != 0 ? n : 1);
  if (p == nullptr) throw std::bad_alloc();
  if (t_guard != nullptr) [[unlikely]] {
    t_guard->live += static_cast<int64_t>(::malloc_usable_size(p));
  }
  return p;
}

void operator delete(void* p) noexcept {
  using kvb::tokenizer::t_guard;
  if (t_guard != nullptr && p != nullptr) [[unlikely]] {
    t_guard->live -= static_cast<int64_t>(::malloc_usable_size(p));
  }
  std::free(p);
}

void operator delete(void* p, std::size_t) noexcept { operator delete(p); }
