// The embedded CPython that runs policies written in Python (`--policy python`, python_policy.cc;
// POLICIES.md "A policy in Python"). One interpreter per process (each MPI rank has its own),
// started on first use and never finalized. Every call into user code runs under limits: a wall
// time (a watchdog raises PolicyTimeout, a BaseException, in the calling
// thread's Python code, again every 100 ms until it returns) and an address-space
// ceiling above what the process holds when the call starts (an allocation past it fails with
// MemoryError). Errors become kvb::Error with the exception type, message and the user file's
// line; the full traceback goes to the log.
//
// Only this file's .cc and python_policy.cc include Python.h.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <initializer_list>
#include <string>

namespace kvb::policies::python {

// An owned reference (Py_XDECREF on destruction; hold the GIL when it dies).
class Ref {
 public:
  Ref() = default;
  static Ref steal(PyObject* p) { return Ref(p); }
  static Ref borrow(PyObject* p) {
    Py_XINCREF(p);
    return Ref(p);
  }
  Ref(const Ref& o) : p_(o.p_) { Py_XINCREF(p_); }
  Ref& operator=(const Ref& o) {
    if (this != &o) {
      Py_XINCREF(o.p_);
      Py_XDECREF(p_);
      p_ = o.p_;
    }
    return *this;
  }
  Ref(Ref&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  Ref& operator=(Ref&& o) noexcept {
    if (this != &o) {
      Py_XDECREF(p_);
      p_ = o.p_;
      o.p_ = nullptr;
    }
    return *this;
  }
  ~Ref() { Py_XDECREF(p_); }
  PyObject* get() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }
  void reset() {
    Py_XDECREF(p_);
    p_ = nullptr;
  }

 private:
  explicit Ref(PyObject* p) : p_(p) {}
  PyObject* p_ = nullptr;
};

// Starts the interpreter if needed (thread-safe) and imports numpy; throws a usage error that
// says how to install what is missing.
void ensure_interpreter();

// Holds the GIL for its scope (ensure_interpreter first).
class Gil {
 public:
  Gil();
  ~Gil();
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;

 private:
  PyGILState_STATE state_;
};

struct Limits {
  double time_s = 60;      // wall time of one call
  double memory_gb = 4;    // address space the call may add
};

// The user's file and the function a call runs, for messages ("my_policy.py: score()").
struct Site {
  std::string file;
  std::string function;
};

// fn(*args) under `limits`, with the GIL held by the caller. A Python exception (the user's,
// or the watchdog's PolicyTimeout, or a MemoryError) throws kvb::Error naming the site, the
// exception and the user file's line (MemoryError: ErrorKind::kOutOfMemory), after logging the
// traceback. Never returns null.
Ref call(PyObject* fn, std::initializer_list<PyObject*> args, const Limits& limits,
         const Site& site);

// Throws the pending Python exception as call() does (after a failed C API call on user data).
[[noreturn]] void throw_pending(const Site& site, const char* fallback);

// Loads the Python file at `path` (absolute) as a module, once per process and content (a
// changed file is loaded again), running its top level under `limits`. Its folder goes first on
// sys.path so it may import its neighbours. With the GIL held.
Ref load_module(const std::string& path, const Limits& limits);

// A read-only numpy array over memory kvbench owns (no copy): dtype float32 ('f') or int32
// ('i'), shape and strides in elements. Valid only while that memory is; python_policy.cc checks
// that no reference outlives the call. With the GIL held.
Ref array_view(const void* data, char format, std::initializer_list<Py_ssize_t> shape,
               std::initializer_list<Py_ssize_t> strides);
// A numpy array owning a copy of `n` int32 values.
Ref int_array(const int32_t* values, Py_ssize_t n);

// copy.deepcopy(obj) (a policy's state when a cache forks). With the GIL held.
Ref deep_copy(PyObject* obj, const Site& site);

// The numpy module (after ensure_interpreter; borrowed).
PyObject* numpy();

}  // namespace kvb::policies::python
