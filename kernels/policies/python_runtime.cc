// The embedded CPython of python_runtime.h.
#include "kernels/policies/python_runtime.h"  // Python.h first (it sets feature macros)

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/sha256.h"

#ifndef KVB_PYTHON_EXECUTABLE
#define KVB_PYTHON_EXECUTABLE "python3"
#endif

namespace kvb::policies::python {
namespace {

// Helpers written in Python: loading a file as a module, describing an exception, venvs.
constexpr const char* kBootstrap = R"PY(
import copy, importlib.util, os, sys, traceback

def load(path, name):
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

def describe(exc, path):
    where = ''
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename == path:
            where = '%s:%d' % (frame.filename, frame.lineno)
            break
    text = ''.join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return type(exc).__name__, str(exc), where, text

def add_venv(venv):
    tag = 'python%d.%d' % sys.version_info[:2]
    site_dir = os.path.join(venv, 'lib', tag, 'site-packages')
    if not os.path.isdir(site_dir):
        return 'has no lib/%s/site-packages (kvbench embeds Python %d.%d)' % (
            tag, sys.version_info[0], sys.version_info[1])
    import site
    site.addsitedir(site_dir)
    # The venv's packages before the system's (as its own interpreter would order them).
    sys.path.remove(site_dir)
    sys.path.insert(0, site_dir)
    return ''

class PolicyTimeout(BaseException):
    """Raised by kvbench's watchdog in a call past its time limit (a BaseException, so that
    `except Exception` in a policy cannot swallow it; raised again every 100 ms until the call
    returns)."""

def deep_copy(obj):
    return copy.deepcopy(obj)
)PY";

struct Runtime {
  Ref bootstrap;
  Ref timeout;  // the bootstrap's PolicyTimeout class
  Ref numpy;
  Ref asarray;
  std::string failure;  // why the interpreter or numpy is unusable ("" when usable)
};

Runtime& runtime() {
  static Runtime* r = new Runtime();  // never destroyed: the interpreter is never finalized
  return *r;
}

std::string fetch_text() {
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  std::string text = "unknown error";
  if (value) {
    Ref s = Ref::steal(PyObject_Str(value));
    if (s) {
      const char* c = PyUnicode_AsUTF8(s.get());
      if (c) text = c;
    }
  }
  PyErr_Clear();
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  return text;
}

void start() {
  Runtime& rt = runtime();
  PyConfig config;
  // Isolated: PYTHONHOME, PYTHONPATH and the user site do not leak in (a pyenv on PATH would
  // otherwise mix its standard library with this libpython); the interpreter finds its own from
  // the executable it was built with. VIRTUAL_ENV is honoured below.
  PyConfig_InitIsolatedConfig(&config);
  config.install_signal_handlers = 0;  // kvbench's own SIGINT/SIGTERM handling stays
  config.site_import = 1;
  config.write_bytecode = 0;
  PyStatus st = PyConfig_SetBytesString(&config, &config.program_name, KVB_PYTHON_EXECUTABLE);
  if (!PyStatus_Exception(st)) st = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(st)) {
    rt.failure = std::string("the embedded Python (") + KVB_PYTHON_EXECUTABLE +
                 ") did not start: " + (st.err_msg ? st.err_msg : "unknown error");
    return;
  }
  {
    Ref code = Ref::steal(Py_CompileString(kBootstrap, "<kvbench python policy runtime>",
                                           Py_file_input));
    if (code) {
      rt.bootstrap = Ref::steal(PyImport_ExecCodeModule("_kvbench_policy_runtime", code.get()));
    }
  }
  if (rt.bootstrap) rt.timeout = Ref::steal(PyObject_GetAttrString(rt.bootstrap.get(), "PolicyTimeout"));
  if (!rt.bootstrap || !rt.timeout) {
    rt.failure = "the embedded Python's bootstrap failed: " + fetch_text();
  }
  if (rt.failure.empty()) {
    if (const char* venv = std::getenv("VIRTUAL_ENV"); venv && *venv) {
      Ref r = Ref::steal(PyObject_CallMethod(rt.bootstrap.get(), "add_venv", "s", venv));
      const char* why = r ? PyUnicode_AsUTF8(r.get()) : nullptr;
      if (!r) {
        KVB_LOG_WARN << "python policy: VIRTUAL_ENV=" << venv << " not used: " << fetch_text();
      } else if (why && *why) {
        KVB_LOG_WARN << "python policy: VIRTUAL_ENV=" << venv << " not used: it " << why;
      }
    }
    rt.numpy = Ref::steal(PyImport_ImportModule("numpy"));
    if (!rt.numpy) {
      rt.failure = "the Python policy needs numpy in the embedded Python (" +
                   std::string(KVB_PYTHON_EXECUTABLE) + ", " + Py_GetVersion() +
                   "), whose import failed: " + fetch_text() +
                   ". Install it (Debian: apt install python3-numpy; scripts/setup.sh does), or "
                   "activate a virtual environment of that Python version that has it";
    } else {
      rt.asarray = Ref::steal(PyObject_GetAttrString(rt.numpy.get(), "asarray"));
      if (!rt.asarray) rt.failure = "numpy has no asarray: " + fetch_text();
    }
  }
  // Every local reference is gone by now: release the GIL (every use takes it through Gil).
  PyEval_SaveThread();
}

// Raises PolicyTimeout in the Python code of a thread whose call ran past its deadline
// (PyThreadState_SetAsyncExc: checked between bytecodes, so a call blocked inside C code is
// interrupted when it returns to Python).
class Watchdog {
 public:
  Watchdog() : thread_([this] { loop(); }) { thread_.detach(); }

  uint64_t arm(double seconds, unsigned long thread_id) {
    std::lock_guard<std::mutex> lock(mu_);
    ++generation_;
    armed_ = true;
    fired_ = false;
    target_ = thread_id;
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(seconds));
    cv_.notify_all();
    return generation_;
  }
  // Whether the deadline fired for this call. With the GIL held: a PolicyTimeout set but not yet
  // raised (the call returned first) is withdrawn.
  bool disarm(uint64_t generation) {
    bool fired = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (generation_ == generation) {
        armed_ = false;
        fired = fired_;
      }
      cv_.notify_all();
    }
    if (fired) PyThreadState_SetAsyncExc(target_, nullptr);
    return fired;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return armed_; });
      const uint64_t gen = generation_;
      auto over = [&] { return !armed_ || generation_ != gen; };
      if (cv_.wait_until(lock, deadline_, over)) continue;
      // Past the deadline: PolicyTimeout, again every 100 ms until the call returns (a policy
      // that catches it and goes on gets it again).
      while (!over()) {
        const unsigned long target = target_;
        lock.unlock();
        const PyGILState_STATE g = PyGILState_Ensure();  // the call yields it between bytecodes
        lock.lock();
        if (!over()) {
          PyThreadState_SetAsyncExc(target, runtime().timeout.get());
          fired_ = true;
        }
        lock.unlock();
        PyGILState_Release(g);
        lock.lock();
        cv_.wait_for(lock, std::chrono::milliseconds(100), over);
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
  bool armed_ = false;
  bool fired_ = false;
  unsigned long target_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  std::thread thread_;
};

Watchdog& watchdog() {
  static Watchdog* w = new Watchdog();  // detached thread: never destroyed
  return *w;
}

// The address space the process holds now, in bytes (/proc/self/statm's first field).
size_t address_space_bytes() {
  std::ifstream f("/proc/self/statm");
  size_t pages = 0;
  f >> pages;
  return pages * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// For its scope, allocations past (address space now + memory_gb) fail (RLIMIT_AS, so also
// numpy's and any C extension's). Process-wide while it lasts; the engine's threads are idle
// during a policy call.
class AddressSpaceCeiling {
 public:
  explicit AddressSpaceCeiling(double memory_gb) {
    if (memory_gb <= 0 || getrlimit(RLIMIT_AS, &old_) != 0) return;
    rlimit lim = old_;
    const double ceiling = static_cast<double>(address_space_bytes()) + memory_gb * (1ull << 30);
    const rlim_t want = ceiling >= 1.8e19 ? RLIM_INFINITY : static_cast<rlim_t>(ceiling);
    lim.rlim_cur = old_.rlim_cur == RLIM_INFINITY ? want : std::min(old_.rlim_cur, want);
    if (old_.rlim_max != RLIM_INFINITY) lim.rlim_cur = std::min(lim.rlim_cur, old_.rlim_max);
    set_ = setrlimit(RLIMIT_AS, &lim) == 0;
  }
  ~AddressSpaceCeiling() {
    if (set_) setrlimit(RLIMIT_AS, &old_);
  }
  AddressSpaceCeiling(const AddressSpaceCeiling&) = delete;
  AddressSpaceCeiling& operator=(const AddressSpaceCeiling&) = delete;

 private:
  rlimit old_{};
  bool set_ = false;
};

[[noreturn]] void throw_exception(const Site& site, const char* fallback, bool timed_out,
                                  const Limits* limits) {
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  if (!type) {
    throw Error("python policy " + site.file + ": " + site.function + ": " + fallback);
  }
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb && value) PyException_SetTraceback(value, tb);
  Ref t = Ref::steal(type), v = Ref::steal(value), trace = Ref::steal(tb);
  std::string name = "Exception", message, where, text;
  Ref d = Ref::steal(PyObject_CallMethod(runtime().bootstrap.get(), "describe", "Os", v.get(),
                                         site.file.c_str()));
  if (d && PyTuple_Check(d.get()) && PyTuple_Size(d.get()) == 4) {
    auto at = [&](int i) {
      const char* c = PyUnicode_AsUTF8(PyTuple_GetItem(d.get(), i));
      return std::string(c ? c : "");
    };
    name = at(0);
    message = at(1);
    where = at(2);
    text = at(3);
  }
  PyErr_Clear();
  const bool oom = PyErr_GivenExceptionMatches(t.get(), PyExc_MemoryError);
  std::ostringstream os;
  os << "python policy " << site.file << ": " << site.function << " ";
  if (timed_out && limits && PyErr_GivenExceptionMatches(t.get(), runtime().timeout.get())) {
    os << "exceeded its time limit of " << limits->time_s
       << " s and was stopped (policy option time_limit_s)";
  } else if (oom) {
    os << "ran out of memory: MemoryError" << (message.empty() ? "" : ": " + message);
    if (limits) {
      os << " (the call may add " << limits->memory_gb
         << " GiB of address space: policy option memory_limit_gb)";
    }
  } else {
    os << "raised " << name << (message.empty() ? "" : ": " + message);
  }
  if (!where.empty()) os << " (at " << where << ")";
  if (!text.empty()) {
    os << "; the traceback is in the log";
    KVB_LOG_WARN << "python policy " << site.file << ": " << site.function << ":\n" << text;
  }
  throw Error(os.str(), oom ? ErrorKind::kOutOfMemory : ErrorKind::kRuntime);
}

}  // namespace

void ensure_interpreter() {
  static std::once_flag once;
  std::call_once(once, start);
  const Runtime& rt = runtime();
  KVB_USAGE_CHECK(rt.failure.empty()) << rt.failure;
  watchdog();
}

Gil::Gil() : state_(PyGILState_Ensure()) {}
Gil::~Gil() { PyGILState_Release(state_); }

PyObject* numpy() { return runtime().numpy.get(); }

void throw_pending(const Site& site, const char* fallback) {
  throw_exception(site, fallback, false, nullptr);
}

Ref call(PyObject* fn, std::initializer_list<PyObject*> args, const Limits& limits,
         const Site& site) {
  Ref tuple = Ref::steal(PyTuple_New(static_cast<Py_ssize_t>(args.size())));
  KVB_CHECK(tuple) << "python policy: no memory for a call's arguments";
  Py_ssize_t i = 0;
  for (PyObject* a : args) {
    Py_INCREF(a);
    PyTuple_SET_ITEM(tuple.get(), i++, a);
  }
  PyObject* result = nullptr;
  bool timed_out = false;
  {
    AddressSpaceCeiling ceiling(limits.memory_gb);
    const uint64_t gen = watchdog().arm(limits.time_s, PyThread_get_thread_ident());
    result = PyObject_Call(fn, tuple.get(), nullptr);
    timed_out = watchdog().disarm(gen);
  }
  if (!result) throw_exception(site, "failed without an exception", timed_out, &limits);
  if (timed_out && PyErr_Occurred()) PyErr_Clear();
  return Ref::steal(result);
}

Ref load_module(const std::string& path, const Limits& limits) {
  std::ifstream f(path, std::ios::binary);
  KVB_USAGE_CHECK(f.good()) << "python policy: cannot read " << path
                            << " (policy option file=); give a readable Python file";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string digest = sha256_hex(ss.str());
  static auto* modules = new std::map<std::string, Ref>();  // path + digest -> module
  const std::string key = path + "\n" + digest;
  auto it = modules->find(key);
  if (it != modules->end()) return it->second;
  const std::string name = "kvbench_policy_" + digest.substr(0, 16);
  Ref load = Ref::steal(PyObject_GetAttrString(runtime().bootstrap.get(), "load"));
  Ref p = Ref::steal(PyUnicode_FromString(path.c_str()));
  Ref n = Ref::steal(PyUnicode_FromString(name.c_str()));
  KVB_CHECK(load && p && n) << "python policy: the runtime lost its loader";
  Ref module = call(load.get(), {p.get(), n.get()}, limits, {path, "loading the module"});
  modules->emplace(key, module);
  return module;
}

Ref array_view(const void* data, char format, std::initializer_list<Py_ssize_t> shape,
               std::initializer_list<Py_ssize_t> strides) {
  static char f32[] = "f";
  static char i32[] = "i";
  KVB_ASSERT(shape.size() == strides.size() && shape.size() <= 4);
  Py_ssize_t shp[4], str[4];
  Py_ssize_t count = 1;
  int d = 0;
  for (Py_ssize_t s : shape) {
    shp[d++] = s;
    count *= s;
  }
  d = 0;
  for (Py_ssize_t s : strides) str[d++] = s * 4;
  Py_buffer view{};
  // A zero-length view must still point somewhere.
  static const float kEmpty = 0;
  view.buf = const_cast<void*>(count > 0 && data ? data : &kEmpty);
  view.obj = nullptr;
  view.len = count * 4;
  view.itemsize = 4;
  view.readonly = 1;
  view.ndim = static_cast<int>(shape.size());
  view.format = format == 'f' ? f32 : i32;
  view.shape = shp;
  view.strides = str;
  view.suboffsets = nullptr;
  Ref mv = Ref::steal(PyMemoryView_FromBuffer(&view));  // copies shape and strides
  KVB_CHECK(mv) << "python policy: a memoryview failed: " << fetch_text();
  Ref arr = Ref::steal(PyObject_CallOneArg(runtime().asarray.get(), mv.get()));
  KVB_CHECK(arr) << "python policy: numpy.asarray failed: " << fetch_text();
  return arr;
}

Ref int_array(const int32_t* values, Py_ssize_t n) {
  Ref view = array_view(values, 'i', {n}, {1});
  Ref copy = Ref::steal(PyObject_CallMethod(view.get(), "copy", nullptr));
  KVB_CHECK(copy) << "python policy: an array copy failed: " << fetch_text();
  return copy;
}

Ref deep_copy(PyObject* obj, const Site& site) {
  Ref fn = Ref::steal(PyObject_GetAttrString(runtime().bootstrap.get(), "deep_copy"));
  KVB_CHECK(fn) << "python policy: the runtime lost deep_copy";
  PyObject* r = PyObject_CallOneArg(fn.get(), obj);
  if (!r) throw_exception(site, "copy.deepcopy failed", false, nullptr);
  return Ref::steal(r);
}

}  // namespace kvb::policies::python
