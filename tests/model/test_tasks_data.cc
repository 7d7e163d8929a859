// The data-set tasks (longbench, longbench_v2, xsum, perplexity, mc) on the real files in
// ../shared/data and on the fixtures in tests/fixtures/tasks: sample counts, prompts rebuilt here
// independently from the raw lines and the published templates, chat flags, generation lengths,
// scoring per metric family, token-weighted perplexity by hand, and the loaders' error messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "tasks/jsonl.h"
#include "tasks/task.h"
#include "ws_tokens.h"

namespace kvb::tasks {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const std::string kData = KVB_SHARED_DIR "/data";
const std::string kFixtures = KVB_FIXTURES_DIR "/tasks";

TaskContext ws_context() {  // whitespace tokens: enough for what tasks ask of a tokenizer
  TaskContext c;
  c.count_tokens = ws_count;
  c.max_context = 8192;
  return c;
}

std::unique_ptr<Task> task(const std::string& name, std::map<std::string, std::string> kv) {
  return make_task(name, Options(std::move(kv), "task option"));
}

std::vector<Sample> load(const std::string& name, std::map<std::string, std::string> kv) {
  return task(name, std::move(kv))->samples(ws_context());
}

std::vector<json> raw_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(json::parse(line));
  }
  return out;
}

Prediction text(const std::string& t) {
  Prediction p;
  p.text = t;
  return p;
}

Prediction logliks(std::vector<double> ll) {
  Prediction p;
  p.choice_logliks = std::move(ll);
  return p;
}

// The error message of `f`, which must throw kvb::Error.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no kvb::Error thrown";
  return "";
}

// ---- LongBench v1 on the real files ------------------------------------------------------------

struct RealSet {
  std::string dataset, metric;
  int max_new_tokens;
  std::string before_context, before_input, after_input;  // the published template, split
  bool zh_char;
};

const RealSet kRealSets[] = {
    {"multi_news", "rouge_l", 512,
     "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n",
     "\n\nNow, write a one-page summary of all the news.\n\nSummary:", "", false},
    {"multifieldqa_zh", "qa_f1_zh", 64, "阅读以下文字并用中文简短回答：\n\n",
     "\n\n现在请基于上面的文章回答下面的问题，只告诉我答案，不要输出任何其他字词。\n\n问题：",
     "\n回答：", true},
    {"passage_retrieval_zh", "retrieval_zh", 32,
     "以下是若干段落文字，以及其中一个段落的摘要。请确定给定的摘要出自哪一段。\n\n",
     "\n\n下面是一个摘要\n\n",
     "\n\n请输入摘要所属段落的编号。答案格式必须是\"段落1\"，\"段落2\"等格式\n\n答案是：", false},
};

TEST(LongBench, RealFilesLoadWithTemplatesAndScoreTheAnswerAsMax) {
  for (const RealSet& rs : kRealSets) {
    SCOPED_TRACE(rs.dataset);
    auto t = task("longbench", {{"dataset", rs.dataset}, {"data_dir", kData + "/longbench_v1"}});
    ASSERT_EQ(t->metrics().size(), 1u);
    EXPECT_EQ(t->metrics()[0].name, rs.metric);
    EXPECT_TRUE(t->metrics()[0].higher_is_better);
    const std::vector<Sample> samples = t->samples(ws_context());
    const std::vector<json> raw = raw_lines(kData + "/longbench_v1/" + rs.dataset + ".jsonl");
    ASSERT_EQ(samples.size(), 200u);  // limit absent = limit 0 = all items
    ASSERT_EQ(raw.size(), 200u);
    std::vector<Scores> scores;
    for (size_t i = 0; i < samples.size(); ++i) {
      const Sample& s = samples[i];
      const json& r = raw[i];
      EXPECT_EQ(s.id, r["_id"].get<std::string>());
      EXPECT_EQ(s.kind, SampleKind::kGenerate);
      // Context = template up to and including the document; question = the rest, filled.
      const std::string context = r["context"].get<std::string>();
      EXPECT_EQ(s.context, rs.before_context + context);
      const std::string input = r["input"].get<std::string>();
      EXPECT_EQ(s.question,
                rs.before_input + (rs.after_input.empty() ? "" : input + rs.after_input));
      EXPECT_TRUE(s.chat);
      EXPECT_EQ(s.max_new_tokens, rs.max_new_tokens);
      EXPECT_TRUE(s.stop_strings.empty());
      EXPECT_EQ(s.references, r["answers"].get<std::vector<std::string>>());
      const int length = r["length"].get<int>();
      EXPECT_EQ(s.fields.at("length"), std::to_string(length));
      EXPECT_EQ(s.fields.at("length_bucket"), length < 4000   ? "0-4k"
                                              : length < 8000 ? "4-8k"
                                                              : "8k+");
      EXPECT_EQ(s.fields.at("language"), r["language"].get<std::string>());
      EXPECT_EQ(s.fields.count("zh_tokenization"), rs.zh_char ? 1u : 0u);
      if (rs.zh_char) {
        EXPECT_EQ(s.fields.at("zh_tokenization"), "char");
      }
      // A prediction equal to a gold answer scores the maximum, 100.
      const Scores sc = t->score(s, text(s.references[0]));
      ASSERT_EQ(sc.count(rs.metric), 1u);
      // (the `rouge` package's F-measure adds 1e-8 to its denominator: 100 - 5e-7 at best)
      EXPECT_NEAR(sc.at(rs.metric), 100.0, 1e-6) << "answer: " << s.references[0];
      scores.push_back(sc);
      EXPECT_DOUBLE_EQ(t->score(s, text("")).at(rs.metric), 0.0);
    }
    EXPECT_NEAR(t->aggregate(scores).at(rs.metric), 100.0, 1e-6);
  }
}

TEST(LongBench, LimitAndMaxPromptTokens) {
  const auto s = load("longbench", {{"dataset", "multi_news"},
                                    {"data", kData + "/longbench_v1/multi_news.jsonl"},
                                    {"limit", "5"},
                                    {"max_prompt_tokens", "7500"}});
  ASSERT_EQ(s.size(), 5u);
  for (const Sample& x : s) EXPECT_EQ(x.max_prompt_tokens, 7500);
  const auto all =
      load("longbench",
           {{"dataset", "multi_news"}, {"data_dir", kData + "/longbench_v1"}, {"limit", "0"}});
  EXPECT_EQ(all.size(), 200u);
  EXPECT_EQ(all[0].max_prompt_tokens, 0);
}

// ---- LongBench v1 fixtures, one per metric family ----------------------------------------------

std::map<std::string, std::string> fixture_opts(const std::string& dataset) {
  return {{"dataset", dataset}, {"data_dir", kFixtures + "/longbench"}};
}

double lb_score(const Task& t, const Sample& s, const std::string& pred) {
  const Scores sc = t.score(s, text(pred));
  EXPECT_EQ(sc.size(), 1u);
  return sc.begin()->second;
}

TEST(LongBenchFixtures, QaF1) {
  auto t = task("longbench", fixture_opts("hotpotqa"));
  const auto s = t->samples(ws_context());
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(t->metrics()[0].name, "qa_f1");
  EXPECT_TRUE(s[0].chat);
  EXPECT_EQ(s[0].max_new_tokens, 32);
  EXPECT_EQ(s[0].id, "hotpotqa-fixture-0");
  EXPECT_EQ(s[0].question,
            "\n\nAnswer the question based on the given passages. Only give me the answer and do "
            "not output any other words.\n\nQuestion: Which tower did Mara climb first?\nAnswer:");
  // Braces in the data are not placeholders.
  EXPECT_NE(s[1].context.find("built {from paper} was"), std::string::npos);
  EXPECT_DOUBLE_EQ(lb_score(*t, s[0], "the Eiffel Tower."), 100.0);    // articles, punctuation
  EXPECT_NEAR(lb_score(*t, s[0], "Eiffel"), 100.0 * 2.0 / 3.0, 1e-9);  // P 1, R 1/2
  EXPECT_DOUBLE_EQ(lb_score(*t, s[1], "bright orange"), 100.0);        // max over the two answers
  EXPECT_DOUBLE_EQ(lb_score(*t, s[1], "blue"), 0.0);
  EXPECT_EQ(s[0].fields.at("length_bucket"), "0-4k");
  EXPECT_EQ(s[2].fields.at("length_bucket"), "4-8k");
  std::vector<Scores> per = {t->score(s[0], text("Eiffel Tower")), t->score(s[1], text("no"))};
  EXPECT_DOUBLE_EQ(t->aggregate(per).at("qa_f1"), 50.0);
}

TEST(LongBenchFixtures, RougeWithFirstLineCut) {
  auto t = task("longbench", fixture_opts("samsum"));
  const auto s = t->samples(ws_context());
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(t->metrics()[0].name, "rouge_l");
  EXPECT_FALSE(s[0].chat);
  EXPECT_EQ(s[0].max_new_tokens, 128);
  EXPECT_EQ(s[0].stop_strings, std::vector<std::string>{"\n"});
  EXPECT_EQ(s[1].fields.at("length_bucket"), "8k+");
  // eval.py: prediction.lstrip('\n').split('\n')[0]
  EXPECT_NEAR(lb_score(*t, s[0], "\n\nAmy will come tonight and bring cake\nDialogue: x"), 100.0,
              1e-6);
  EXPECT_DOUBLE_EQ(lb_score(*t, s[0], "Something else entirely"), 0.0);
  EXPECT_NEAR(lb_score(*t, s[1], "Leo will wait for Kim at the station"), 100.0, 1e-6);
}

TEST(LongBenchFixtures, Classification) {
  auto t = task("longbench", fixture_opts("trec"));
  const auto s = t->samples(ws_context());
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(t->metrics()[0].name, "classification");
  EXPECT_FALSE(s[0].chat);
  EXPECT_EQ(s[0].max_new_tokens, 64);
  EXPECT_EQ(s[0].stop_strings, std::vector<std::string>{"\n"});
  EXPECT_EQ(s[0].question, "\nWhere is the tallest lighthouse ?");
  EXPECT_EQ(s[0].choices.size(), 6u);  // the label set
  EXPECT_DOUBLE_EQ(lb_score(*t, s[0], "Location"), 100.0);
  EXPECT_DOUBLE_EQ(lb_score(*t, s[0], "Location or Person"), 50.0);
  EXPECT_DOUBLE_EQ(lb_score(*t, s[0], "Number"), 0.0);
  EXPECT_DOUBLE_EQ(lb_score(*t, s[1], "\nPerson\nQuestion: ..."), 100.0);
}

TEST(LongBenchFixtures, Retrieval) {
  auto t = task("longbench", fixture_opts("passage_retrieval_en"));
  const auto s = t->samples(ws_context());
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(t->metrics()[0].name, "retrieval");
  EXPECT_TRUE(s[0].chat);
  EXPECT_TRUE(s[0].stop_strings.empty());
  EXPECT_DOUBLE_EQ(lb_score(*t, s[0], "Paragraph 3"), 100.0);
  EXPECT_DOUBLE_EQ(lb_score(*t, s[0], "Paragraph 3 or Paragraph 5"), 50.0);
  EXPECT_DOUBLE_EQ(lb_score(*t, s[0], "I do not know"), 0.0);
  EXPECT_DOUBLE_EQ(lb_score(*t, s[1], "Paragraph 2"), 100.0);
}

TEST(LongBenchFixtures, Count) {
  auto t = task("longbench", fixture_opts("passage_count"));
  const auto s = t->samples(ws_context());
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(t->metrics()[0].name, "count");
  EXPECT_TRUE(s[0].chat);
  // No {input} in this template: the question is the instruction after the paragraphs.
  EXPECT_EQ(s[0].question.rfind("\n\nPlease enter the final count", 0), 0u);
  EXPECT_EQ(s[0].question.substr(s[0].question.size() - 21), "The final answer is: ");
  EXPECT_DOUBLE_EQ(lb_score(*t, s[0], "2"), 100.0);
  EXPECT_DOUBLE_EQ(lb_score(*t, s[0], "2 or 3"), 50.0);
  EXPECT_DOUBLE_EQ(lb_score(*t, s[1], ""), 0.0);
}

TEST(LongBenchFixtures, CodeSim) {
  auto t = task("longbench", fixture_opts("lcc"));
  const auto s = t->samples(ws_context());
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(t->metrics()[0].name, "code_sim");
  EXPECT_FALSE(s[0].chat);
  EXPECT_EQ(s[0].max_new_tokens, 64);
  EXPECT_TRUE(s[0].stop_strings.empty());
  EXPECT_EQ(
      s[0].context,
      "Please complete the code given below. \ndef add(a, b):\n    \"\"\"Return the sum.\"\"\"\n");
  EXPECT_EQ(s[0].question, "Next line of code:\n");
  EXPECT_DOUBLE_EQ(lb_score(*t, s[0], "    return a + b"), 100.0);
  EXPECT_DOUBLE_EQ(lb_score(*t, s[0], "# add them\n    return a + b\n"), 100.0);
  EXPECT_DOUBLE_EQ(lb_score(*t, s[1], ""), 0.0);
}

// ---- LongBench v2
// --------------------------------------------------------------------------------

TEST(LongBenchV2, RealShortSplit) {
  auto t = task("longbench_v2", {{"data", kData + "/longbench_v2/longbench_v2_short.jsonl"}});
  const auto s = t->samples(ws_context());
  ASSERT_EQ(s.size(), 180u);
  size_t longest = 0;
  std::vector<Scores> per;
  for (const Sample& x : s) {
    longest = std::max(longest, x.context.size());
    EXPECT_EQ(x.kind, SampleKind::kGenerate);
    EXPECT_TRUE(x.chat);
    EXPECT_EQ(x.max_new_tokens, 128);
    EXPECT_EQ(x.fields.at("length"), "short");
    EXPECT_TRUE(x.fields.at("difficulty") == "easy" || x.fields.at("difficulty") == "hard");
    EXPECT_FALSE(x.fields.at("domain").empty());
    EXPECT_EQ(x.context.rfind("Please read the following text and answer the question below."
                              "\n\n<text>\n",
                              0),
              0u);
    ASSERT_EQ(x.references.size(), 1u);
    const Scores sc = t->score(x, text("The correct answer is (" + x.references[0] + ")"));
    EXPECT_DOUBLE_EQ(sc.at("accuracy"), 1.0);
    per.push_back(sc);
  }
  EXPECT_GT(longest, 100000u);  // the item over 100K characters loads whole
  const Scores agg = t->aggregate(per);
  EXPECT_DOUBLE_EQ(agg.at("accuracy"), 1.0);
  EXPECT_DOUBLE_EQ(agg.at("accuracy_easy"), 1.0);
  EXPECT_DOUBLE_EQ(agg.at("accuracy_hard"), 1.0);
  EXPECT_DOUBLE_EQ(agg.at("accuracy_short"), 1.0);
  EXPECT_EQ(agg.count("accuracy_long"), 0u);  // no long items: absent, not 0
}

TEST(LongBenchV2, FixturePromptAndPerGroupAccuracy) {
  auto t = task("longbench_v2", {{"data", kFixtures + "/longbench_v2.jsonl"}});
  const auto s = t->samples(ws_context());
  ASSERT_EQ(s.size(), 3u);
  // prompts/0shot.txt, fields stripped as pred.py does.
  EXPECT_EQ(s[0].context + s[0].question,
            "Please read the following text and answer the question below.\n\n<text>\n"
            "The old farm gate is guarded by a loud white goose.\n</text>\n\n"
            "What is the correct answer to this question: Which animal guards the gate?\n"
            "Choices:\n(A) A dog\n(B) A goose\n(C) A cat\n(D) A horse\n\n"
            "Format your response as follows: \"The correct answer is (insert answer here)\".");
  EXPECT_EQ(s[0].answer_prefix, "");
  EXPECT_EQ(s[0].gold, 1);
  std::vector<Scores> per = {t->score(s[0], text("The correct answer is (B)")),
                             t->score(s[1], text("I think the correct answer is (A).")),
                             t->score(s[2], text("**The correct answer is B**"))};
  EXPECT_DOUBLE_EQ(per[1].at("accuracy"), 0.0);
  EXPECT_DOUBLE_EQ(per[2].at("accuracy"), 1.0);
  EXPECT_DOUBLE_EQ(t->score(s[0], text("no idea")).at("accuracy"), 0.0);
  const Scores agg = t->aggregate(per);
  EXPECT_NEAR(agg.at("accuracy"), 2.0 / 3.0, 1e-12);
  EXPECT_DOUBLE_EQ(agg.at("accuracy_easy"), 1.0);
  EXPECT_DOUBLE_EQ(agg.at("accuracy_hard"), 0.5);
  EXPECT_DOUBLE_EQ(agg.at("accuracy_short"), 0.5);
  EXPECT_DOUBLE_EQ(agg.at("accuracy_medium"), 1.0);
}

TEST(LongBenchV2, LoglikMode) {
  auto t = task("longbench_v2", {{"data", kFixtures + "/longbench_v2.jsonl"}, {"mode", "loglik"}});
  const auto s = t->samples(ws_context());
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].kind, SampleKind::kChoice);
  EXPECT_EQ(s[0].choices, (std::vector<std::string>{" A", " B", " C", " D"}));
  EXPECT_EQ(s[0].answer_prefix, "The correct answer is");
  EXPECT_DOUBLE_EQ(t->score(s[0], logliks({-5, -1, -3, -4})).at("accuracy"), 1.0);
  EXPECT_DOUBLE_EQ(t->score(s[1], logliks({-5, -1, -3, -4})).at("accuracy"), 0.0);
  EXPECT_EQ(error_of([&] {
              task("longbench_v2", {{"data", "x"}, {"mode", "cot"}});
            }).find("generate, loglik") != std::string::npos,
            true);
}

// ---- XSum
// ----------------------------------------------------------------------------------------

TEST(Xsum, H2OFile) {
  auto t = task("xsum", {{"data", kData + "/xsum_h2o/xsum_0shot.jsonl"}});
  const auto s = t->samples(ws_context());
  const std::vector<json> raw = raw_lines(kData + "/xsum_h2o/xsum_0shot.jsonl");
  ASSERT_EQ(s.size(), 1000u);
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(s[i].context + s[i].question, raw[i]["article"].get<std::string>());
    EXPECT_EQ(s[i].question, "\n\nSummarize the above article in 1 sentence.\n");
    EXPECT_FALSE(s[i].chat);
    EXPECT_EQ(s[i].max_new_tokens, 64);
    EXPECT_EQ(s[i].stop_strings, std::vector<std::string>{"###"});
  }
  const Scores sc = t->score(s[0], text(s[0].references[0]));
  EXPECT_DOUBLE_EQ(sc.at("rouge_1"), 1.0);
  EXPECT_DOUBLE_EQ(sc.at("rouge_2"), 1.0);
  EXPECT_DOUBLE_EQ(sc.at("rouge_l"), 1.0);
  EXPECT_DOUBLE_EQ(t->score(s[0], text("")).at("rouge_1"), 0.0);
  const auto few = load(
      "xsum",
      {{"data", kData + "/xsum_h2o/xsum_0shot.jsonl"}, {"limit", "3"}, {"max_new_tokens", "32"}});
  ASSERT_EQ(few.size(), 3u);
  EXPECT_EQ(few[2].max_new_tokens, 32);
  EXPECT_EQ(few[2].id, s[2].id);
}

// ---- MMLU and plain multiple choice
// --------------------------------------------------------------

TEST(Mc, MmluFiveShotPrompt) {
  auto t = task("mc", {{"data", kData + "/mmlu/val.jsonl"},
                       {"format", "mmlu"},
                       {"fewshot_data", kData + "/mmlu/dev.jsonl"}});
  const auto s = t->samples(ws_context());
  ASSERT_EQ(s.size(), 1531u);
  const std::vector<json> dev = raw_lines(kData + "/mmlu/dev.jsonl");
  const std::vector<json> val = raw_lines(kData + "/mmlu/val.jsonl");
  auto render = [](const json& d) {
    std::string q = d["question"].get<std::string>();
    q.erase(0, q.find_first_not_of(" \n\t\r"));
    q.erase(q.find_last_not_of(" \n\t\r") + 1);
    const char* letters = "ABCD";
    for (int i = 0; i < 4; ++i) {
      q += std::string("\n") + letters[i] + ". " + d["choices"][i].get<std::string>();
    }
    return q + "\nAnswer:";
  };
  for (size_t i : {size_t{0}, size_t{700}, size_t{1530}}) {
    const json& v = val[i];
    const std::string subject = v["subject"].get<std::string>();
    std::string pretty = subject;
    std::replace(pretty.begin(), pretty.end(), '_', ' ');
    std::string expect =
        "The following are multiple choice questions (with answers) about " + pretty + ".\n\n";
    int shots = 0;
    for (const json& d : dev) {
      if (d["subject"] != subject || shots == 5) continue;
      expect += render(d) + " " + std::string(1, "ABCD"[d["gold"].get<int>()]) + "\n\n";
      ++shots;
    }
    ASSERT_EQ(shots, 5);
    EXPECT_EQ(s[i].context + s[i].question, expect + render(v)) << "item " << i;
    EXPECT_EQ(s[i].question, render(v));
    EXPECT_EQ(s[i].kind, SampleKind::kChoice);
    EXPECT_FALSE(s[i].chat);
    EXPECT_EQ(s[i].choices, (std::vector<std::string>{" A", " B", " C", " D"}));
    EXPECT_EQ(s[i].gold, v["gold"].get<int>());
    EXPECT_EQ(s[i].fields.at("subject"), subject);
  }
  std::vector<double> ll(4, -9.0);
  ll[s[0].gold] = -1.0;
  const Scores sc = t->score(s[0], logliks(ll));
  EXPECT_DOUBLE_EQ(sc.at("acc"), 1.0);
  EXPECT_DOUBLE_EQ(sc.at("acc_norm"), 1.0);

  const auto zero = load("mc", {{"data", kData + "/mmlu/test.jsonl"},
                                {"format", "mmlu"},
                                {"num_fewshot", "0"},
                                {"limit", "2"}});
  ASSERT_EQ(zero.size(), 2u);
  EXPECT_EQ(
      zero[0].context,
      "The following are multiple choice questions (with answers) about abstract algebra.\n\n");
  EXPECT_NE(error_of([&] {
              task("mc", {{"data", kData + "/mmlu/val.jsonl"}, {"format", "mmlu"}});
            }).find("fewshot_data"),
            std::string::npos);
}

TEST(Mc, PlainFixture) {
  auto t = task("mc", {{"data", kFixtures + "/mc.jsonl"}});
  const auto s = t->samples(ws_context());
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].context, "The cat sat on the");
  EXPECT_EQ(s[0].question, "");
  EXPECT_EQ(s[0].choices, (std::vector<std::string>{" mat", " elephant"}));
  EXPECT_EQ(s[0].max_new_tokens, 2);  // longest choice (1 whitespace token) + 1
  EXPECT_FALSE(s[0].chat);
  EXPECT_EQ(s[1].context, "Q: What do cows give?\nA: milk\n\n");
  EXPECT_EQ(s[1].question, "Q: What do bees make?\nA:");
  EXPECT_EQ(s[1].choices, (std::vector<std::string>{" honey", " wax"}));  // no double space
  EXPECT_EQ(s[1].id, "nature-1");
  EXPECT_EQ(s[1].fields.at("subject"), "nature");
  EXPECT_EQ(s[2].context, "Ice is cold.\n\nSteam is hot.\n\nWater freezes at zero degrees");
  EXPECT_EQ(s[2].gold, 1);
  EXPECT_EQ(t->metrics().size(), 2u);
  // acc: argmax of the logliks; acc_norm: of loglik / bytes ("Celsius" 7, "Fahrenheit" 10,
  // "Kelvin" 6): -3/7 < -4/10, so only acc_norm picks gold (index 1).
  const Scores sc = t->score(s[2], logliks({-3, -4, -10}));
  EXPECT_DOUBLE_EQ(sc.at("acc"), 0.0);
  EXPECT_DOUBLE_EQ(sc.at("acc_norm"), 1.0);
  const Scores sc0 = t->score(s[0], logliks({-2, -2}));  // tie: the first
  EXPECT_DOUBLE_EQ(sc0.at("acc"), 1.0);
  const Scores agg = t->aggregate({sc, sc0});
  EXPECT_DOUBLE_EQ(agg.at("acc"), 0.5);
}

// ---- Perplexity
// ----------------------------------------------------------------------------------

TEST(Perplexity, HandComputedRanges) {
  auto t =
      task("perplexity", {{"file", kData + "/wikitext-2/test.txt"}, {"ranges", "0-2,2-4,4-100"}});
  // token_nll[t] predicts position t + 1.
  Prediction p;
  p.token_nll = {std::log(2.0), std::log(4.0), std::log(2.0), std::log(8.0), std::log(4.0)};
  const Scores s = t->score(Sample{}, p);
  EXPECT_NEAR(s.at("ppl"), std::pow(512.0, 0.2), 1e-9);    // exp(ln(2*4*2*8*4) / 5)
  EXPECT_NEAR(s.at("ppl_0_2"), 2.0, 1e-12);                // position 1
  EXPECT_NEAR(s.at("ppl_2_4"), std::sqrt(8.0), 1e-12);     // positions 2, 3
  EXPECT_NEAR(s.at("ppl_4_100"), std::sqrt(32.0), 1e-12);  // positions 4, 5
  EXPECT_DOUBLE_EQ(s.at("tokens"), 5.0);
  EXPECT_DOUBLE_EQ(s.at("tokens_4_100"), 2.0);
  EXPECT_NEAR(s.at("nll_sum_2_4"), std::log(8.0), 1e-12);
  for (const MetricInfo& m : t->metrics()) {
    if (m.name.rfind("ppl", 0) == 0) {
      EXPECT_FALSE(m.higher_is_better) << m.name;
    }
  }
}

TEST(Perplexity, DefaultRangesAndTokenWeightedAggregate) {
  auto t = task("perplexity", {{"file", kData + "/wikitext-2/test.txt"}});
  const auto s = t->samples(ws_context());
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].kind, SampleKind::kPerplexity);
  EXPECT_EQ(s[0].max_tokens, 2048);
  // Cut after enough tokens (whitespace tokens here) at a line end; the whole file without a
  // token counter.
  const std::string whole = read_text_file(kData + "/wikitext-2/test.txt", "file", "", 1 << 30);
  EXPECT_EQ(whole.size(), fs::file_size(kData + "/wikitext-2/test.txt"));
  EXPECT_LT(s[0].text.size(), whole.size());
  EXPECT_EQ(whole.compare(0, s[0].text.size(), s[0].text), 0);
  EXPECT_EQ(s[0].text.back(), '\n');
  EXPECT_GE(ws_context().count_tokens(s[0].text), 2048 + 64);
  EXPECT_EQ(t->samples(TaskContext{})[0].text, whole);
  Prediction p;  // 2047 predicted tokens (2048 fed): NLL ln 10 below position 256, ln 20 after
  for (int t_ = 0; t_ < 2047; ++t_) p.token_nll.push_back(std::log(t_ + 1 < 256 ? 10.0 : 20.0));
  const Scores sc = t->score(s[0], p);
  EXPECT_NEAR(sc.at("ppl_0_256"), 10.0, 1e-9);
  EXPECT_DOUBLE_EQ(sc.at("tokens_0_256"), 255.0);  // position 0 is never predicted
  EXPECT_NEAR(sc.at("ppl_256_512"), 20.0, 1e-9);
  EXPECT_DOUBLE_EQ(sc.at("tokens_1024_2048"), 1024.0);
  // Two samples: 2 tokens at ln 2 and 6 at ln 8 give exp((2 ln 2 + 6 ln 8) / 8) = 2^2.5, not the
  // mean of the two perplexities (5).
  Prediction a, b;
  a.token_nll.assign(2, std::log(2.0));
  b.token_nll.assign(6, std::log(8.0));
  const Scores agg = t->aggregate({t->score(s[0], a), t->score(s[0], b)});
  EXPECT_NEAR(agg.at("ppl"), std::pow(2.0, 2.5), 1e-9);
  EXPECT_DOUBLE_EQ(agg.at("tokens"), 8.0);
  EXPECT_NEAR(agg.at("ppl_0_256"), std::pow(2.0, 2.5), 1e-9);
  EXPECT_EQ(agg.count("ppl_256_512"), 0u);  // no tokens there
}

TEST(Perplexity, OptionErrors) {
  EXPECT_NE(error_of([&] {
              task("perplexity", {{"file", "x"}, {"ranges", "5-3"}});
            }).find("5-3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { task("perplexity", {}); }).find("file="), std::string::npos);
  const std::string e = error_of([&] {
    load("perplexity", {{"file", "/nonexistent/corpus.txt"}});
  });
  EXPECT_NE(e.find("/nonexistent/corpus.txt"), std::string::npos) << e;
  EXPECT_NE(e.find("task option file"), std::string::npos) << e;
}

// ---- Errors
// --------------------------------------------------------------------------------------

TEST(TaskDataErrors, MissingFileNamesPathAndOption) {
  const std::string e = error_of([&] {
    load("longbench", {{"dataset", "multi_news"}, {"data_dir", "/nonexistent/lb"}});
  });
  EXPECT_NE(e.find("/nonexistent/lb/multi_news.jsonl"), std::string::npos) << e;
  EXPECT_NE(e.find("data_dir"), std::string::npos) << e;
  EXPECT_NE(e.find("THUDM/LongBench"), std::string::npos) << e;  // how to obtain it
  const std::string e2 = error_of([&] { load("mc", {{"data", "/nonexistent/x.jsonl"}}); });
  EXPECT_NE(e2.find("/nonexistent/x.jsonl"), std::string::npos) << e2;
  EXPECT_NE(e2.find("task option data"), std::string::npos) << e2;
}

TEST(TaskDataErrors, MalformedLineNamesLine3) {
  const std::string e = error_of([&] { load("mc", {{"data", kFixtures + "/malformed.jsonl"}}); });
  EXPECT_NE(e.find("malformed.jsonl:3:"), std::string::npos) << e;
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  // limit=2 stops before the bad line.
  EXPECT_EQ(load("mc", {{"data", kFixtures + "/malformed.jsonl"}, {"limit", "2"}}).size(), 2u);
}

TEST(TaskDataErrors, MissingKeyNamesFileLineAndKey) {
  const std::string e = error_of([&] {
    load("longbench", {{"dataset", "hotpotqa"}, {"data", kFixtures + "/missing_key.jsonl"}});
  });
  EXPECT_NE(e.find("missing_key.jsonl:2:"), std::string::npos) << e;
  EXPECT_NE(e.find("'answers'"), std::string::npos) << e;
}

TEST(TaskDataErrors, UnknownDatasetListsThe21) {
  const char* names[] = {"narrativeqa",
                         "qasper",
                         "multifieldqa_en",
                         "multifieldqa_zh",
                         "hotpotqa",
                         "2wikimqa",
                         "musique",
                         "dureader",
                         "gov_report",
                         "qmsum",
                         "multi_news",
                         "vcsum",
                         "trec",
                         "triviaqa",
                         "samsum",
                         "lsht",
                         "passage_count",
                         "passage_retrieval_en",
                         "passage_retrieval_zh",
                         "lcc",
                         "repobench-p"};
  for (const auto& opts :
       {std::map<std::string, std::string>{{"dataset", "wikiqa"}, {"data_dir", "."}},
        std::map<std::string, std::string>{{"data_dir", "."}}}) {
    const std::string e = error_of([&] { task("longbench", opts); });
    for (const char* n : names) EXPECT_NE(e.find(n), std::string::npos) << n << " in " << e;
  }
  EXPECT_EQ(find_task("longbench")->params[0].choices.size(), 21u);
}

TEST(TaskDataErrors, OptionsAndMismatchedData) {
  // Unknown options are rejected by make_task (every option must be read).
  EXPECT_NE(error_of([&] {
              task("longbench", {{"dataset", "trec"}, {"data_dir", "."}, {"seed", "1"}});
            }).find("'seed'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              task("longbench", {{"dataset", "trec"}, {"data_dir", "."}, {"data", "x"}});
            }).find("not both"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              task("longbench", {{"dataset", "trec"}});
            }).find("data_dir"),
            std::string::npos);
  // A file of another data set would be scored with the wrong metric: refused, naming the line.
  const std::string e = error_of([&] {
    load("longbench", {{"dataset", "trec"}, {"data", kFixtures + "/longbench/hotpotqa.jsonl"}});
  });
  EXPECT_NE(e.find("hotpotqa.jsonl:1:"), std::string::npos) << e;
  EXPECT_NE(error_of([&] {
              task("mc", {{"data", "x"}, {"num_fewshot", "3"}});
            }).find("format=mmlu"),
            std::string::npos);
  EXPECT_NE(error_of([&] { task("xsum", {}); }).find("data="), std::string::npos);
}

// ---- The JSON-lines reader ---------------------------------------------------------------------

std::string write_temp(const std::string& name, const std::string& content) {
  const std::string path = (fs::path(::testing::TempDir()) / name).string();
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST(Jsonl, AcceptsBomCrlfBlankLinesAndNoFinalNewline) {
  const std::string p =
      write_temp("ok.jsonl", "\xEF\xBB\xBF{\"a\": 1}\r\n\n  \n{\"a\": 2, \"s\": \"x\"}");
  const JsonlFile f = read_jsonl(p, {});
  ASSERT_EQ(f.items.size(), 2u);
  EXPECT_EQ(f.items[0].integer("a"), 1);
  EXPECT_EQ(f.items[1].line(), 4u);
  EXPECT_EQ(f.items[1].str("s"), "x");
  EXPECT_EQ(f.items[1].str_or("t", "d"), "d");
  EXPECT_FALSE(f.items[1].integer_opt("t").has_value());
}

TEST(Jsonl, RejectsHostileInput) {
  JsonlReadOptions small;
  small.max_line_bytes = 16;
  const std::string longp = write_temp("long.jsonl", "{\"a\": 1}\n{\"a\": \"0123456789abcdef\"}\n");
  EXPECT_NE(error_of([&] { read_jsonl(longp, small); }).find("long.jsonl:2: line longer"),
            std::string::npos);
  JsonlReadOptions few;
  few.max_items = 1;
  EXPECT_NE(error_of([&] { read_jsonl(longp, few); }).find("more than 1 items"), std::string::npos);
  const std::string arr = write_temp("arr.jsonl", "[1, 2]\n");
  EXPECT_NE(
      error_of([&] { read_jsonl(arr, {}); }).find("arr.jsonl:1: each line must be a JSON object"),
      std::string::npos);
  const std::string bad_utf8 = write_temp("utf8.jsonl", "{\"a\": \"\xC3\x28\"}\n");
  EXPECT_NE(error_of([&] { read_jsonl(bad_utf8, {}); }).find("utf8.jsonl:1: not valid JSON"),
            std::string::npos);
  const std::string typed =
      write_temp("typed.jsonl", "{\"answers\": \"x\", \"n\": 2.5, \"l\": [1]}\n");
  const JsonlFile f = read_jsonl(typed, {});
  EXPECT_NE(error_of([&] {
              f.items[0].str_list("answers");
            }).find("typed.jsonl:1: key 'answers' must be a list"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f.items[0].integer("n"); }).find("key 'n' must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f.items[0].str_list("l"); }).find("element 0 is an integer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f.items[0].str("missing"); }).find("required key 'missing'"),
            std::string::npos);
}

// Issue 14: an integer above INT64_MAX used to wrap (18446744073709551615 read as -1).
TEST(Jsonl, IntegersAboveInt64MaxAreRefused) {
  const std::string p = write_temp(
      "big.jsonl",
      "{\"a\": 18446744073709551615, \"b\": 9223372036854775808, \"c\": 9223372036854775807, "
      "\"d\": -9223372036854775808}\n");
  const JsonlFile f = read_jsonl(p, {});
  EXPECT_NE(error_of([&] { f.items[0].integer("a"); })
                .find("big.jsonl:1: key 'a' is 18446744073709551615, above the largest integer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f.items[0].integer_opt("b"); }).find("key 'b' is 9223372036854775808"),
            std::string::npos);
  EXPECT_EQ(f.items[0].integer("c"), INT64_MAX);
  EXPECT_EQ(f.items[0].integer("d"), INT64_MIN);
}

TEST(Jsonl, PyStripMatchesPython) {
  EXPECT_EQ(py_strip("  \n\tabc d \r\n"), "abc d");
  EXPECT_EQ(py_strip("\u3000\u00a0x\u2028\u2029\u0085"), "x");  // Unicode whitespace
  EXPECT_EQ(py_strip("\xe4\xb8\xad"), "\xe4\xb8\xad");          // CJK is not whitespace
  EXPECT_EQ(py_strip(" \x1c\x1f "), "");
  EXPECT_EQ(py_strip("\xff "), "\xff");  // invalid UTF-8 survives
}

}  // namespace
}  // namespace kvb::tasks
