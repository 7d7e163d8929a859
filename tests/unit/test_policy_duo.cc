// `duo_attention` (kvpress DuoAttentionPress): which heads stream, hand-computed from a pattern
// folder written here in the DuoAttention repository's format, what a streaming head keeps, and
// the refusals of a missing or hostile folder (each naming the file and what to give).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/kv_cache.h"
#include "kernels/policies/policy.h"

namespace kvb::policies {
namespace {

namespace fs = std::filesystem;
using V = std::vector<int32_t>;

// A pattern folder: full_attention_heads.tsv as given, config.json with sink and recent sizes.
std::string patterns(const std::string& name, const std::string& tsv,
                     const std::string& config = R"({"sink_size": 2, "recent_size": 3})") {
  const fs::path dir = fs::temp_directory_path() / ("kvb_duo_" + std::to_string(::getpid())) / name;
  fs::create_directories(dir);
  std::ofstream(dir / "full_attention_heads.tsv") << tsv;
  std::ofstream(dir / "config.json") << config;
  return dir.string();
}

std::unique_ptr<Policy> duo(const std::string& dir, const std::string& ratio) {
  PolicyConfig c;
  c.name = "duo_attention";
  c.kv_budget = 4;
  c.shape = {2, 2, 2, 1, 0};  // 2 layers, 2 KV heads
  c.options = PolicyOptions({{"patterns", dir}, {"head_compression_ratio", ratio}});
  return make_policy(c);
}

// Which of the 4 (layer, head) pairs stream, read off the prefill of a 10-token cache: a
// streaming head keeps its first 2 (sink_size) and last 3 (recent_size) tokens.
std::vector<V> kept(Policy& p) {
  kernels::KvCache cache({2, 2, 1}, 10);
  const float x = 1;
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) {
      for (int j = 0; j < 10; ++j) cache.append(l, h, &x, &x, j);
    }
  }
  LayerStats st;
  st.n_new = 10;
  st.num_heads = 2;
  std::vector<V> out;
  for (int l = 0; l < 2; ++l) {
    st.layer = l;
    prefill_layer(p, st, cache);
    for (int h = 0; h < 2; ++h) {
      const int32_t* pos = cache.layer(l).position(h);
      out.emplace_back(pos, pos + cache.length(l, h));
    }
  }
  return out;
}

// Scores layer 0 (0.9, 0.1), layer 1 (0.5, 0.1); ascending: (0, 1) and (1, 1) tie at 0.1 (the
// lower first), then (1, 0), then (0, 0). Ratio 0.25 streams round(1.0) = 1 head, (0, 1); 0.5 and
// 0.375 (round(1.5) = 2, halves to even) stream (0, 1) and (1, 1); 0.125 (round(0.5) = 0) none.
// A score above 1 is clipped to 1 (kvpress's np.clip), below 0 to 0.
TEST(DuoAttentionPolicy, TheLowestScoringHeadsKeepTheirSinkAndRecentTokens) {
  const std::string dir = patterns("ok", "0.9\t0.1\n0.5\t0.1\n");
  const V all = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, streamed = {0, 1, 7, 8, 9};
  EXPECT_EQ(kept(*duo(dir, "0.25")), (std::vector<V>{all, streamed, all, all}));
  EXPECT_EQ(kept(*duo(dir, "0.5")), (std::vector<V>{all, streamed, all, streamed}));
  EXPECT_EQ(kept(*duo(dir, "0.375")), (std::vector<V>{all, streamed, all, streamed}));
  EXPECT_EQ(kept(*duo(dir, "0.125")), (std::vector<V>{all, all, all, all}));
  EXPECT_EQ(kept(*duo(dir, "0")), (std::vector<V>{all, all, all, all}));
  const std::string clipped = patterns("clip", "7\t-3\n0.5\t0.2\r\n\n");
  EXPECT_EQ(kept(*duo(clipped, "0.25")), (std::vector<V>{all, streamed, all, all}));
  EXPECT_EQ(kept(*duo(clipped, "0.75")), (std::vector<V>{all, streamed, streamed, streamed}));
}

// Each refusal is a usage error whose message names the input and what to give.
TEST(DuoAttentionPolicy, RefusesAMissingOrHostilePatternFolder) {
  auto refused = [](const std::string& dir, const std::string& needle) {
    try {
      duo(dir, "0.5");
      ADD_FAILURE() << dir << " accepted; expected: " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused("", "needs the option patterns=DIR");
  refused("/nonexistent/kvb_duo", "is not a folder");
  refused(patterns("rows", "0.9\t0.1\n"), "has 1 rows for a model of 2 layers");
  refused(patterns("more", "0.9\t0.1\n0.5\t0.1\n0.3\t0.3\n"), "has more than 2 rows");
  refused(patterns("cols", "0.9\t0.1\t0.3\n0.5\t0.1\n"), ":1: 3 columns for a model of 2 KV heads");
  refused(patterns("nan", "0.9\tnan\n0.5\t0.1\n"), ":1: column 2 'nan' is not a finite number");
  refused(patterns("text", "0.9\t0.1\n0.5\tx\n"), ":2: column 2 'x' is not a finite number");
  refused(patterns("nojson", "0.9\t0.1\n0.5\t0.1\n", "{"), "is not JSON");
  refused(patterns("nokey", "0.9\t0.1\n0.5\t0.1\n", R"({"sink_size": 2})"),
          "must give recent_size");
  refused(patterns("neg", "0.9\t0.1\n0.5\t0.1\n", R"({"sink_size": -1, "recent_size": 3})"),
          "must give sink_size");
  const std::string loop = patterns("loop", "") + "/self";
  fs::create_symlink(loop, loop);
  refused(loop, "is not a folder");
  const std::string big = patterns("big", "");
  fs::resize_file(fs::path(big) / "full_attention_heads.tsv", (64u << 20) + 1);
  refused(big, "is over 64 MiB");
  const std::string fifo_dir = patterns("fifo", "");
  fs::remove(fs::path(fifo_dir) / "full_attention_heads.tsv");
  ASSERT_EQ(::mkfifo((fs::path(fifo_dir) / "full_attention_heads.tsv").c_str(), 0600), 0);
  refused(fifo_dir, "FIFO");
}

}  // namespace
}  // namespace kvb::policies
