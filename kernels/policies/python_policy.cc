// `python` (examples/policies/README.md, the contract): a policy written in one Python file, run by the
// embedded interpreter (python_runtime.h). The file defines score(ctx) -> float32 [kv_heads, n]
// (higher keeps), called once per global layer after the prompt's prefill; kvbench keeps each
// head's top kv_budget (ties: the more recent, as every policy), or with `ada: true` the layer's
// top across heads as Ada-KV allocates; `sinks: S` and `window: W` protect the first S and last W
// tokens. An optional decode_score(ctx) is called per global layer after each decode step and
// kvbench evicts the lowest scores down to the budget. ctx's arrays are read-only views of the
// cache and statistics, valid only during the call: no copy on the CPU; on a device the rows are
// a host copy of the layer made when ctx.keys or ctx.values is first read, and the statistics
// host copies (counted in policy_ms and the copy counters).
#include "kernels/policies/python_runtime.h"  // Python.h first

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/budget.h"
#include "kernels/cpu/select.h"
#include "kernels/policies/policies.h"

namespace kvb::policies {
namespace {

namespace py = python;

// The options kvbench reads itself; every other option goes to the module (ctx.options).
const std::vector<ParamDoc>& python_params() {
  static const std::vector<ParamDoc> params = {
      {"file", "", "the Python file (required): defines score(ctx), optionally decode_score(ctx)",
       {}},
      {"ada", "false",
       "keep the top scores across the layer's heads, per-head budgets as Ada-KV allocates "
       "(else each head's top kv_budget)",
       {"true", "false"}},
      {"alpha", "0.5", "with ada: Ada-KV's uniform floor, B_i = round((1-alpha)*count_i + "
                       "floor(alpha*base))", {}},
      {"sinks", "0", "the first S tokens of every head are always kept", {}},
      {"window", "0", "the last W tokens of every head are always kept", {}},
      {"window_queries", "64", "w: how many of the prompt's last queries ctx.queries and "
                               "ctx.attn hold", {}},
      {"time_limit_s", "60", "wall time one call of score or decode_score (or the module's "
                             "import) may take; past it the unit is an error", {}},
      {"memory_limit_gb", "4", "address space one call may add (0: no limit); past it the call "
                               "gets MemoryError and the unit is an oom", {}},
  };
  return params;
}

bool own_option(const std::string& key) {
  for (const ParamDoc& p : python_params()) {
    if (p.name == key) return true;
  }
  return key == "gqa";  // common_params()
}

// The attribute `name` of the module, or null when absent (no exception left pending).
py::Ref attribute(PyObject* module, const char* name) {
  if (!PyObject_HasAttrString(module, name)) return {};
  return py::Ref::steal(PyObject_GetAttrString(module, name));
}

class PythonPolicy final : public Policy {
 public:
  explicit PythonPolicy(const PolicyConfig& c) : Policy(c) {
    const PolicyOptions& o = c.options;
    const std::string file = o.get_string("file", "");
    KVB_USAGE_CHECK(!file.empty())
        << "policy python needs the option file=PATH, a Python file defining score(ctx) (e.g. "
           "--policy python --policy-opt file=examples/policies/knorm.py; kvbench ls policies "
           "describes the contract)";
    std::error_code ec;
    const auto status = std::filesystem::status(file, ec);
    KVB_USAGE_CHECK(!ec && std::filesystem::is_regular_file(status))
        << "policy python: file=" << file << " is not a readable regular file";
    file_ = std::filesystem::absolute(file).lexically_normal().string();
    ada_ = o.get_bool("ada", false);
    alpha_ = o.get_double("alpha", 0.5, 0.0, 1.0);
    sinks_ = o.get_int("sinks", 0, 0, 1 << 30);
    window_ = o.get_int("window", 0, 0, 1 << 30);
    window_queries_ = o.get_int("window_queries", 64, 1, 1 << 20);
    limits_.time_s = o.get_double("time_limit_s", 60, 0.001, 1e7);
    limits_.memory_gb = o.get_double("memory_limit_gb", 4, 0, 1e6);
    KVB_USAGE_CHECK(c.kv_budget <= 0 || sinks_ + window_ < c.kv_budget)
        << "policy python: sinks (" << sinks_ << ") + window (" << window_
        << ") must leave room in kv_budget " << c.kv_budget << " for scored tokens";
    KVB_USAGE_CHECK(!c.tp || c.tp->size() == 1)
        << "policy python does not run under tensor parallelism (--tp); run it on one device";
    for (const auto& [key, value] : o.values()) {
      if (!own_option(key)) user_options_.emplace_back(key, o.get_string(key, value));
    }
    load();
  }

  PythonPolicy(const PythonPolicy&) = default;  // with the GIL held (clone)

  ~PythonPolicy() override {
    if (!started_) return;
    py::Gil gil;
    module_.reset();
    score_.reset();
    decode_score_.reset();
    options_.reset();
    state_.reset();
  }

  StatsRequest prefill_request(int) const override {
    return {.col_sums = needs_attention_sum_,
            .last_w = needs_attention_ ? window_queries_ : 0,
            .last_queries = window_queries_};
  }
  StatsRequest decode_request() const override {
    if (!decode_score_) return {};
    return {.col_sums = needs_attention_ || needs_attention_sum_, .last_queries = 1};
  }
  bool evicts_at_decode() const override { return static_cast<bool>(decode_score_); }

  void begin_sequence(int) override { check_loaded(); }

  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    check_loaded();
    const int n = layer_lengths(st.layer, cache);
    if (n == 0) return;
    {
      py::Gil gil;
      run(score_.get(), "score()", st, cache, n, false);
    }
    const int heads = cache.shape().num_kv_heads;
    bool over = false;
    for (int h = 0; h < heads; ++h) over |= lens_[h] > kv_budget();
    if (!over) return;
    if (ada_) {
      keep_ada(st.layer, cache, n, plan);
      return;
    }
    for (int h = 0; h < heads; ++h) {
      if (lens_[h] > kv_budget()) keep_head(h, n, kv_budget(), plan);
    }
  }

  void on_decode_layer(const LayerStats& st, const kernels::KvIndex& cache,
                       kernels::EvictionPlan& plan) override {
    check_loaded();
    if (!decode_score_) return;
    const int n = layer_lengths(st.layer, cache);
    if (n == 0) return;
    {
      py::Gil gil;
      run(decode_score_.get(), "decode_score()", st, cache, n, true);
    }
    if (ada_) {
      evict_ada(cache, n, plan);
      return;
    }
    for (int h = 0; h < static_cast<int>(lens_.size()); ++h) {
      const int len = lens_[h];
      if (len <= kv_budget()) continue;
      const int s = std::min(sinks_, len), w = std::min(window_, len - s);
      const int excess = len - kv_budget();
      if (excess == 1 && len - w - s >= 1) {  // one step over: the lowest-ranked candidate
        const float* row = &scores_[static_cast<size_t>(h) * n];
        plan.evict(h, s + kernels::cpu::select_argmin(row + s, nullptr, len - w - s));
      } else {
        keep_head(h, n, kv_budget(), plan);
      }
    }
  }

  size_t state_bytes() const override {
    return scores_.capacity() * sizeof(float);  // the module's own state is not counted
  }

  std::unique_ptr<Policy> clone() const override {
    if (!started_) return std::make_unique<PythonPolicy>(*this);
    py::Gil gil;
    auto copy = std::make_unique<PythonPolicy>(*this);
    if (state_) copy->state_ = py::deep_copy(state_.get(), {file_, "copying state"});
    return copy;
  }

 private:
  // Loads the module (once per process and content) and reads its contract. A failure is kept
  // and thrown from the first hook, so that it ends that unit (an error row), not the bundle.
  void load() {
    try {
      py::ensure_interpreter();
      started_ = true;
      py::Gil gil;
      module_ = py::load_module(file_, limits_);
      score_ = attribute(module_.get(), "score");
      KVB_USAGE_CHECK(score_ && PyCallable_Check(score_.get()))
          << "python policy " << file_ << " defines no function score(ctx)";
      decode_score_ = attribute(module_.get(), "decode_score");
      KVB_USAGE_CHECK(!decode_score_ || PyCallable_Check(decode_score_.get()))
          << "python policy " << file_ << ": decode_score is not a function";
      needs_attention_ = flag("NEEDS_ATTENTION");
      needs_attention_sum_ = flag("NEEDS_ATTENTION_SUM");
      make_options();
      state_ = py::Ref::steal(PyDict_New());
    } catch (const Error& e) {
      // A module that breaks the contract (no score, an undeclared option) fails its own units
      // like an exception in it; only running out of memory keeps its kind (an oom row).
      load_error_ = e.what();
      load_error_kind_ =
          e.kind() == ErrorKind::kOutOfMemory ? ErrorKind::kOutOfMemory : ErrorKind::kRuntime;
    }
  }

  void check_loaded() const {
    if (!load_error_.empty()) throw Error(load_error_, load_error_kind_);
  }

  bool flag(const char* name) {
    py::Ref v = attribute(module_.get(), name);
    if (!v) return false;
    const int t = PyObject_IsTrue(v.get());
    if (t < 0) py::throw_pending({file_, name}, "not a truth value");
    return t == 1;
  }

  // ctx.options: the module's OPTIONS (name -> default) updated with the unit's values, each
  // converted to its default's type; without OPTIONS every value is a string.
  void make_options() {
    options_ = py::Ref::steal(PyDict_New());
    py::Ref declared = attribute(module_.get(), "OPTIONS");
    if (declared) {
      KVB_USAGE_CHECK(PyDict_Check(declared.get()))
          << "python policy " << file_ << ": OPTIONS must be a dict of option name -> default";
      PyDict_Update(options_.get(), declared.get());
    }
    for (const auto& [key, value] : user_options_) {
      py::Ref def;
      if (declared) {
        def = py::Ref::borrow(PyDict_GetItemString(declared.get(), key.c_str()));
        if (!def) {
          std::string names;
          PyObject *k, *v;
          Py_ssize_t pos = 0;
          while (PyDict_Next(declared.get(), &pos, &k, &v)) {
            const char* c = PyUnicode_Check(k) ? PyUnicode_AsUTF8(k) : nullptr;
            names += (names.empty() ? "" : ", ") + std::string(c ? c : "?");
          }
          KVB_USAGE_FAIL() << "python policy " << file_ << ": unknown option '" << key
                           << "'; its OPTIONS declare: " << (names.empty() ? "none" : names)
                           << "; kvbench's own: file, ada, alpha, sinks, window, window_queries, "
                              "time_limit_s, memory_limit_gb";
        }
      }
      py::Ref v = convert(key, value, def.get());
      PyDict_SetItemString(options_.get(), key.c_str(), v.get());
    }
  }

  py::Ref convert(const std::string& key, const std::string& value, PyObject* def) {
    auto bad = [&](const char* type) {
      KVB_USAGE_FAIL() << "python policy " << file_ << ": option " << key << "=" << value
                       << " is not " << type << " (the type of its default in OPTIONS)";
    };
    if (def && PyBool_Check(def)) {
      if (value == "true" || value == "1" || value == "yes") return py::Ref::borrow(Py_True);
      if (value == "false" || value == "0" || value == "no") return py::Ref::borrow(Py_False);
      bad("a boolean (true/false)");
    }
    if (def && PyLong_Check(def)) {
      char* end = nullptr;
      const long long x = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0') bad("an integer");
      return py::Ref::steal(PyLong_FromLongLong(x));
    }
    if (def && PyFloat_Check(def)) {
      char* end = nullptr;
      const double x = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0') bad("a number");
      return py::Ref::steal(PyFloat_FromDouble(x));
    }
    return py::Ref::steal(PyUnicode_FromString(value.c_str()));
  }

  // lens_ = the layer's head lengths; returns the longest.
  int layer_lengths(int layer, const kernels::KvIndex& cache) {
    const int heads = cache.shape().num_kv_heads;
    lens_.resize(heads);
    int n = 0;
    for (int h = 0; h < heads; ++h) {
      lens_[h] = cache.length(layer, h);
      n = std::max(n, lens_[h]);
    }
    return n;
  }

  // ctx.keys and ctx.values, made on their first read (RowFetch): views of the cache's own f32
  // rows where it holds them on the host (f16 rows, --dtype native: of their f32 conversion,
  // KvCache::rows_f32), else a host copy of the layer read through the ops (a device's rows:
  // host_layer, counted in the ops' transfers and inside policy_ms). A call that never
  // reads them costs neither the copy nor the conversion.
  struct RowFetch {
    const LayerStats* st = nullptr;
    const kernels::KvIndex* cache = nullptr;
    int n = 0;
    kernels::KvCache pulled;
    std::vector<std::pair<const char*, py::Ref>>* views = nullptr;
    size_t made_at = 0;  // 1 + where in *views the rows' arrays are, once made (0: not yet)
  };

  // ctx._kvbench_rows(ctx), called by the ctx class's __getattr__: sets ctx.keys and ctx.values.
  static PyObject* fetch_rows(PyObject* capsule, PyObject* ctx) {
    // The capsule owns a link to the call's RowFetch, null once the call has returned (a module
    // that kept ctx or this function finds no call to read for).
    auto* link = static_cast<RowFetch**>(PyCapsule_GetPointer(capsule, "kvbench.rows"));
    if (link == nullptr) return nullptr;
    RowFetch* f = *link;
    if (f == nullptr) {
      PyErr_SetString(PyExc_RuntimeError,
                      "ctx.keys and ctx.values are valid only during the call that got ctx");
      return nullptr;
    }
    try {
      // Made once per call: a second fetch (the module deleted ctx.keys) sets the same arrays
      // again; making them anew would free the copy the first ones view.
      if (f->made_at == 0) {
        const kernels::KvIndex& cache = *f->cache;
        const int layer = f->st->layer;
        const kernels::LayerKvView v = host_layer(ops_of(*f->st), cache, layer, &f->pulled);
        const int heads = cache.shape().num_kv_heads, hd = v.head_dim, cap = v.capacity;
        const int n = f->n;
        f->views->emplace_back("keys", py::array_view(v.keys, 'f', {heads, n, hd},
                                                      {cap * hd, hd, 1}));
        f->views->emplace_back("values", py::array_view(v.values, 'f', {heads, n, hd},
                                                        {cap * hd, hd, 1}));
        f->made_at = f->views->size() - 1;  // 1 + the keys' index
      }
      const py::Ref& keys = (*f->views)[f->made_at - 1].second;
      const py::Ref& values = (*f->views)[f->made_at].second;
      if (PyObject_SetAttrString(ctx, "keys", keys.get()) != 0 ||
          PyObject_SetAttrString(ctx, "values", values.get()) != 0) {
        return nullptr;
      }
    } catch (const std::bad_alloc&) {
      return PyErr_NoMemory();
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
      return nullptr;
    }
    Py_RETURN_NONE;
  }

  // The class of ctx: a types.SimpleNamespace whose keys and values are made when first read.
  // Made once per process (with the GIL held; the interpreter is never finalized, so the class
  // is never released).
  static PyObject* ctx_class(const py::Site& site) {
    static PyObject* made = nullptr;
    if (made) return made;
    static const char* kSource =
        "import types\n"
        "class Ctx(types.SimpleNamespace):\n"
        "    def __getattr__(self, name):\n"
        "        fetch = self.__dict__.get('_kvbench_rows')\n"
        "        if fetch is not None and name in ('keys', 'values'):\n"
        "            fetch(self)\n"
        "            return self.__dict__[name]\n"
        "        raise AttributeError(f'ctx has no field {name!r}')\n";
    py::Ref code = py::Ref::steal(Py_CompileString(kSource, "<kvbench ctx>", Py_file_input));
    if (!code) py::throw_pending(site, "compiling the ctx class failed");
    py::Ref module =
        py::Ref::steal(PyImport_ExecCodeModule("_kvbench_ctx", code.get()));
    if (!module) py::throw_pending(site, "making the ctx class failed");
    made = PyObject_GetAttrString(module.get(), "Ctx");
    if (!made) py::throw_pending(site, "the ctx class is missing");
    return made;
  }

  // Calls fn(ctx) and leaves its scores in scores_ [heads, n].
  void run(PyObject* fn, const char* function, const LayerStats& st, const kernels::KvIndex& cache,
           int n, bool decode) {
    const py::Site site{file_, function};
    // The index: positions are the host's on every backend.
    const kernels::LayerIndexView v = cache.layer(st.layer);
    const int heads = cache.shape().num_kv_heads, hd = cache.shape().head_dim, cap = v.capacity;
    const int qh = st.num_heads;
    std::vector<std::pair<const char*, py::Ref>> views;
    views.emplace_back("positions", py::array_view(v.positions, 'i', {heads, n}, {cap, 1}));
    if (st.last_queries) {
      views.emplace_back("queries", py::array_view(st.last_queries, 'f', {qh, st.n_queries, hd},
                                                   {hd, qh * hd, 1}));
    }
    const int stride = st.stride;
    if (needs_attention_) {
      if (decode && st.col_sums) {  // the new query's probabilities
        views.emplace_back("attn",
                           py::array_view(st.col_sums, 'f', {qh, 1, n}, {stride, stride, 1}));
      } else if (!decode && st.last_probs) {
        views.emplace_back("attn", py::array_view(st.last_probs, 'f', {qh, st.last_w, n},
                                                  {st.last_w * stride, stride, 1}));
      }
    }
    if (needs_attention_sum_ && st.col_sums) {
      views.emplace_back("attn_sum", py::array_view(st.col_sums, 'f', {qh, n}, {stride, 1}));
    }
    RowFetch rows;
    rows.st = &st;
    rows.cache = &cache;
    rows.n = n;
    rows.views = &views;
    static PyMethodDef fetch_def = {"_kvbench_rows", fetch_rows, METH_O,
                                    "kvbench's: sets ctx.keys and ctx.values"};
    {
      py::Ref kwargs = py::Ref::steal(PyDict_New());
      for (const auto& [name, ref] : views) PyDict_SetItemString(kwargs.get(), name, ref.get());
      auto put = [&](const char* name, py::Ref value) {
        PyDict_SetItemString(kwargs.get(), name, value.get());
      };
      put("lengths", py::int_array(lens_.data(), heads));
      put("layer", py::Ref::steal(PyLong_FromLong(st.layer)));
      put("budget", py::Ref::steal(PyLong_FromLong(kv_budget())));
      put("n_new", py::Ref::steal(PyLong_FromLong(st.n_new)));
      put("num_layers", py::Ref::steal(PyLong_FromLong(config().shape.num_layers)));
      put("options", options_);
      put("state", state_);
      auto* link = new RowFetch*(&rows);
      py::Ref capsule = py::Ref::steal(PyCapsule_New(link, "kvbench.rows", [](PyObject* c) {
        delete static_cast<RowFetch**>(PyCapsule_GetPointer(c, "kvbench.rows"));
      }));
      if (!capsule) {
        delete link;
        py::throw_pending(site, "making ctx failed");
      }
      struct Expire {  // before the capsule can die: the link outlives the call if kept
        RowFetch** link;
        ~Expire() { *link = nullptr; }
      } expire{link};
      py::Ref fetch = py::Ref::steal(PyCFunction_New(&fetch_def, capsule.get()));
      if (!fetch) py::throw_pending(site, "making ctx failed");
      put("_kvbench_rows", fetch);
      py::Ref empty = py::Ref::steal(PyTuple_New(0));
      py::Ref ctx = py::Ref::steal(PyObject_Call(ctx_class(site), empty.get(), kwargs.get()));
      if (!ctx) py::throw_pending(site, "building ctx failed");
      kwargs.reset();
      py::Ref result = py::call(fn, {ctx.get()}, limits_, site);
      ctx.reset();
      read_scores(result.get(), site, heads, n);
    }
    for (const auto& [name, ref] : views) {
      KVB_CHECK(Py_REFCNT(ref.get()) == 1)
          << "python policy " << file_ << ": " << function << " kept ctx." << name
          << " (a view of kvbench's memory, valid only during the call) after returning; keep "
             "a copy instead (numpy.array(ctx."
          << name << "))";
    }
  }

  void read_scores(PyObject* result, const py::Site& site, int heads, int n) {
    auto fail = [&](const std::string& why) {
      KVB_FAIL() << "python policy " << file_ << ": " << site.function << " returned " << why
                 << "; it must return a numpy float32 array of shape [kv_heads, n] = [" << heads
                 << ", " << n << "] (higher keeps)";
    };
    if (!PyObject_CheckBuffer(result)) fail(std::string("a ") + Py_TYPE(result)->tp_name);
    Py_buffer b;
    if (PyObject_GetBuffer(result, &b, PyBUF_RECORDS_RO) != 0) {
      PyErr_Clear();
      fail("an array kvbench cannot read");
    }
    struct Release {
      Py_buffer* b;
      ~Release() { PyBuffer_Release(b); }
    } release{&b};
    const std::string format = b.format ? b.format : "B";
    if (b.itemsize != 4 || (format != "f" && format != "<f" && format != "=f")) {
      fail("dtype with format '" + format + "' (use .astype(numpy.float32))");
    }
    if (b.ndim != 2 || b.shape[0] != heads || b.shape[1] != n) {
      std::string shape = "[";
      for (int d = 0; d < b.ndim; ++d) shape += (d ? ", " : "") + std::to_string(b.shape[d]);
      fail("shape " + shape + "]");
    }
    scores_.resize(static_cast<size_t>(heads) * n);
    const char* base = static_cast<const char*>(b.buf);
    for (int h = 0; h < heads; ++h) {
      for (int s = 0; s < n; ++s) {
        float x;
        std::memcpy(&x, base + h * b.strides[0] + s * b.strides[1], sizeof x);
        if (s < lens_[h] && std::isnan(x)) {
          fail("NaN at head " + std::to_string(h) + ", slot " + std::to_string(s));
        }
        scores_[static_cast<size_t>(h) * n + s] = x;
      }
    }
  }

  // Head h keeps its sinks, its window and the top (k - sinks - window) scored tokens between.
  void keep_head(int h, int n, int k, kernels::EvictionPlan& plan) {
    const int len = lens_[h];
    const int s = std::min(sinks_, len), w = std::min(window_, len - s);
    const int take = std::max(0, k - s - w);
    keep_.assign(static_cast<size_t>(len), 0);
    std::vector<int32_t> list;
    list.reserve(static_cast<size_t>(s + take + w));
    for (int i = 0; i < s; ++i) list.push_back(i);
    const int got = kernels::cpu::select_topk_range(&scores_[static_cast<size_t>(h) * n], s,
                                                    len - w, take, keep_.data());
    list.insert(list.end(), keep_.begin(), keep_.begin() + got);
    for (int i = len - w; i < len; ++i) list.push_back(i);
    plan.keep(h, std::move(list));
  }

  // Ada-KV: the layer's scored candidates compete across heads for heads x base places.
  void keep_ada(int layer, const kernels::KvIndex& cache, int n, kernels::EvictionPlan& plan) {
    const int heads = static_cast<int>(lens_.size());
    const kernels::LayerIndexView v = cache.layer(layer);
    std::vector<float> cand(static_cast<size_t>(heads) * n);
    std::vector<int32_t> pos(cand.size()), clen(heads), budgets(heads);
    for (int h = 0; h < heads; ++h) {
      const int len = lens_[h];
      const int s = std::min(sinks_, len), w = std::min(window_, len - s);
      clen[h] = len - s - w;
      std::copy_n(&scores_[static_cast<size_t>(h) * n + s], clen[h], &cand[static_cast<size_t>(h) * n]);
      std::copy_n(v.position(h) + s, clen[h], &pos[static_cast<size_t>(h) * n]);
    }
    const int base = kv_budget() - sinks_ - window_;
    kernels::cpu::ada_head_budgets({cand.data(), pos.data(), clen.data(), heads, n}, base, alpha_,
                                   budgets.data());
    for (int h = 0; h < heads; ++h) {
      const int len = lens_[h];
      const int s = std::min(sinks_, len), w = std::min(window_, len - s);
      if (budgets[h] >= clen[h]) continue;  // keeps every slot
      keep_head(h, n, budgets[h] + s + w, plan);
    }
  }

  // Ada-KV at decode: while the layer holds more than heads x budget, its lowest-ranked scored
  // candidate goes (ties: the older position, then the higher head index).
  void evict_ada(const kernels::KvIndex& cache, int n, kernels::EvictionPlan& plan) {
    (void)cache;
    const int heads = static_cast<int>(lens_.size());
    int total = 0;
    for (int len : lens_) total += len;
    const int excess = total - heads * kv_budget();
    if (excess <= 0) return;
    struct Cand {
      float score;
      int slot, head;
    };
    std::vector<Cand> all;
    for (int h = 0; h < heads; ++h) {
      const int len = lens_[h];
      const int s = std::min(sinks_, len), w = std::min(window_, len - s);
      for (int i = s; i < len - w; ++i) all.push_back({scores_[static_cast<size_t>(h) * n + i], i, h});
    }
    const size_t drop = std::min(all.size(), static_cast<size_t>(excess));
    std::partial_sort(all.begin(), all.begin() + drop, all.end(), [](const Cand& a, const Cand& b) {
      const uint32_t ka = kernels::cpu::score_order_key(a.score);
      const uint32_t kb = kernels::cpu::score_order_key(b.score);
      if (ka != kb) return ka < kb;
      if (a.slot != b.slot) return a.slot < b.slot;
      return a.head > b.head;
    });
    std::vector<std::vector<uint8_t>> gone(heads);
    std::vector<int> count(heads, 0);
    for (size_t i = 0; i < drop; ++i) {
      if (gone[all[i].head].empty()) gone[all[i].head].assign(lens_[all[i].head], 0);
      gone[all[i].head][all[i].slot] = 1;
      ++count[all[i].head];
    }
    for (int h = 0; h < heads; ++h) {
      if (count[h] == 0) continue;
      std::vector<int32_t> list;
      for (int i = 0; i < lens_[h]; ++i) {
        if (!gone[h][i]) list.push_back(i);
      }
      plan.keep(h, std::move(list));
    }
  }

  std::string file_;
  bool ada_ = false;
  double alpha_ = 0.5;
  int sinks_ = 0, window_ = 0, window_queries_ = 64;
  py::Limits limits_;
  std::vector<std::pair<std::string, std::string>> user_options_;
  bool started_ = false;  // the interpreter runs (Refs need the GIL)
  std::string load_error_;
  ErrorKind load_error_kind_ = ErrorKind::kRuntime;
  py::Ref module_, score_, decode_score_, options_, state_;
  bool needs_attention_ = false, needs_attention_sum_ = false;
  std::vector<int32_t> lens_;
  std::vector<float> scores_;  // [heads, n] of the last call
  std::vector<int32_t> keep_;
};

}  // namespace

PolicyInfo python_policy_info() {
  return {"python",
          "a policy written in one Python file (file=PATH): score(ctx) -> float32 [kv_heads, n] "
          "after each layer's prefill keeps each head's top kv_budget (higher keeps; ties the "
          "more recent); optional decode_score(ctx) evicts the lowest down to the budget after "
          "each decode step. ctx: keys, values [kv_heads, n, head_dim] (post-RoPE), queries "
          "[q_heads, w, head_dim], attn [q_heads, w, n] (NEEDS_ATTENTION = True), attn_sum "
          "[q_heads, n] (NEEDS_ATTENTION_SUM = True), positions [kv_heads, n], lengths, layer, "
          "num_layers, budget, n_new, options, state. Other options reach the module as "
          "ctx.options (typed by its OPTIONS dict). The contract: examples/policies/README.md",
          python_params(),
          [](const PolicyConfig& c) { return std::make_unique<PythonPolicy>(c); }};
}

}  // namespace kvb::policies
