// KVB_ISA (kernels/cpu/isa.h, issue 31): the path it names is the one every SIMD kernel takes
// (counted at each kernel's dispatch), and a value naming no available path is refused with the
// variable, the value and the paths there are. ctest runs this binary once per path the build
// contains (`test_isa.avx2`, `.portable`: tests/CMakeLists.txt), so each check holds on each.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/exp_exact.h"
#include "kernels/cpu/exp_fast.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kcenter.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_bf16.h"
#include "kernels/cpu/subgen_estimator.h"
#include "kernels/f16.h"

namespace kvb::kernels::cpu {
namespace {

bool available(Isa isa) {
  for (Isa a : available_isas()) {
    if (a == isa) return true;
  }
  return false;
}

// The path KVB_ISA of this process names, as the test reads the variable itself.
Isa expected_active() {
  const char* env = std::getenv("KVB_ISA");
  const std::string v = env == nullptr ? "" : env;
  if (v == "avx512") return Isa::kAvx512;
  if (v == "avx2") return Isa::kAvx2;
  if (v == "portable") return Isa::kPortable;
  EXPECT_TRUE(v.empty() || v == "auto") << "ctest sets only valid values; got " << v;
  return available_isas().front();
}

TEST(Isa, ActivePathIsTheOneKvbIsaNames) {
  const Isa want = expected_active();
  EXPECT_EQ(isa_name(active_isa()), std::string(isa_name(want)));
  EXPECT_EQ(available_isas().back(), Isa::kPortable);
  EXPECT_TRUE(available(active_isa()));
  const char* env = std::getenv("KVB_ISA");
  const bool forced = env != nullptr && *env != '\0' && std::string(env) != "auto";
  EXPECT_EQ(isa_forced(), forced);
  EXPECT_EQ(isa_summary().rfind(std::string(isa_name(want)) + " (KVB_ISA=", 0), 0u)
      << isa_summary();
#if defined(__AVX512F__)
  EXPECT_TRUE(available(Isa::kAvx512)) << "an AVX-512 build runs on an AVX-512 CPU";
#endif
#if defined(__AVX2__) && defined(__FMA__)
  EXPECT_TRUE(available(Isa::kAvx2));
#endif
}

// The widest of a kernel's own paths that is not wider than the active one.
Isa widest(std::initializer_list<Isa> kernel_paths) {
  Isa best = Isa::kPortable;
  for (Isa p : kernel_paths) {
    if (p <= active_isa() && available(p) && p > best) best = p;
  }
  return best;
}

// Exactly one path counted for kernel k, and it is `want`.
void expect_only(const SimdDispatchCounts& c, SimdKernel k, Isa want, const char* what) {
  for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512}) {
    if (isa == want) {
      EXPECT_GT(c.of(k, isa), 0u) << what << " did not run its " << isa_name(isa) << " path";
    } else {
      EXPECT_EQ(c.of(k, isa), 0u) << what << " ran its " << isa_name(isa) << " path under "
                                  << isa_name(active_isa());
    }
  }
}

TEST(Isa, EveryKernelRunsThePathTheActiveOneAllows) {
  simd_dispatch_counts() = SimdDispatchCounts{};

  // matmul: decode (1x16 / 1x4 / 1x1 tiles) and a few rows.
  const int k = 37, m = 21;
  std::vector<float> x(5 * k), w(m * k), y(5 * m);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>(i % 17) - 0.05f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.02f * static_cast<float>(i % 13) - 0.1f;
  matmul(y.data(), x.data(), w.data(), nullptr, 1, k, m);
  matmul(y.data(), x.data(), w.data(), nullptr, 5, k, m);
  // matmul_wt (w given transposed: attention's prefill products), w read as a [k, m] matrix.
  matmul_wt(y.data(), m, x.data(), k, w.data(), m, 5, k, m);

  // matmul_bf16 on its automatic path: decode and a few rows.
  std::vector<uint16_t> w16(w.size());
  round_to_bf16(w.data(), w.size(), w16.data());
  matmul_bf16(y.data(), x.data(), w16.data(), nullptr, 1, k, m);
  matmul_bf16(y.data(), x.data(), w16.data(), nullptr, 3, k, m);

  // exp_floats.
  std::vector<float> e(40);
  for (size_t i = 0; i < e.size(); ++i) e[i] = -0.25f * static_cast<float>(i);
  exp_floats(e.data(), e.data(), static_cast<int>(e.size()));
  exp_fast_floats(e.data(), e.data(), static_cast<int>(e.size()));  // --dtype native's softmax

  // kcenter_greedy.
  const int n = 9, dim = 3;
  std::vector<float> pts(n * dim);
  for (size_t i = 0; i < pts.size(); ++i) pts[i] = static_cast<float>((i * 7) % 5);
  KCenterArgs ka;
  ka.keys = pts.data();
  ka.n = n;
  ka.dim = dim;
  ka.ld = dim;
  ka.k = 3;
  int32_t centres[3];
  ASSERT_EQ(kcenter_greedy(ka, centres), 3);

  // subgen_count_clusters on finite keys (the "some representative within" rule).
  EXPECT_GE(subgen_count_clusters(pts.data(), n, dim, dim, 1.0, 100), 1);

  // attention, one query (decode: the P x V lanes).
  const int d = 8, len = 5;
  std::vector<float> keys(len * d), values(len * d), q(d), out(d);
  for (int i = 0; i < len * d; ++i) {
    keys[i] = 0.1f * static_cast<float>(i % 7);
    values[i] = 0.2f * static_cast<float>(i % 3);
  }
  for (int j = 0; j < d; ++j) q[j] = 0.3f * static_cast<float>(j % 4);
  std::vector<int32_t> positions = {0, 1, 2, 3, 4}, lengths = {len};
  AttentionArgs a;
  a.out = out.data();
  a.q = q.data();
  a.kv = LayerKvView{keys.data(), values.data(), positions.data(), lengths.data(), 1, d, len};
  a.n = 1;
  a.num_heads = 1;
  a.scale = 0.5f;
  attention(a);

  // The same decode over an f16 cache of head_dim 16 (the scores read the keys in place).
  const int d16 = 16;
  std::vector<uint16_t> keys16(len * d16), values16(len * d16);
  for (int i = 0; i < len * d16; ++i) {
    keys16[i] = f32_to_f16(0.1f * static_cast<float>(i % 7));
    values16[i] = f32_to_f16(0.2f * static_cast<float>(i % 3));
  }
  std::vector<float> q16(d16, 0.25f), out16(d16);
  AttentionArgs a16 = a;
  a16.out = out16.data();
  a16.q = q16.data();
  a16.kv = LayerKvView{nullptr, nullptr, positions.data(), lengths.data(), 1, d16, len};
  a16.kv.keys16 = keys16.data();
  a16.kv.values16 = values16.data();
  attention(a16);

  const SimdDispatchCounts c = simd_dispatch_counts();
  expect_only(c, SimdKernel::kMatmul, widest({Isa::kAvx512, Isa::kAvx2}), "matmul");
  expect_only(c, SimdKernel::kExpFloats, widest({Isa::kAvx512, Isa::kAvx2}), "exp_floats");
  expect_only(c, SimdKernel::kAttentionPv, widest({Isa::kAvx512, Isa::kAvx2}), "attention's P x V");
  expect_only(c, SimdKernel::kAttentionScores, widest({Isa::kAvx512, Isa::kAvx2}),
              "attention's scores over f16 keys");
  expect_only(c, SimdKernel::kExpFast, widest({Isa::kAvx2}), "exp_fast_floats");
  expect_only(c, SimdKernel::kMatmulWt, widest({Isa::kAvx2}), "matmul_wt");
  expect_only(c, SimdKernel::kKCenter, widest({Isa::kAvx2}), "kcenter_greedy");
  expect_only(c, SimdKernel::kSubgenCount, widest({Isa::kAvx2}), "subgen_count_clusters");
  // matmul_bf16 picks from the CPU's features (not the build's) under auto; a forced path caps it.
  const Bf16Path bp = bf16_auto_path();
  const Isa bf16 = bp == Bf16Path::kAvx512 ? Isa::kAvx512
                   : bp == Bf16Path::kAvx2 ? Isa::kAvx2
                                           : Isa::kPortable;
  if (isa_forced()) {
    EXPECT_EQ(bf16, active_isa()) << "a forced path is a path of this CPU, so bf16 takes it";
  }
  expect_only(c, SimdKernel::kMatmulBf16, bf16, "matmul_bf16");
  if (active_isa() == Isa::kPortable) {
    EXPECT_FALSE(bf16_path_supported(Bf16Path::kAvx2));
    EXPECT_FALSE(bf16_path_supported(Bf16Path::kAvx512));
    EXPECT_THROW(matmul_bf16(y.data(), x.data(), w16.data(), nullptr, 1, k, m, Bf16Path::kAvx2),
                 Error);
  }
}

// resolve_isa's message for `value` against `avail`; "" if it did not throw.
std::string refusal(const char* value, const std::vector<Isa>& avail) {
  try {
    resolve_isa(value, avail);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    return e.what();
  }
  return "";
}

TEST(Isa, ValuesResolveOrAreRefusedNamingTheVariableAndThePaths) {
  const std::vector<Isa> all = {Isa::kAvx512, Isa::kAvx2, Isa::kPortable};
  EXPECT_EQ(resolve_isa(nullptr, all), Isa::kAvx512);
  EXPECT_EQ(resolve_isa("", all), Isa::kAvx512);
  EXPECT_EQ(resolve_isa("auto", all), Isa::kAvx512);
  EXPECT_EQ(resolve_isa("avx2", all), Isa::kAvx2);
  EXPECT_EQ(resolve_isa("portable", all), Isa::kPortable);
  const std::vector<Isa> avx2_cpu = {Isa::kAvx2, Isa::kPortable};
  EXPECT_EQ(resolve_isa("auto", avx2_cpu), Isa::kAvx2);
  EXPECT_EQ(resolve_isa(nullptr, std::vector<Isa>{Isa::kPortable}), Isa::kPortable);

  for (const char* bad : {"avx513", "AVX2", "avx2 ", "sse4", "none"}) {
    const std::string e = refusal(bad, avx2_cpu);
    EXPECT_NE(e.find(std::string("KVB_ISA=") + bad + ": unknown value"), std::string::npos) << e;
    EXPECT_NE(e.find("available here: avx2 portable"), std::string::npos) << e;
  }
  // The value is shown escaped and cut.
  const std::string ctl = refusal("avx2\n\x1b[31m", avx2_cpu);
  EXPECT_NE(ctl.find("KVB_ISA=avx2\\n\\u001b[31m: unknown value"), std::string::npos) << ctl;
  const std::string long_value(5000, 'x');
  const std::string cut = refusal(long_value.c_str(), avx2_cpu);
  EXPECT_NE(cut.find("KVB_ISA=" + std::string(40, 'x') + "\xE2\x80\xA6: unknown value"),
            std::string::npos)
      << cut.size();
  // A path that exists but not here: the build's own (compiled) paths say "this CPU lacks" it,
  // the others "this build has no" path.
  const std::string e = refusal("avx512", avx2_cpu);
  EXPECT_NE(e.find("KVB_ISA=avx512: this"), std::string::npos) << e;
#if defined(__AVX512F__)
  EXPECT_NE(e.find("this CPU lacks the avx512 path"), std::string::npos) << e;
#else
  EXPECT_NE(e.find("this build has no avx512 path"), std::string::npos) << e;
#endif
  EXPECT_NE(e.find("available here: auto avx2 portable"), std::string::npos) << e;
  const std::string p = refusal("avx2", std::vector<Isa>{Isa::kPortable});
  EXPECT_NE(p.find("KVB_ISA=avx2: this"), std::string::npos) << p;
  EXPECT_NE(p.find("available here: auto portable"), std::string::npos) << p;
}

// `kvbench --version` says the active path; a bad KVB_ISA stops any command with exit code 2 and
// the message, before it does anything.
struct ShellRun {
  int rc = -1;
  std::string out;
};
ShellRun shell(const std::string& cmd) {
  ShellRun r;
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return r;
  char buf[512];
  while (fgets(buf, sizeof buf, f) != nullptr) r.out += buf;
  const int status = pclose(f);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(Isa, KvbenchSaysThePathAndRefusesABadValue) {
  const std::string kvbench = std::string(KVB_BINARY_DIR) + "/kvbench";
  for (Isa isa : available_isas()) {
    const ShellRun r =
        shell(std::string("KVB_ISA=") + isa_name(isa) + " " + kvbench + " --version");
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find(std::string("cpu kernels: ") + isa_name(isa) +
                         " (KVB_ISA=" + isa_name(isa) + "; available: "),
              std::string::npos)
        << r.out;
  }
  const ShellRun a = shell("env -u KVB_ISA " + kvbench + " --version");
  EXPECT_EQ(a.rc, 0) << a.out;
  EXPECT_NE(a.out.find(std::string("cpu kernels: ") + isa_name(available_isas().front()) +
                       " (KVB_ISA=auto; available: "),
            std::string::npos)
      << a.out;
  for (const char* args : {" --version", " ls policies"}) {
    const ShellRun r = shell("KVB_ISA=avx1024 " + kvbench + args);
    EXPECT_EQ(r.rc, 2) << args << ": " << r.out;
    EXPECT_EQ(r.out.find("cpu kernels:"), std::string::npos)
        << "nothing else is printed: " << r.out;
    EXPECT_NE(r.out.find("KVB_ISA=avx1024: unknown value; use auto (the widest path) or one of "
                         "the paths available here:"),
              std::string::npos)
        << args << ": " << r.out;
  }
}

}  // namespace
}  // namespace kvb::kernels::cpu
