// Tests `finch` (kvpress FinchPress; kernels/policies/finch.cc) by driving on_prefill_layer with
// hand-chosen window probabilities: the question as the window (from the runner or window_size),
// the weighted window mean against the plain one, the no-compression threshold, a budget below
// the window, chunk_length's runs, the refusals and the default re-rotation.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/kv_cache.h"
#include "kernels/policies/policies.h"
#include "workers/unit_run.h"

namespace kvb::policies {
namespace {

using V = std::vector<int32_t>;
using Opts = std::map<std::string, std::string>;

constexpr int kN = 6;  // prompt slots, positions 0..5; the window is the last 2

PolicyConfig config(int budget, const Opts& opts = {}, double fraction = 0) {
  PolicyConfig c;
  c.name = "finch";
  c.kv_budget = budget;
  c.budget_fraction = fraction;
  c.shape = {/*num_layers=*/1, /*num_heads=*/1, /*num_kv_heads=*/1, /*head_dim=*/4,
             /*max_seq_len=*/0};
  c.options = PolicyOptions(opts);
  return c;
}

// The window's two queries (positions 4 and 5) over the 6 slots. Their context columns (0..3):
// query 0 puts 0.5 on slot 1, query 1 puts 0.42 on slot 2. The plain mean ranks slot 1 first
// (0.25 > 0.21); the weighted one weighs query a by its earlier keys, 4 + a: slot 1 scores
// 0.5 x 4 / 2 = 1.0 and slot 2 0.42 x 5 / 2 = 1.05, slots 0 and 3 (0.1 x 4 + 0.1 x 5) / 2 = 0.45.
const std::vector<float> kProbs = {
    0.1f, 0.5f, 0.0f,  0.1f, 0.3f,  0.0f,   // query a = 0 (position 4)
    0.1f, 0.0f, 0.42f, 0.1f, 0.18f, 0.2f,  // query a = 1 (position 5)
};

// Runs the layer's prompt hook of `p` on a cache of kN slots; the kept positions.
V decide(Policy& p) {
  kernels::KvCache cache({1, 1, 4}, kN + 2);
  const std::vector<float> kv(4, 0.0f);
  for (int t = 0; t < kN; ++t) cache.append(0, 0, kv.data(), kv.data(), t);
  cache.advance_position(kN);
  const int w = p.prefill_request(kN).last_w;
  LayerStats st;
  st.layer = 0;
  st.n_new = kN;
  st.num_heads = 1;
  st.stride = kN;
  st.last_w = w;
  st.last_probs = kProbs.data() + static_cast<size_t>(2 - w) * kN;  // the last w queries
  prefill_layer(p, st, cache);
  const int32_t* pos = cache.layer(0).position(0);
  return V(pos, pos + cache.length(0, 0));
}

std::unique_ptr<Policy> with_question(const PolicyConfig& c, int question) {
  std::unique_ptr<Policy> p = make_policy(c);
  p->set_question_tokens(question, 0);
  return p;
}

TEST(Finch, TheQuestionIsTheWindowAndItsQueriesWeighByTheirKeys) {
  // Budget 3: the window (slots 4, 5) and the context's best by the weighted mean, slot 2.
  EXPECT_EQ(decide(*with_question(config(3), 2)), (V{2, 4, 5}));
  EXPECT_EQ(with_question(config(3), 2)->prefill_request(kN).last_w, 2);
  // window_size gives the same window without a question; it wins over the runner's.
  EXPECT_EQ(decide(*make_policy(config(3, {{"window_size", "2"}}))), (V{2, 4, 5}));
  EXPECT_EQ(decide(*with_question(config(3, {{"window_size", "2"}}), 5)), (V{2, 4, 5}));
  // normalize_scores off: SnapKV's plain mean picks slot 1.
  EXPECT_EQ(decide(*with_question(config(3, {{"normalize_scores", "false"}}), 2)), (V{1, 4, 5}));
  // Budget 4: slots 1 and 2 (1.0, 1.05) over the 0.45s.
  EXPECT_EQ(decide(*with_question(config(4), 2)), (V{1, 2, 4, 5}));
  // A one-token question: query 1 alone, weighing its 5 earlier keys. Slot 4 is context now:
  // slot 2 scores 0.42 x 5 = 2.1, slot 4 0.18 x 5 = 0.9, slots 0 and 3 tie at 0.1 x 5 = 0.5 (the
  // later, 3, stays first), slot 1 0.
  EXPECT_EQ(decide(*with_question(config(2), 1)), (V{2, 5}));
  EXPECT_EQ(decide(*with_question(config(3), 1)), (V{2, 4, 5}));
  EXPECT_EQ(decide(*with_question(config(4), 1)), (V{2, 3, 4, 5}));
}

// The runner hands the question's and the template tail's tokens apart: both stay as the window,
// the question's queries alone score (kvpress compresses the question with the context and adds
// the tail after it). A one-token question and a one-token tail: query 0 alone (weight 4): slot
// 1 scores 0.5 x 4 = 2, slots 0 and 3 0.4, slot 2 0. Without a question the tail's queries score.
TEST(Finch, TheQuestionsQueriesScoreAndTheTailStays) {
  workers::detail::PromptTokens pt;
  pt.question = {7};
  pt.tail = {8};
  std::unique_ptr<Policy> p = make_policy(config(3));
  workers::detail::hand_question(*p, pt, {});
  EXPECT_EQ(p->prefill_request(kN).last_w, 2);
  EXPECT_EQ(decide(*p), (V{1, 4, 5}));
  std::unique_ptr<Policy> tail_only = make_policy(config(3));
  tail_only->set_question_tokens(0, 2);
  EXPECT_EQ(decide(*tail_only), (V{2, 4, 5}));
  // The question streamed after compression (`rest` holds it): nothing to take as the window.
  std::unique_ptr<Policy> after = make_policy(config(3));
  workers::detail::hand_question(*after, pt, {7, 8});
  EXPECT_THROW(after->prefill_request(kN), Error);
}

TEST(Finch, AShortPromptStaysAndABudgetBelowTheWindowKeepsItsRecentEnd) {
  // A prompt of at most kv_budget tokens is not compressed.
  EXPECT_EQ(decide(*with_question(config(kN), 2)), (V{0, 1, 2, 3, 4, 5}));
  // A budget below the window: the window's padded scores tie, the recent slots stay.
  EXPECT_EQ(decide(*with_question(config(1), 2)), (V{5}));
}

TEST(Finch, ChunkLengthKeepsEachRunsShareWithTheWindowFirst) {
  // Runs of 3 at fraction 0.5 keep max(1, int(3 x 0.5)) = 1 each: slot 2 (1.05) of {0, 1, 2};
  // of {3, 4, 5} the window's slots outrank slot 3 and tie, so the later one (5) stays.
  EXPECT_EQ(decide(*with_question(config(3, {{"chunk_length", "3"}}, 0.5), 2)), (V{2, 5}));
  // A token budget's fraction is kv_budget / n: 5 / 6 keeps int(2.5) = 2 of each run (4 in all:
  // kvpress's count, below the budget).
  EXPECT_EQ(decide(*with_question(config(5, {{"chunk_length", "3"}}), 2)), (V{1, 2, 4, 5}));
}

TEST(Finch, WithoutAQuestionItNamesTheFix) {
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
      return std::string(e.what());
    }
    ADD_FAILURE() << "no error";
    return std::string();
  };
  // generate's one-text prompt: no question given.
  const std::string none = message([] { make_policy(config(3))->prefill_request(kN); });
  EXPECT_NE(none.find("window_size=N"), std::string::npos) << none;
  // The question streamed after compression: none in the prompt.
  const std::string after = message([] { with_question(config(3), 0)->prefill_request(kN); });
  EXPECT_NE(after.find("question: in_prompt"), std::string::npos) << after;
  EXPECT_NE(after.find("window_size"), std::string::npos) << after;
}

TEST(Finch, ReRotatesByDefaultExceptOnSlidingLayers) {
  EXPECT_TRUE(make_policy(config(3, {{"window_size", "2"}}))->rerotates());
  EXPECT_FALSE(make_policy(config(3, {{"positions", "true"}}))->rerotates());
  PolicyConfig sliding = config(3);
  sliding.shape.sliding_layers = true;
  EXPECT_FALSE(make_policy(sliding)->rerotates());
  sliding.options = PolicyOptions(Opts{{"positions", "rerotate"}});
  try {
    make_policy(sliding);
    ADD_FAILURE() << "rerotate on sliding-window layers was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("positions: true"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvb::policies
