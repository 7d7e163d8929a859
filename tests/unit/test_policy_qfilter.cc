// `qfilter` (kvpress QFilterPress): the score -(filter . key) on a hand-computed cache, the
// filters read from a safetensors file in Hugging Face's channel order (a cache whose rows rotate
// adjacent pairs reads them permuted), the write_rows op, and the file's validation.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/rope.h"
#include "kernels/kv_cache.h"
#include "kernels/ops/cpu_policy_ops.h"
#include "kernels/policies/policy.h"

namespace kvb::policies {
namespace {

using kernels::KvCache;
using V = std::vector<int32_t>;

// A safetensors file with one tensor `name` of `shape` holding `values` as `dtype` (F32; "I64" for
// the refused-dtype case writes 8-byte zeros).
std::string write_filters(const std::string& stem, const std::vector<float>& values,
                          std::vector<int> shape, const std::string& name = "q_filters",
                          const std::string& dtype = "F32") {
  namespace fs = std::filesystem;
  const fs::path path = fs::temp_directory_path() /
                        ("kvb_qf_" + std::to_string(::getpid()) + "_" + stem + ".safetensors");
  const size_t bytes = values.size() * (dtype == "I64" ? 8 : 4);
  std::string dims;
  for (int d : shape) dims += (dims.empty() ? "" : ",") + std::to_string(d);
  const std::string header = "{\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":[" + dims +
                             "],\"data_offsets\":[0," + std::to_string(bytes) + "]}}";
  std::ofstream f(path, std::ios::binary);
  const uint64_t len = header.size();
  for (int b = 0; b < 8; ++b) f.put(static_cast<char>((len >> (8 * b)) & 0xff));
  f << header;
  for (float v : values) {
    if (dtype == "I64") {
      const int64_t z = 0;
      f.write(reinterpret_cast<const char*>(&z), 8);
    } else {
      f.write(reinterpret_cast<const char*>(&v), 4);
    }
  }
  return path.string();
}

PolicyConfig config(int budget, std::map<std::string, std::string> opts) {
  PolicyConfig c;
  c.name = "qfilter";
  c.kv_budget = budget;
  c.shape = {.num_layers = 1, .num_heads = 2, .num_kv_heads = 2, .head_dim = 4,
             .max_seq_len = 64};
  c.options = PolicyOptions(std::move(opts));
  return c;
}

// Two KV heads of four slots, head_dim 4. Head 0's filter (1, 0, 0, 0) in HF's order scores
// -(k[0]); head 1's (0, 0, 1, -1) scores -(k[2] - k[3]).
//   head 0 keys: (3,0,0,0) (-1,0,0,0) (2,0,0,0) (0,5,5,5): scores -3, 1, -2, 0 -> top 2: slots 1, 3
//   head 1 keys: (0,0,1,0) (0,0,0,1) (0,0,2,2) (0,0,-1,0): scores -1, 1, 0, 1 -> top 2: 1 and 3
// With adjacent rows (a GGUF llama's: row j holds HF channel j / 2 or 2 + j / 2), head 0 reads
// its filter at row 0 (channel 0) still, and head 1's channels 2 and 3 sit at rows 1 and 3: it
// scores -(k[1] - k[3]) = 0, 1, 2, 0 and keeps slots 1 and 2.
KvCache four_slots() {
  KvCache cache({.num_layers = 1, .num_kv_heads = 2, .head_dim = 4}, 8);
  const std::vector<std::vector<float>> k0 = {{3, 0, 0, 0}, {-1, 0, 0, 0}, {2, 0, 0, 0},
                                              {0, 5, 5, 5}};
  const std::vector<std::vector<float>> k1 = {{0, 0, 1, 0}, {0, 0, 0, 1}, {0, 0, 2, 2},
                                              {0, 0, -1, 0}};
  const std::vector<float> v = {1, 1, 1, 1};
  for (int s = 0; s < 4; ++s) {
    cache.append(0, 0, k0[s].data(), v.data(), s);
    cache.append(0, 1, k1[s].data(), v.data(), s);
  }
  cache.advance_position(4);
  return cache;
}

V kept(const Policy& p, KvCache cache, kernels::cpu::RopeStyle style) {
  kernels::cpu::RopeParams rope;
  rope.style = style;
  rope.rot_dim = 4;
  LayerStats st;
  st.layer = 0;
  st.n_new = 4;
  st.num_heads = 2;
  st.rope = &rope;
  std::unique_ptr<Policy> q = p.clone();
  prefill_layer(*q, st, cache);
  V out;
  for (int h = 0; h < 2; ++h) {
    const int32_t* pos = cache.layer(0).position(h);
    out.insert(out.end(), pos, pos + cache.length(0, h));
    out.push_back(-1);
  }
  return out;
}

TEST(QFilter, KeepsTheKeysLeastAlignedWithTheFilter) {
  const std::string path = write_filters("hand", {1, 0, 0, 0, 0, 0, 1, -1}, {1, 2, 4});
  const auto p = make_policy(config(2, {{"filters", path}}));
  EXPECT_EQ(kept(*p, four_slots(), kernels::cpu::RopeStyle::kNeox), (V{1, 3, -1, 1, 3, -1}));
  EXPECT_EQ(kept(*p, four_slots(), kernels::cpu::RopeStyle::kNorm), (V{1, 3, -1, 1, 2, -1}));
}

TEST(QFilter, WriteRowsHoldsTheValues) {
  kernels::ops::CpuPolicyOps ops;
  auto rows = ops.make_rows(SlotType::kF32, 2, 3);
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};
  ops.write_rows(*rows, 1, v, 2);
  for (int h = 0; h < 3; ++h) {
    EXPECT_EQ(rows->length(1, h), 2);
    EXPECT_EQ(ops.read_f32(*rows, 1, h), (std::vector<float>{v[2 * h], v[2 * h + 1]}));
    EXPECT_EQ(rows->length(0, h), 0);
  }
  EXPECT_THROW(ops.write_rows(*rows, 1, v, 3), Error);  // 6 values are not 3 rows of 3
}

TEST(QFilter, RefusesFiltersItCannotUse) {
  auto refused = [](std::map<std::string, std::string> o, const std::string& says) {
    try {
      make_policy(config(2, std::move(o)));
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused({}, "needs the option filters=FILE");
  refused({{"filters", "/nonexistent/model.safetensors"}}, "/nonexistent/model.safetensors");
  refused({{"filters", write_filters("shape", std::vector<float>(12, 1), {1, 3, 4})}},
          "filters of another model?");
  refused({{"filters", write_filters("name", std::vector<float>(8, 1), {1, 2, 4}, "weights")}},
          "holds no tensor q_filters");
  refused({{"filters", write_filters("i64", std::vector<float>(8, 0), {1, 2, 4}, "q_filters",
                                     "I64")}},
          "F32, F16 or BF16 expected");
  std::vector<float> nan(8, 1);
  nan[5] = std::numeric_limits<float>::quiet_NaN();
  refused({{"filters", write_filters("nan", nan, {1, 2, 4})}}, "entry 5");
  const std::string fine = write_filters("fine", std::vector<float>(8, 1), {1, 2, 4});
  refused({{"filters", fine}, {"threshold", "0"}, {"threshold_decode", "true"}},
          "threshold_decode");
  EXPECT_NO_THROW(make_policy(config(2, {{"filters", fine}, {"ada", "true"}})));
}

}  // namespace
}  // namespace kvb::policies
