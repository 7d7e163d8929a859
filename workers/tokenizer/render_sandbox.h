// An isolated, bounded run of an interpreter over hostile input: the Jinja chat templates that
// model files carry (jinja_chat_template.h). The interpreter (minja) is a fetched header that we do
// not edit, and nothing inside one process can stop it: a render of `'' * 10**12` loops without
// allocating or calling back, a stack overflow kills the process, and an output stream swallows the
// allocation failure of `'x' * 3000000000` and then spins for minutes. So the work runs in a forked
// child process that the caller can kill:
//   - the parent waits at most `seconds` for the child's answer, then kills it (SIGKILL);
//   - inside the child, every allocation the work makes is counted (kvbench's replacement of the
//     global operator new, active only on the child's render thread): more than `max_steps`
//     allocations (every loop iteration, call and value of the interpreter makes at least one),
//     more than `max_live_bytes` held at once, or more than `max_stack_bytes` of stack in use when
//     allocating (each level of a recursive macro or loop allocates, ~2.6 KB of stack a level) ends
//     the child at once with the limit named;
//   - a result longer than `max_output_bytes` is refused;
//   - a child that dies any other way (a signal) is reported with the signal's name.
// The child never returns into the caller's code: it writes its answer to a pipe and _exit()s, so
// no destructor, atexit handler or MPI state of the parent runs in it. Cost: one fork per call
// (page tables of the calling process; ~1 ms at 1 GB resident), and calls are rare (a model's
// template is rendered a few times per model load: chat prompts are split around a sentinel once).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace kvb::tokenizer {

struct SandboxLimits {
  double seconds = 10;                     // wall time of one call, child start to answer
  uint64_t max_steps = 10'000'000;         // allocations made by the work
  size_t max_live_bytes = size_t{512} << 20;   // bytes the work holds at once
  size_t max_stack_bytes = size_t{2} << 20;    // stack in use below the work's entry (recursion)
  size_t max_output_bytes = size_t{64} << 20;  // length of the result
  size_t thread_stack_bytes = size_t{16} << 20;  // the child's render thread (> max_stack_bytes)
};

struct SandboxResult {
  enum class Status {
    kOk,          // output holds the work's result
    kFailed,      // the work threw: message holds what()
    kLimit,       // a limit was exceeded: message names it and its value
    kCrashed,     // the child died by a signal: message names it
    kUnavailable  // the child could not be started (fork or pipe failed): message says why
  };
  Status status = Status::kOk;
  std::string output;
  std::string message;
};

// Runs `work` in a forked child under `limits` and returns what it produced. `work` runs on a
// thread of its own in the child, with the allocation guard armed; it may throw (kFailed).
SandboxResult run_sandboxed(const std::function<std::string()>& work, const SandboxLimits& limits);

}  // namespace kvb::tokenizer
