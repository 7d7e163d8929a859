// RULER qa_1 / qa_2 (tasks/ruler_qa.h, tasks/py_random.h) against RULER's own code
// (scripts/make_ruler_qa_fixture.py ran RULER c3f5e3b's qa.py on the hand-made corpora in
// tests/fixtures/tasks/ruler_qa): CPython's random.Random(seed).shuffle permutations; the prompt
// text byte for byte where RULER's draws leave no choice (every document, or the gold ones only);
// otherwise the "Document k" numbers of the gold documents (RULER's answer positions); and the
// task end to end: budget, one document count for all samples as qa.py, string_match_part.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tasks/py_random.h"
#include "tasks/ruler_qa.h"
#include "ws_tokens.h"

namespace kvb::tasks {
namespace {

const std::string kDir = KVB_FIXTURES_DIR "/tasks/ruler_qa";

nlohmann::json expected() {
  std::ifstream in(kDir + "/expected.json");
  EXPECT_TRUE(in.good());
  return nlohmann::json::parse(in);
}

TEST(RulerQa, PythonShuffleMatchesCPython) {
  const auto e = expected();
  ASSERT_GE(e["shuffle"].size(), 20u);
  for (const auto& c : e["shuffle"]) {
    EXPECT_EQ(py::shuffle_order(c["seed"].get<uint64_t>(), c["n"].get<size_t>()),
              c["order"].get<std::vector<size_t>>())
        << "seed " << c["seed"] << " n " << c["n"];
  }
}

// The "Document k" numbers whose document is one of `gold` (RULER's DOCUMENT_PROMPT blocks).
std::vector<int> gold_positions(const std::string& text, const std::vector<std::string>& gold) {
  std::vector<int> out;
  for (int k = 1;; ++k) {
    const std::string head = "Document " + std::to_string(k) + ":\n";
    const size_t at = text.find(head);
    if (at == std::string::npos) break;
    for (const std::string& g : gold) {
      if (text.compare(at + head.size(), g.size(), g) == 0 &&
          text.compare(at + head.size() + g.size(), 2, "\n\n") == 0) {
        out.push_back(k);
      }
    }
  }
  return out;
}

void expect_like_ruler(const QaCorpus& corpus, const nlohmann::json& cases, size_t min_text) {
  size_t texts = 0, positions = 0;
  for (const auto& c : cases) {
    const int index = c["index"];
    const int64_t num_docs = c["num_docs"];
    SCOPED_TRACE("question " + std::to_string(index) + ", " + std::to_string(num_docs) + " docs");
    Rng rng(42, 0);
    const Generated g = qa_instance(corpus, index, num_docs, 42, rng);
    const std::string text = g.parts.context + g.parts.question;
    EXPECT_EQ(" " + g.parts.answer_prefix, c["answer_prefix"].get<std::string>());
    EXPECT_EQ(g.answers, c["outputs"].get<std::vector<std::string>>());
    const auto& q = corpus.qas[index];
    std::vector<std::string> gold;
    for (int64_t d : q.context) gold.push_back(corpus.docs[d]);
    const bool no_choice = num_docs >= static_cast<int64_t>(corpus.docs.size()) ||
                           num_docs == static_cast<int64_t>(q.context.size());
    if (no_choice) {
      EXPECT_EQ(text, c["input"].get<std::string>());
      ++texts;
    } else {
      EXPECT_EQ(gold_positions(text, gold), c["gold_documents"].get<std::vector<int>>());
      ++positions;
    }
  }
  EXPECT_GE(texts, min_text);
  EXPECT_GE(positions, 4u);
}

TEST(RulerQa, SquadLikeRuler) {
  const QaCorpus c = read_squad_corpus(kDir + "/squad_tiny.json");
  EXPECT_EQ(c.docs.size(), 5u);
  ASSERT_EQ(c.qas.size(), 4u);  // the impossible question is left out
  EXPECT_EQ(c.qas[0].more_context.size(), 2u);
  expect_like_ruler(c, expected()["squad"], 8);
}

TEST(RulerQa, HotpotqaLikeRuler) {
  const QaCorpus c = read_hotpotqa_corpus(kDir + "/hotpotqa_tiny.json");
  EXPECT_EQ(c.docs.size(), 8u);  // "Berlin" appears in two questions: one document
  ASSERT_EQ(c.qas.size(), 3u);
  EXPECT_EQ(c.qas[1].context.size(), 4u);
  expect_like_ruler(c, expected()["hotpotqa"], 6);
}

TEST(RulerQa, TaskFitsTheBudgetAndScoresAnyAnswer) {
  TaskContext ctx;
  ctx.count_tokens = ws_count;
  auto task = make_task("ruler_qa", Options({{"dataset", "squad"},
                                             {"file", kDir + "/squad_tiny.json"},
                                             {"context_length", "160"},
                                             {"num_samples", "4"},
                                             {"chat", "false"}},
                                            "task option"));
  EXPECT_EQ(task->metrics().at(0).name, "string_match_part");
  const auto s = task->samples(ctx);
  ASSERT_EQ(s.size(), 4u);
  const QaCorpus c = read_squad_corpus(kDir + "/squad_tiny.json");
  size_t docs0 = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const int tokens = ws_count(s[i].context) + ws_count(s[i].question) +
                       ws_count(s[i].answer_prefix) + s[i].max_new_tokens;
    EXPECT_LE(tokens, 160) << i;
    EXPECT_EQ(s[i].max_new_tokens, 32);
    EXPECT_EQ(s[i].answer_prefix, " Answer:");
    EXPECT_EQ(s[i].references, c.qas[i].outputs);
    EXPECT_NE(s[i].context.find(c.docs[c.qas[i].context[0]]), std::string::npos) << i;
    EXPECT_EQ(s[i].fields.at("dataset"), "squad");
    EXPECT_EQ(s[i].fields.at("task_group"), "ruler");
    size_t docs = 0;
    for (size_t at = s[i].context.find("Document "); at != std::string::npos;
         at = s[i].context.find("Document ", at + 1)) {
      ++docs;
    }
    if (i == 0) docs0 = docs;
    EXPECT_LE(docs, docs0);  // sample 0's count, stepped down only where a sample is longer
  }
  // 160 tokens hold a few of the five paragraphs, not all nine repeats of a larger count.
  EXPECT_GE(docs0, 2u);
  EXPECT_LT(docs0, 9u);
  Prediction p;
  p.text = "It is in france.";
  EXPECT_DOUBLE_EQ(task->score(s[0], p).at("string_match_part"), 1.0);
  p.text = "Paris";
  EXPECT_DOUBLE_EQ(task->score(s[0], p).at("string_match_part"), 0.0);
}

TEST(RulerQa, Errors) {
  auto err = [](std::map<std::string, std::string> kv) {
    try {
      TaskContext ctx;
      ctx.count_tokens = ws_count;
      make_task("ruler_qa", Options(std::move(kv), "task option"))->samples(ctx);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err({{"dataset", "squad"}}).find("--task-opt file=JSON"), std::string::npos);
  EXPECT_NE(err({{"dataset", "squad"}, {"file", kDir + "/none.json"}}).find("download_qa_dataset"),
            std::string::npos);
  EXPECT_NE(err({{"dataset", "hotpotqa"}, {"file", kDir + "/squad_tiny.json"}})
                .find("a HotpotQA file is a list"),
            std::string::npos);
  EXPECT_NE(err({{"dataset", "squad"}, {"file", kDir + "/squad_tiny.json"}, {"num_samples", "9"}})
                .find("fewer than num_samples=9"),
            std::string::npos);
  EXPECT_NE(
      err({{"dataset", "trivia"}, {"file", kDir + "/squad_tiny.json"}}).find("squad, hotpotqa"),
      std::string::npos);
}

}  // namespace
}  // namespace kvb::tasks
