// Issue 17 "must hold": a task definition that restates a built-in LongBench data set gives the
// same samples and the same scores on the same file as the built-in task. Summarization
// (multi_news, rouge_l), QA (multifieldqa_zh, qa_f1_zh) and retrieval (passage_retrieval_zh) on
// the LongBench files in ../shared/data/longbench_v1, through the definitions shipped in
// configs/tasks/longbench. Scores are compared bit for bit on predictions made from the data
// (a reference itself, its first half, another item's reference, a few words, nothing).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "harness/task_file.h"

namespace kvb::harness {
namespace {

// The shipped definitions by name: on the task search path (harness/task_file.h), as a user puts
// them there; kvbench compiles no path to them in.
[[maybe_unused]] const bool kShippedOnSearchPath = [] {
  const std::string dir = std::string(KVB_FIXTURES_DIR) + "/../../configs/tasks";
  return ::setenv("KVBENCH_TASK_PATH", dir.c_str(), 1) == 0;
}();

const std::string kLongBench = KVB_SHARED_DIR "/data/longbench_v1";

tasks::TaskContext ctx() {
  tasks::TaskContext c;
  c.count_tokens = [](const std::string& s) { return static_cast<int>(s.size() / 4); };
  return c;
}

std::vector<std::string> predictions_for(const std::vector<tasks::Sample>& s, size_t i) {
  const std::string& ref = s[i].references.at(0);
  const std::string& other = s[(i + 1) % s.size()].references.at(0);
  return {ref,         ref.substr(0, ref.size() / 2), other, "the news " + ref.substr(0, 20), "",
          "\n\n" + ref};
}

void expect_same_task(const std::string& dataset, const std::string& metric) {
  const std::string file = kLongBench + "/" + dataset + ".jsonl";
  if (!std::filesystem::exists(file)) GTEST_SKIP() << file << " not found";
  const Options builtin_opts({{"dataset", dataset}, {"data_dir", kLongBench}}, "task option");
  const Options def_opts({{"data_dir", kLongBench}}, "task option");
  const auto builtin = make_any_task("longbench", builtin_opts);
  const auto defined = make_any_task("longbench_" + dataset, def_opts);
  ASSERT_EQ(defined->metrics().at(0).name, metric);
  ASSERT_EQ(builtin->metrics().at(0).name, metric);
  const auto a = builtin->samples(ctx());
  const auto b = defined->samples(ctx());
  ASSERT_EQ(a.size(), 200u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(dataset + " item " + std::to_string(i));
    EXPECT_EQ(b[i].id, a[i].id);
    EXPECT_EQ(b[i].context, a[i].context);
    EXPECT_EQ(b[i].question, a[i].question);
    EXPECT_EQ(b[i].answer_prefix, a[i].answer_prefix);
    EXPECT_EQ(b[i].chat, a[i].chat);
    EXPECT_EQ(b[i].max_new_tokens, a[i].max_new_tokens);
    EXPECT_EQ(b[i].stop_strings, a[i].stop_strings);
    EXPECT_EQ(b[i].references, a[i].references);
    EXPECT_EQ(b[i].fields.at("length"), a[i].fields.at("length"));
    for (const std::string& text : predictions_for(a, i)) {
      tasks::Prediction p;
      p.text = text;
      // Bit for bit: the same metric function, the same max over references, the same x100.
      EXPECT_EQ(defined->score(b[i], p).at(metric), builtin->score(a[i], p).at(metric)) << text;
    }
  }
  // The checks above would pass on constant scores: the predictions must spread them.
  tasks::Prediction own, other;
  own.text = a[0].references[0];
  other.text = a[1].references[0];
  EXPECT_GT(defined->score(b[0], own).at(metric), defined->score(b[0], other).at(metric));
}

TEST(TaskFilesLongBench, SummarizationMultiNewsScoresLikeTheBuiltIn) {
  expect_same_task("multi_news", "rouge_l");
}

TEST(TaskFilesLongBench, QaMultifieldqaZhScoresLikeTheBuiltIn) {
  expect_same_task("multifieldqa_zh", "qa_f1_zh");
}

TEST(TaskFilesLongBench, RetrievalPassageRetrievalZhScoresLikeTheBuiltIn) {
  expect_same_task("passage_retrieval_zh", "retrieval_zh");
}

}  // namespace
}  // namespace kvb::harness
