// The synthetic tasks (TASKS.md "niah" and "RULER-style"): NIAH grid, needle placement by depth
// at sentence boundaries, token budgets, determinism, scores, the kjv and essays haystacks, option
// errors; the seven RULER generators' sample counts, budgets, gold answers (recounted for cwe and
// fwe) and string_match_all. "model" label: reads ../shared data and runs `bible`. Token counts
// come from a whitespace counter, so no model is needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "common/error.h"
#include "tasks/haystack.h"
#include "tasks/task.h"
#include "ws_tokens.h"

namespace kvb::tasks {
namespace {

const std::string kEssays = KVB_SHARED_DIR "/data/paulgraham_essays";
const std::string kSfNeedle =
    "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny "
    "day.";

Prediction pred(const std::string& text) {
  Prediction p;
  p.text = text;
  return p;
}

TaskContext ws_ctx() {
  TaskContext ctx;
  ctx.count_tokens = ws_count;
  return ctx;
}

std::unique_ptr<Task> task(const std::string& name, std::map<std::string, std::string> opts) {
  return make_task(name, Options(std::move(opts), "task option"));
}

std::vector<Sample> niah(std::map<std::string, std::string> opts) {
  return task("niah", std::move(opts))->samples(ws_ctx());
}

int prompt_total(const Sample& s) {
  return ws_count(s.context) + ws_count(s.question) + ws_count(s.answer_prefix) +
         (s.chat ? kChatReserveTokens : 0);
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

bool have_bible() { return std::system("command -v bible >/dev/null 2>&1") == 0; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The needle sits at the depth's character position, backed off to the previous '.': the text
// before it ends a sentence and no sentence ends between it and the target position.
void expect_depth(const Sample& s, const std::string& needle, int depth) {
  const size_t p = s.context.find(needle);
  ASSERT_NE(p, std::string::npos);
  if (depth == 0) {
    EXPECT_EQ(p, 0u) << s.id;
    return;
  }
  if (depth == 100) {
    EXPECT_EQ(p + needle.size(), s.context.size()) << s.id;
    return;
  }
  const std::string left = s.context.substr(0, p - 1);  // drop the joining space
  const std::string right = s.context.substr(p + needle.size() + 1);
  const std::string hay = left + " " + right;
  const size_t target = static_cast<size_t>(hay.size() * (depth / 100.0));
  ASSERT_FALSE(left.empty());
  EXPECT_EQ(left.back(), '.') << s.id;
  ASSERT_LE(left.size(), target + 1) << s.id;
  EXPECT_EQ(hay.substr(left.size(), target - std::min(target, left.size())).find('.'),
            std::string::npos)
      << s.id << ": a sentence ends between the needle and its depth";
}

// ---- haystack building blocks ----------------------------------------------------------------
TEST(Haystack, InsertAtDepthBacksOffToPreviousPeriod) {
  const std::string hay = "Aaa aaa. Bbb bbb bbb. Ccc ccc.";
  EXPECT_EQ(insert_at_depth(hay, "N.", 0).text, "N. Aaa aaa. Bbb bbb bbb. Ccc ccc.");
  EXPECT_EQ(insert_at_depth(hay, "N.", 100).text, "Aaa aaa. Bbb bbb bbb. Ccc ccc. N.");
  const Insertion mid = insert_at_depth(hay, "N.", 50);  // target 15, inside "Bbb bbb bbb."
  EXPECT_EQ(mid.text, "Aaa aaa. N. Bbb bbb bbb. Ccc ccc.");
  EXPECT_EQ(mid.needle_pos, 9u);
  EXPECT_EQ(mid.target, 15u);
}

TEST(Haystack, CutFitsTheBudgetAtAWordEndAndRepeatsAShortSource) {
  const std::string src = "one two three. four five six.";
  const std::string cut = cut_to_token_budget(src, 0, 10, ws_count);
  EXPECT_EQ(cut, "one two three. four five six. one two three. four");
  EXPECT_EQ(ws_count(cut), 10);
  EXPECT_EQ(cut_to_token_budget(src, 15, 3, ws_count), "four five six.");
}

TEST(Haystack, RngIsDeterministicAndUniform) {
  Rng a(7, 3), b(7, 3), c(8, 3);
  std::vector<int> counts(10);
  bool differs = false;
  for (int i = 0; i < 10000; ++i) {
    const uint64_t x = a.next();
    EXPECT_EQ(x, b.next());
    differs = differs || x != c.next();
  }
  EXPECT_TRUE(differs);
  for (int i = 0; i < 10000; ++i) ++counts[a.below(10)];
  for (int k : counts) EXPECT_NEAR(k, 1000, 150);
  const std::vector<int64_t> s = a.sample(40, 40);
  EXPECT_EQ(std::set<int64_t>(s.begin(), s.end()).size(), 40u);
  const std::string u = random_uuid(a);
  EXPECT_EQ(u.size(), 36u);
  EXPECT_EQ(u[14], '4');
}

// ---- niah ------------------------------------------------------------------------------------
TEST(Niah, GridIsLengthsTimesDepthsTimesSamples) {
  const auto s = niah({{"haystack", "noise"},
                       {"context_lengths", "256,512"},
                       {"depths", "0,50,100"},
                       {"samples_per_cell", "2"}});
  ASSERT_EQ(s.size(), 2u * 3u * 2u);
  std::set<std::string> ids;
  for (const auto& x : s) ids.insert(x.id);
  EXPECT_EQ(ids.size(), s.size());
  EXPECT_EQ(s[0].fields.at("context_length"), "256");
  EXPECT_EQ(s[0].fields.at("depth"), "0");
  EXPECT_EQ(s.back().fields.at("context_length"), "512");
  EXPECT_EQ(s.back().fields.at("depth"), "100");
  EXPECT_EQ(niah({{"haystack", "noise"}, {"limit", "4"}}).size(), 4u);
  EXPECT_EQ(niah({{"haystack", "noise"}}).size(), 15u);  // default grid 3 x 5
}

TEST(Niah, NeedleOnceAtItsDepthAndPromptFitsTheLength) {
  const auto s = niah({{"haystack", "essays"},
                       {"haystack_dir", kEssays},
                       {"context_lengths", "1024,4096"},
                       {"depths", "0,10,25,50,75,90,100"},
                       {"samples_per_cell", "2"}});
  ASSERT_EQ(s.size(), 28u);
  for (const auto& x : s) {
    EXPECT_EQ(occurrences(x.context, kSfNeedle), 1u) << x.id;
    expect_depth(x, kSfNeedle, std::stoi(x.fields.at("depth")));
    const int length = std::stoi(x.fields.at("context_length"));
    EXPECT_LE(prompt_total(x), length) << x.id;
    EXPECT_GE(prompt_total(x), length - 2) << x.id;
    EXPECT_EQ(x.question, "\n\nWhat is the best thing to do in San Francisco?");
    EXPECT_EQ(x.answer_prefix, "The best thing to do in San Francisco is");
    EXPECT_TRUE(x.chat);
  }
  // Sample 0 starts at the beginning of the first essay (sorted by name); sample 1 elsewhere.
  EXPECT_EQ(s[0].context.find(kSfNeedle + " July 2010What hard liquor"), 0u);
  EXPECT_EQ(s[1].context.find("July 2010What hard liquor"), std::string::npos);
}

TEST(Niah, SameSeedSameSamplesOtherSeedOtherPasskeys) {
  const std::map<std::string, std::string> base = {{"haystack", "noise"},
                                                   {"needle", "passkey"},
                                                   {"context_lengths", "300,600"},
                                                   {"depths", "0,33,66,100"}};
  auto with_seed = [&](const std::string& seed) {
    auto o = base;
    o["seed"] = seed;
    return niah(o);
  };
  const auto a = with_seed("1"), b = with_seed("1"), c = with_seed("2");
  ASSERT_EQ(a.size(), 8u);
  std::set<std::string> values;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].context, b[i].context);
    EXPECT_EQ(a[i].references, b[i].references);
    const std::string& v = a[i].fields.at("needle_value");
    values.insert(v);
    EXPECT_GE(v.size(), 5u);
    EXPECT_LE(v.size(), 7u);
    EXPECT_NE(v, c[i].fields.at("needle_value")) << a[i].id;
    const std::string needle = "The pass key is " + v + ". Remember it. " + v + " is the pass key.";
    EXPECT_EQ(occurrences(a[i].context, needle), 1u);
    expect_depth(a[i], needle, std::stoi(a[i].fields.at("depth")));
    EXPECT_EQ(a[i].references, std::vector<std::string>{v});
    EXPECT_EQ(a[i].question, "\n\nWhat is the pass key?");
    EXPECT_LE(prompt_total(a[i]), std::stoi(a[i].fields.at("context_length")));
  }
  EXPECT_EQ(values.size(), a.size());  // a passkey per sample
}

TEST(Niah, ScoresRecallAndExact) {
  auto t = task("niah", {{"haystack", "noise"}, {"context_lengths", "256"}, {"depths", "50"}});
  ASSERT_EQ(t->metrics().size(), 1u);
  const Sample s = t->samples(ws_ctx()).at(0);
  const Prediction good = pred(" eat a sandwich and sit in Dolores Park on a sunny day.");
  const Prediction bad = pred(" go to the beach and swim.");
  EXPECT_DOUBLE_EQ(t->score(s, good).at("recall"), 1.0);
  EXPECT_LT(t->score(s, bad).at("recall"), 0.2);
  EXPECT_EQ(t->score(s, good).count("exact"), 0u);

  auto p = task("niah", {{"haystack", "noise"},
                         {"needle", "passkey"},
                         {"context_lengths", "256"},
                         {"depths", "50"},
                         {"chat", "false"}});
  ASSERT_EQ(p->metrics().size(), 2u);
  const Sample ps = p->samples(ws_ctx()).at(0);
  EXPECT_FALSE(ps.chat);
  EXPECT_EQ(ps.answer_prefix, " The pass key is");
  const std::string v = ps.fields.at("needle_value");
  EXPECT_DOUBLE_EQ(p->score(ps, pred(" " + v + ".")).at("exact"), 1.0);
  EXPECT_DOUBLE_EQ(p->score(ps, pred(" " + v + ".")).at("recall"), 1.0);
  EXPECT_DOUBLE_EQ(p->score(ps, pred(" 1" + v)).at("exact"), 0.0);  // not the number
  EXPECT_DOUBLE_EQ(p->score(ps, pred(" 12345.")).at("exact"), 0.0);
}

TEST(Niah, MagicNumberNeedleIsRulerStyle) {
  const auto s = niah({{"haystack", "essays"},
                       {"haystack_dir", kEssays},
                       {"needle", "magic_number"},
                       {"context_lengths", "512"},
                       {"depths", "40"}});
  ASSERT_EQ(s.size(), 1u);
  const std::string v = s[0].fields.at("needle_value");
  EXPECT_EQ(v.size(), 7u);
  const size_t p = s[0].context.find("One of the special magic numbers for ");
  ASSERT_NE(p, std::string::npos);
  const size_t colon = s[0].context.find(" is: " + v + ".", p);
  ASSERT_NE(colon, std::string::npos);
  const std::string word = s[0].context.substr(p + 37, colon - p - 37);
  EXPECT_NE(word.find('-'), std::string::npos) << word;  // adjective-noun
  EXPECT_EQ(s[0].question, "\n\nWhat is the special magic number for " + word +
                               " mentioned in the provided text?");
  EXPECT_EQ(s[0].answer_prefix,
            "The special magic number for " + word + " mentioned in the provided text is");
}

TEST(Niah, KjvHaystackIsPlainProse) {
  if (!have_bible())
    GTEST_SKIP() << "`bible` not installed (install bible-kjv: bash scripts/setup.sh)";
  const auto s = niah({{"context_lengths", "1024,2048"}, {"depths", "0,50,100"}});
  ASSERT_EQ(s.size(), 6u);
  EXPECT_EQ(s[0].context.find(kSfNeedle + " In the beginning God created the heaven and the "
                                          "earth. And the earth was without form, and void;"),
            0u);
  for (const auto& x : s) {
    EXPECT_EQ(x.context.find("Genesis 1"), std::string::npos);
    EXPECT_EQ(x.context.find('\n'), std::string::npos);
    EXPECT_EQ(x.context.find(" 2 And"), std::string::npos);  // verse numbers are gone
    EXPECT_EQ(occurrences(x.context, kSfNeedle), 1u);
    expect_depth(x, kSfNeedle, std::stoi(x.fields.at("depth")));
    const int length = std::stoi(x.fields.at("context_length"));
    EXPECT_LE(prompt_total(x), length);
    EXPECT_GE(prompt_total(x), length - 2);
  }
  // The whole Bible is there: the last verse is reachable.
  const std::string& text = haystack_text({"kjv", "", ""});
  EXPECT_GT(text.size(), 4000000u);
  const std::string last =
      " come, Lord Jesus. The grace of our Lord Jesus Christ be with you all. Amen.";
  EXPECT_EQ(text.substr(text.size() - last.size()), last);
}

TEST(Niah, OptionErrorsNameThePathOrTheChoices) {
  const std::string missing = "/nonexistent/kvbench-essays";
  std::string e = error_of([&] { niah({{"haystack", "essays"}, {"haystack_dir", missing}}); });
  EXPECT_NE(e.find(missing), std::string::npos) << e;
  e = error_of([&] { niah({{"haystack", "essays"}}); });
  EXPECT_NE(e.find("haystack_dir"), std::string::npos) << e;
  e = error_of([&] { niah({{"haystack", "file"}, {"haystack_file", missing + ".txt"}}); });
  EXPECT_NE(e.find(missing + ".txt"), std::string::npos) << e;
  e = error_of([&] { niah({{"haystack", "hay"}}); });
  EXPECT_NE(e.find("kjv, essays, noise, file"), std::string::npos) << e;
  e = error_of([&] { niah({{"needle", "pin"}}); });
  EXPECT_NE(e.find("default, passkey, magic_number"), std::string::npos) << e;
  e = error_of([&] { niah({{"haystack", "noise"}, {"context_lengths", "64"}}); });
  EXPECT_NE(e.find("leaves no room"), std::string::npos) << e;
  e = error_of([&] { niah({{"haystack", "noise"}, {"colour", "red"}}); });
  EXPECT_NE(e.find("samples_per_cell"), std::string::npos) << e;
}

// ---- RULER -----------------------------------------------------------------------------------
std::vector<Sample> ruler(const std::string& name, std::map<std::string, std::string> opts) {
  return task(name, std::move(opts))->samples(ws_ctx());
}

void expect_fits(const std::vector<Sample>& s, int length) {
  for (const auto& x : s) {
    const int total = prompt_total(x) + x.max_new_tokens;
    EXPECT_LE(total, length) << x.id;
    EXPECT_GE(total, length * 9 / 10) << x.id;
  }
}

void expect_string_match(const std::string& name, const Sample& s) {
  auto t = task(name, {});
  ASSERT_EQ(t->metrics().at(0).name, "string_match_all");
  std::string all;
  for (const auto& r : s.references) all += " " + r + ",";
  EXPECT_DOUBLE_EQ(t->score(s, pred(all)).at("string_match_all"), 1.0);
  EXPECT_DOUBLE_EQ(t->score(s, pred(" " + s.references[0])).at("string_match_all"),
                   1.0 / s.references.size());
  EXPECT_DOUBLE_EQ(t->score(s, pred(" nothing here")).at("string_match_all"), 0.0);
}

TEST(Ruler, NiahFamilyGoldsAreInTheContext) {
  struct Case {
    std::string name;
    std::map<std::string, std::string> opts;
    size_t golds;
  };
  const std::vector<Case> cases = {
      {"ruler_niah_single", {}, 1},
      {"ruler_niah_single",
       {{"haystack", "essays"}, {"haystack_dir", kEssays}, {"value_type", "uuids"}},
       1},
      {"ruler_niah_multikey", {{"haystack", "essays"}, {"haystack_dir", kEssays}}, 1},
      {"ruler_niah_multikey", {{"haystack", "needle"}}, 1},
      {"ruler_niah_multikey",
       {{"haystack", "needle"}, {"key_type", "uuids"}, {"value_type", "uuids"}},
       1},
      {"ruler_niah_multivalue", {{"haystack", "essays"}, {"haystack_dir", kEssays}}, 4},
      {"ruler_niah_multiquery", {{"haystack", "essays"}, {"haystack_dir", kEssays}}, 4},
  };
  for (auto c : cases) {
    c.opts["context_length"] = "2048";
    c.opts["num_samples"] = "3";
    const auto s = ruler(c.name, c.opts);
    ASSERT_EQ(s.size(), 3u) << c.name;
    expect_fits(s, 2048);
    for (const auto& x : s) {
      EXPECT_EQ(x.max_new_tokens, 128);
      EXPECT_EQ(x.fields.at("task_group"), "ruler") << c.name;
      ASSERT_EQ(x.references.size(), c.golds) << c.name;
      for (const auto& r : x.references) {
        EXPECT_EQ(occurrences(x.context, " is: " + r + "."), 1u) << c.name << " " << r;
      }
      const bool one = c.golds == 1;
      EXPECT_EQ(x.context.rfind(one ? "A special magic " : "Some special magic ", 0), 0u);
      EXPECT_EQ(x.question.rfind(one ? "\nWhat is the special magic " : "\nWhat are all the", 0),
                0u);
    }
    expect_string_match(c.name, s[0]);
  }
  // Haystack lines of the needle haystack are distractors with other keys: the queried key
  // has exactly one needle.
  const auto d = ruler("ruler_niah_multikey", {{"haystack", "needle"}, {"num_samples", "1"}});
  const std::string q = d[0].question;
  const std::string key = q.substr(q.find(" for ") + 5, q.find(" mentioned") - q.find(" for ") - 5);
  EXPECT_EQ(occurrences(d[0].context, " for " + key + " is: "), 1u);
  EXPECT_GT(occurrences(d[0].context, "One of the special magic numbers for "), 50u);
}

TEST(Ruler, NiahOnKjvAndDeterminism) {
  if (!have_bible())
    GTEST_SKIP() << "`bible` not installed (install bible-kjv: bash scripts/setup.sh)";
  const auto a = ruler("ruler_niah_multivalue", {{"num_samples", "2"}, {"limit", "1"}});
  const auto b = ruler("ruler_niah_multivalue", {{"num_samples", "2"}, {"limit", "1"}});
  const auto c = ruler("ruler_niah_multivalue", {{"num_samples", "1"}, {"seed", "7"}});
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].context, b[0].context);
  EXPECT_NE(a[0].references, c[0].references);
  expect_fits(a, 4096);
  EXPECT_NE(a[0].context.find("In the beginning God created"), std::string::npos);
  EXPECT_EQ(a[0].answer_prefix.find("The special magic numbers for "), 0u);
}

TEST(Ruler, VariableTrackingChainIsInTheContext) {
  const auto s = ruler("ruler_vt", {{"context_length", "2048"}, {"num_samples", "3"}});
  ASSERT_EQ(s.size(), 3u);
  expect_fits(s, 2048);
  for (const auto& x : s) {
    EXPECT_EQ(x.max_new_tokens, 30);
    ASSERT_EQ(x.references.size(), 5u);
    for (size_t j = 1; j < x.references.size(); ++j) {
      EXPECT_EQ(occurrences(x.context, "VAR " + x.references[j] + " = VAR " + x.references[j - 1]),
                1u);
    }
    const size_t v = x.question.find("the value ") + 10;
    const std::string value = x.question.substr(v, 5);
    EXPECT_EQ(occurrences(x.context, "VAR " + x.references[0] + " = " + value), 1u);
    // RULER's one-shot example comes first, with its own 3-letter chain and answer.
    EXPECT_EQ(x.context.rfind("Memorize and track the chain(s)", 0), 0u);
    EXPECT_NE(x.context.find("they are: "), std::string::npos);
    EXPECT_NE(x.answer_prefix.find("5 variables are assigned the value " + value),
              std::string::npos);
  }
  expect_string_match("ruler_vt", s[0]);
}

// Counts of the numbered list after the last instruction (the few-shot example comes first).
std::map<std::string, int> cwe_counts(const std::string& context) {
  const std::string marker = "Memorize the ones that appear most often.\n";
  std::istringstream in(context.substr(context.rfind(marker) + marker.size()));
  std::map<std::string, int> counts;
  std::string num, word;
  int expect = 1;
  while (in >> num >> word) {
    EXPECT_EQ(num, std::to_string(expect++) + ".");
    ++counts[word];
  }
  return counts;
}

TEST(Ruler, CommonWordsGoldsAreTheMostFrequent) {
  for (const std::string length : {"2048", "4096"}) {
    const auto s = ruler("ruler_cwe", {{"context_length", length}, {"num_samples", "2"}});
    ASSERT_EQ(s.size(), 2u);
    expect_fits(s, std::stoi(length));
    for (const auto& x : s) {
      EXPECT_EQ(x.max_new_tokens, 120);
      ASSERT_EQ(x.references.size(), 10u);
      const auto counts = cwe_counts(x.context);
      int gold_min = INT_MAX, other_max = 0;
      for (const auto& [w, n] : counts) {
        if (std::count(x.references.begin(), x.references.end(), w) > 0) {
          gold_min = std::min(gold_min, n);
        } else {
          other_max = std::max(other_max, n);
        }
      }
      for (const auto& r : x.references) EXPECT_EQ(counts.count(r), 1u) << r;
      EXPECT_GT(gold_min, other_max);
      EXPECT_EQ(gold_min, length == std::string("2048") ? 6 : 30);
      EXPECT_GT(counts.size(), 50u);
    }
    expect_string_match("ruler_cwe", s[0]);
  }
}

TEST(Ruler, FrequentWordsGoldsAreTheTopThree) {
  const auto s = ruler("ruler_fwe", {{"context_length", "4096"}, {"num_samples", "3"}});
  ASSERT_EQ(s.size(), 3u);
  expect_fits(s, 4096);
  for (const auto& x : s) {
    EXPECT_EQ(x.max_new_tokens, 50);
    const std::string intro = "Find the three most frequently appeared coded words. ";
    std::istringstream in(x.context.substr(x.context.find(intro) + intro.size()));
    std::map<std::string, int> counts;
    std::string w;
    while (in >> w) ++counts[w];
    EXPECT_GT(counts.at("..."), counts.at(x.references[0]));  // the noise rank
    counts.erase("...");
    std::vector<std::pair<int, std::string>> ranked;
    for (const auto& [word, n] : counts) ranked.push_back({n, word});
    std::sort(ranked.rbegin(), ranked.rend());
    ASSERT_GE(ranked.size(), 4u);
    ASSERT_EQ(x.references.size(), 3u);
    for (int k = 0; k < 3; ++k) EXPECT_EQ(ranked[k].second, x.references[k]);
    EXPECT_GT(ranked[2].first, ranked[3].first);
  }
  expect_string_match("ruler_fwe", s[0]);
}

TEST(Ruler, ErrorsAndLimits) {
  EXPECT_EQ(ruler("ruler_cwe", {{"num_samples", "5"}, {"limit", "2"}}).size(), 2u);
  std::string e = error_of([] { ruler("ruler_vt", {{"context_length", "64"}}); });
  EXPECT_NE(e.find("too small"), std::string::npos) << e;
  e = error_of([] { ruler("ruler_niah_single", {{"value_type", "colours"}}); });
  EXPECT_NE(e.find("words, numbers, uuids"), std::string::npos) << e;
  e = error_of([] { ruler("ruler_fwe", {{"freq_cw", "3"}}); });
  EXPECT_NE(e.find("alpha"), std::string::npos) << e;  // lists fwe's options
}

}  // namespace
}  // namespace kvb::tasks
