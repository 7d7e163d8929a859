// scripts/bench_medians.awk, which scripts/device_check.sh runs on a GPU machine over the
// interleaved A/Bs of bench_cuda_engine: the medians per (context, policy, budget, kernel,
// graphs off/on) and the on/off ratio, against values computed by hand from the fixture
// (tests/fixtures/bench/engine_graphs_ab.txt: three pairs of `full` at 512, an odd count, and two
// of h2o at 4K, an even count; headers, comments and a skipped row ignored).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

namespace kvb {
namespace {

std::string run(const std::string& cmd) {
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) return "";
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p.get())) out += buf;
  return out;
}

TEST(BenchMedians, MediansAndRatiosOfTheGraphsAB) {
  const std::string root = std::string(KVB_FIXTURES_DIR) + "/../..";
  const std::string out = run("awk -f " + root + "/scripts/bench_medians.awk " +
                              KVB_FIXTURES_DIR + "/bench/engine_graphs_ab.txt 2>&1");
  auto has = [&](const std::string& line) {
    EXPECT_NE(out.find(line), std::string::npos) << "missing: " << line << "\n" << out;
  };
  // full at 512: decode t/s off {100, 101, 99} -> 100, on {120, 121, 119} -> 120; step ms, policy%
  // and wait ms likewise (10.000, 0.5, 9.000 off; 8.333, 0.5, 7.900 on).
  has("512      full              0 default  off     3       100.0    10.000      0.5     9.000");
  has("512      full              0 default  on      3       120.0     8.333      0.5     7.900");
  // h2o at 4K, two runs each: means of the middle pair: off (90 + 94) / 2 = 92, on 111; step
  // (11.111 + 10.638) / 2 = 10.8745, policy% 8.0, wait 9.1; on: 9.0095, 3.2, 8.0 (printf's %.3f
  // of the doubles nearest 10.8745 and 9.0095, which lie just above and just below the half).
  has("4096     h2o            1024 default  off     2        92.0    10.875      8.0     9.100");
  has("4096     h2o            1024 default  on      2       111.0     9.009      3.2     8.000");
  // Ratios: 120 / 100 and 111 / 92 = 1.2065.
  has("graphs on/off, 512 full@0 default: decode t/s x1.200 (medians of 3 and 3 runs)");
  has("graphs on/off, 4096 h2o@1024 default: decode t/s x1.207 (medians of 2 and 2 runs)");
  EXPECT_EQ(out.find("65536"), std::string::npos) << "a skipped row was counted:\n" << out;
}

}  // namespace
}  // namespace kvb
