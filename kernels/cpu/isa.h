// The SIMD path of the CPU kernels, chosen once per process at run time (issue 31): the build
// compiles every path its target allows (AVX-512 with -march for an AVX-512 CPU, AVX2 + FMA, and
// always the portable one), and the environment variable KVB_ISA picks among them, so that one
// build on an AVX-512 machine also runs the code an AVX2-only machine runs, and the tests
// (ctest's `.avx2` / `.portable` copies, label `isa`) hold every path to the same bits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvb::kernels::cpu {

// Ordered by width: a kernel runs its widest path that is not wider than the active one (a kernel
// without an AVX-512 path runs its AVX2 one under kAvx512).
enum class Isa { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };
constexpr int kIsaCount = 3;

// "portable", "avx2", "avx512": the values KVB_ISA takes (and "auto").
const char* isa_name(Isa isa);

// The paths this build contains and this CPU runs, widest first (kPortable always last).
// kAvx512: compiled with AVX-512F (-march=native on an AVX-512 CPU) and the CPU has avx512f;
// kAvx2: compiled with AVX2 and FMA and the CPU has both.
const std::vector<Isa>& available_isas();

// The path a KVB_ISA value selects: nullptr (unset), "" or "auto": the widest available path
// (what each kernel took before the switch); "avx512", "avx2", "portable": that path, which must
// be available. Anything else, or a path this build or CPU lacks, throws kvb::Error (usage) naming
// the variable, the value and the available paths. An error rather than a fallback: a forced run
// exists to test one path, and a silent fallback would test another.
Isa resolve_isa(const char* value);
// The same against a given list of available paths (widest first; tests).
Isa resolve_isa(const char* value, const std::vector<Isa>& available);

// resolve_isa(getenv("KVB_ISA")), read once (the first call; every later call returns the same
// path, or throws the same error while the value is bad). Kernels call it once per call, outside
// their loops.
Isa active_isa();

// Whether KVB_ISA names a path (not unset, empty or "auto"). Throws as active_isa() does.
// matmul_bf16, which picks its tiles from the CPU's features at run time (not from the build's),
// keeps that choice under auto and obeys a forced path.
bool isa_forced();

// One line for logs and `kvbench --version`: "avx512 (KVB_ISA=auto; available: avx512 avx2
// portable)". Throws as active_isa() does.
std::string isa_summary();

// ---- which path ran (tests) ----------------------------------------------------------------

// The kernels that branch on the active path. Each counts, on the calling thread, the calls
// it dispatched to each path (one increment per call, at the dispatch, outside the loops), so
// a test can see that a forced path is the path that ran.
enum class SimdKernel {
  kMatmul,           // matmul / matmul_strided tiles
  kMatmulBf16,       // matmul_bf16's decode and few-row tiles
  kAttentionPv,      // attention's P x V lanes (decode rows)
  kExpFloats,        // exp_floats
  kKCenter,          // kcenter_greedy's distances
  kSubgenCount,      // subgen_count_clusters' "some representative within"
  kQMatmul,          // qmatmul's integer block dots (qmatmul.h; AVX2 kernels also under avx512)
  kAttentionScores,  // attention's decode scores over f16 keys (portable: converted, then matmul)
  kExpFast,          // exp_fast_floats (AVX2 kernel also under avx512)
  kMatmulWt,         // matmul_wt's tiles (AVX2 kernel also under avx512)
};
constexpr int kSimdKernelCount = 10;

struct SimdDispatchCounts {
  uint64_t calls[kSimdKernelCount][kIsaCount] = {};
  uint64_t of(SimdKernel k, Isa isa) const {
    return calls[static_cast<int>(k)][static_cast<int>(isa)];
  }
};
// This thread's counts (thread_local): a test resets it, calls a kernel, reads it.
SimdDispatchCounts& simd_dispatch_counts();
inline void count_dispatch(SimdKernel k, Isa isa) {
  ++simd_dispatch_counts().calls[static_cast<int>(k)][static_cast<int>(isa)];
}

}  // namespace kvb::kernels::cpu
