// Golden-logit comparison shared by the engine tests of the tiny fixtures written by
// scripts/make_<family>_fixture.py (JSON: cases[] of {name, ids, top1, logits[position][vocab]}):
// max |logit - reference| over every position and every vocabulary entry, top-1 agreement, and the
// same through the KV cache in pieces (prefill, a second chunk, then single-token decode steps).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "run_kvbench.h"
#include "workers/engine/engine.h"
#include "workers/engine/model.h"
#include "workers/formats/model_load.h"
#include "workers/model_session.h"

namespace kvb::golden {

inline nlohmann::json load_fixture(const std::string& path, const std::string& script) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path << " missing: run " << script;
  return nlohmann::json::parse(f);
}

inline const nlohmann::json& find_case(const nlohmann::json& cases, const std::string& name) {
  for (const auto& cs : cases) {
    if (cs["name"] == name) return cs;
  }
  throw std::runtime_error("fixture has no case " + name);
}

// Max |got - ref| over rows [row0, row0 + rows) of a case; got holds `rows` rows of V logits.
// Also counts rows whose argmax (ties to the lower id) differs from the reference's top-1.
struct Diff {
  double max_abs = 0;
  int top1_mismatch = 0;
  std::string first_mismatch;
};

inline Diff compare_rows(const std::vector<float>& got, const nlohmann::json& cs, int row0,
                         int rows, int V) {
  Diff d;
  for (int r = 0; r < rows; ++r) {
    const auto& ref = cs["logits"][row0 + r];
    const float* g = &got[static_cast<size_t>(r) * V];
    for (int v = 0; v < V; ++v) {
      d.max_abs = std::max(d.max_abs, std::fabs(g[v] - ref[v].get<double>()));
    }
    const int top1 = static_cast<int>(std::max_element(g, g + V) - g);
    const int want = cs["top1"][row0 + r].get<int>();
    if (top1 != want && d.top1_mismatch++ == 0) {
      d.first_mismatch = "position " + std::to_string(row0 + r) + ": top-1 " +
                         std::to_string(top1) + ", reference " + std::to_string(want);
    }
  }
  return d;
}

// One prefill of the whole case, logits at every position.
inline Diff run_case(const engine::Model& model, const nlohmann::json& cs) {
  engine::Engine eng(model);
  const std::vector<int32_t> ids = cs["ids"].get<std::vector<int32_t>>();
  kernels::KvCache cache = eng.new_cache(static_cast<int>(ids.size()));
  std::vector<float> logits;
  eng.forward(ids, cache, engine::LogitsMode::kAll, &logits);
  EXPECT_EQ(logits.size(), ids.size() * model.config.vocab_size);
  return compare_rows(logits, cs, 0, static_cast<int>(ids.size()), model.config.vocab_size);
}

// Called after each piece of run_chunked with its tokens [begin, end), that piece's Diff and the
// cache after it: a test's own checks per step (top-1 per piece, what the cache holds).
using StepCheck =
    std::function<void(int begin, int end, const Diff& d, const kernels::KvCache& cache)>;

// A change to a loaded model that a fixture must detect: what it drops or misapplies.
struct Mutation {
  const char* what;
  void (*apply)(engine::Model&);
};

// The fixture has teeth: each mutation, applied to a fresh load of `model_path`, moves the case's
// logits by more than `min_diff` (the tests: 100 times their tolerance). Prints each figure after
// "[ tag ]".
inline void expect_mutations_detected(const std::string& tag, const std::string& model_path,
                                      const nlohmann::json& cs, std::span<const Mutation> mutations,
                                      double min_diff) {
  for (const Mutation& mu : mutations) {
    std::unique_ptr<engine::Model> model = engine::load_model(model_path);
    mu.apply(*model);
    const Diff d = run_case(*model, cs);
    std::cout << "[ " << tag << " ] with " << mu.what
              << ": max |logit - transformers| = " << d.max_abs << ", top-1 differs at "
              << d.top1_mismatch << "/" << cs["ids"].size() << " positions\n";
    EXPECT_GT(d.max_abs, min_diff) << mu.what;
  }
}

// A StepCheck: each piece on its own has the reference's top-1 at every position it scores.
inline void expect_step_top1(int begin, int end, const Diff& d, const kernels::KvCache&) {
  EXPECT_EQ(d.top1_mismatch, 0) << "tokens [" << begin << ", " << end << "), first at "
                                << d.first_mismatch;
}

// Every case of a fixture against the reference, one prefill each: logits within `tol` at every
// position and the same top-1 everywhere; the fixture must hold a case of 100+ tokens. Prints each
// figure after "[ tag ]" and records it as a test property (<case>_max_abs_diff).
inline void expect_every_case_matches(const std::string& tag, const engine::Model& model,
                                      const nlohmann::json& cases, double tol) {
  int long_cases = 0;
  for (const auto& cs : cases) {
    const size_t n = cs["ids"].size();
    ASSERT_EQ(cs["logits"].size(), n);
    const Diff d = run_case(model, cs);
    std::cout << "[ " << tag << " ] " << cs["name"].get<std::string>() << ": " << n
              << " tokens, max |logit - transformers| = " << d.max_abs << " over all "
              << model.config.vocab_size << " logits at every position, top-1 agreement "
              << n - d.top1_mismatch << "/" << n << "\n";
    ::testing::Test::RecordProperty(cs["name"].get<std::string>() + "_max_abs_diff",
                                    std::to_string(d.max_abs));
    EXPECT_LT(d.max_abs, tol) << cs["name"];
    EXPECT_EQ(d.top1_mismatch, 0) << cs["name"] << ", first at " << d.first_mismatch;
    if (n >= 100) ++long_cases;
  }
  EXPECT_GE(long_cases, 1) << "the fixture must include a sequence of 100+ tokens";
}

// The case through the cache in pieces: tokens [0, first), [first, second) with logits at every
// position, then one decode step per remaining token (last-position logits).
inline Diff run_chunked(const engine::Model& model, const nlohmann::json& cs, int first, int second,
                        const StepCheck& check = {}) {
  const std::vector<int32_t> ids = cs["ids"].get<std::vector<int32_t>>();
  const int n = static_cast<int>(ids.size()), V = model.config.vocab_size;
  EXPECT_LT(second, n);
  engine::Engine eng(model);
  kernels::KvCache cache = eng.new_cache(8);  // small: forces the cache to grow
  std::vector<float> logits;
  Diff total;
  auto step = [&](int begin, int end, engine::LogitsMode mode) {
    eng.forward(std::span<const int32_t>(ids).subspan(begin, end - begin), cache, mode, &logits);
    const int row0 = mode == engine::LogitsMode::kAll ? begin : end - 1;
    const Diff d = compare_rows(logits, cs, row0, end - row0, V);
    total.max_abs = std::max(total.max_abs, d.max_abs);
    if (d.top1_mismatch > 0 && total.top1_mismatch == 0) total.first_mismatch = d.first_mismatch;
    total.top1_mismatch += d.top1_mismatch;
    if (check) check(begin, end, d, cache);
  };
  step(0, first, engine::LogitsMode::kAll);
  step(first, second, engine::LogitsMode::kAll);
  for (int t = second; t < n; ++t) step(t, t + 1, engine::LogitsMode::kLast);
  EXPECT_EQ(cache.next_position(), n);
  return total;
}

// The CLI end to end, against the reference: the first `n` bytes of a case whose ids are bytes
// (a prefix no merge applies to) encode to those ids with the GGUF's own tokenizer, and
// `kvbench generate -n 1` prints the text of the reference's top-1 at position n - 1.
// `piece(id)` is that token's text (the fixtures: a byte below 128, else a merged pair).
inline void expect_cli_greedy_matches(const std::string& model, const nlohmann::json& cs, int n,
                                      const std::vector<std::string>& merged) {
  const std::vector<int32_t> ids = cs["ids"].get<std::vector<int32_t>>();
  const std::string prompt(ids.begin(), ids.begin() + n);
  const workers::LoadedModel lm = workers::load_model_and_tokenizer(model, "");
  EXPECT_EQ(workers::encode_text(lm, prompt, false, false),
            std::vector<int32_t>(ids.begin(), ids.begin() + n));
  std::string out, err;
  ASSERT_EQ(
      testing::kvbench({"generate", "--model", model, "--prompt", prompt, "-n", "1"}, &out, &err),
      0)
      << err;
  const int top1 = cs["top1"][n - 1].get<int>();
  const std::string piece = top1 < 128 ? std::string(1, static_cast<char>(top1))
                                       : merged.at(static_cast<size_t>(top1 - 128));
  EXPECT_EQ(out, piece + "\n") << "'" << prompt << "' -> top-1 " << top1 << "; " << err;
}

}  // namespace kvb::golden
