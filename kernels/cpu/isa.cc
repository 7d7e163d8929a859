// KVB_ISA: which of the build's SIMD paths the CPU kernels take (isa.h).
#include "kernels/cpu/isa.h"

#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "common/escape.h"

namespace kvb::kernels::cpu {
namespace {

// Whether this build compiled the path: the kernels' own conditions (matmul.cc, attention.cc,
// exp_exact.cc, subgen_estimator.cc, kcenter.cc); every file of kvb_kernels has these flags.
bool compiled(Isa isa) {
  switch (isa) {
    case Isa::kPortable:
      return true;
    case Isa::kAvx2:
#if defined(__AVX2__) && defined(__FMA__)
      return true;
#else
      return false;
#endif
    case Isa::kAvx512:
#if defined(__AVX512F__)
      return true;
#else
      return false;
#endif
  }
  return false;
}

// Whether this CPU runs the path (a binary built for another CPU may lack it).
bool cpu_runs(Isa isa) {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  switch (isa) {
    case Isa::kPortable:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f");
  }
  return false;
#else
  return isa == Isa::kPortable;
#endif
}

// A value from the environment as an error shows it: control characters escaped, at most 40
// characters.
std::string shown(const char* value) { return cut_chars(json_escape(value), 40); }

std::string names(const std::vector<Isa>& isas) {
  std::string s;
  for (Isa isa : isas) {
    if (!s.empty()) s += ' ';
    s += isa_name(isa);
  }
  return s;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kPortable:
      return "portable";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

const std::vector<Isa>& available_isas() {
  static const std::vector<Isa> isas = [] {
    std::vector<Isa> v;
    for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kPortable}) {
      if (compiled(isa) && cpu_runs(isa)) v.push_back(isa);
    }
    return v;
  }();
  return isas;
}

Isa resolve_isa(const char* value, const std::vector<Isa>& avail) {
  KVB_CHECK(!avail.empty() && avail.back() == Isa::kPortable) << "resolve_isa: no portable path";
  if (value == nullptr || *value == '\0' || std::strcmp(value, "auto") == 0) return avail.front();
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kPortable}) {
    if (std::strcmp(value, isa_name(isa)) != 0) continue;
    for (Isa a : avail) {
      if (a == isa) return isa;
    }
    KVB_USAGE_FAIL() << "KVB_ISA=" << value << ": this "
                     << (compiled(isa) ? "CPU lacks the " : "build has no ") << value << " path"
                     << (compiled(isa) ? ""
                                       : " (kvbench compiles it only for a CPU that has it: "
                                         "KVBENCH_NATIVE=ON, the default, on such a machine)")
                     << "; available here: auto " << names(avail);
  }
  KVB_USAGE_FAIL() << "KVB_ISA=" << shown(value)
                   << ": unknown value; use auto (the widest path) or one of the paths available "
                      "here: "
                   << names(avail);
  return avail.front();  // not reached
}

Isa resolve_isa(const char* value) { return resolve_isa(value, available_isas()); }

Isa active_isa() {
  static const Isa isa = resolve_isa(std::getenv("KVB_ISA"));
  return isa;
}

bool isa_forced() {
  static const bool forced = [] {
    active_isa();  // a bad value throws here too
    const char* env = std::getenv("KVB_ISA");
    return env != nullptr && *env != '\0' && std::strcmp(env, "auto") != 0;
  }();
  return forced;
}

std::string isa_summary() {
  const char* env = std::getenv("KVB_ISA");
  return std::string(isa_name(active_isa())) +
         " (KVB_ISA=" + (env == nullptr || *env == '\0' ? "auto" : env) +
         "; available: " + names(available_isas()) + ")";
}

SimdDispatchCounts& simd_dispatch_counts() {
  thread_local SimdDispatchCounts counts;
  return counts;
}

}  // namespace kvb::kernels::cpu
