// Tests tasks/metrics.h against the values the reference implementations computed
// (tests/fixtures/metrics/metrics.json, written by scripts/make_metric_fixture.py: LongBench
// metrics.py, rouge 1.0.1, rouge-score 0.1.2, rapidfuzz 3.10.1, fuzzywuzzy 0.18.0, RULER,
// LongBench-v2) and against hand-computed cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "tasks/metrics.h"

namespace kvb::tasks::metrics {
namespace {

using json = nlohmann::json;

// Every reference computes the same IEEE operations in the same order, so values agree to the last
// bit in practice; 1e-9 leaves room for a compiler contracting a*b+c.
constexpr double kTol = 1e-9;

const json& fixture() {
  static const json fx = [] {
    std::ifstream in(std::string(KVB_FIXTURES_DIR) + "/metrics/metrics.json");
    EXPECT_TRUE(in.good()) << "missing tests/fixtures/metrics/metrics.json";
    return json::parse(in);
  }();
  return fx;
}

std::string utf8(char32_t c) {
  std::string out;
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out += {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
  } else if (c < 0x10000) {
    out += {static_cast<char>(0xE0 | (c >> 12)), static_cast<char>(0x80 | ((c >> 6) & 0x3F)),
            static_cast<char>(0x80 | (c & 0x3F))};
  } else {
    out += {static_cast<char>(0xF0 | (c >> 18)), static_cast<char>(0x80 | ((c >> 12) & 0x3F)),
            static_cast<char>(0x80 | ((c >> 6) & 0x3F)), static_cast<char>(0x80 | (c & 0x3F))};
  }
  return out;
}

// Membership in a fixture list of [first, last] code-point ranges.
std::vector<bool> membership(const json& ranges) {
  std::vector<bool> in(0x110000, false);
  for (const auto& r : ranges) {
    for (uint32_t c = r[0].get<uint32_t>(); c <= r[1].get<uint32_t>(); ++c) in[c] = true;
  }
  return in;
}

// ---- against the reference implementations ---------------------------------------------------

TEST(MetricsFixture, RecordsPinnedVersions) {
  const json& v = fixture()["versions"];
  EXPECT_EQ(v["rouge"], "1.0.1");
  EXPECT_EQ(v["rouge-score"], "0.1.2");
  EXPECT_EQ(v["rapidfuzz"], "3.10.1");
  EXPECT_EQ(v["fuzzywuzzy"], "0.18.0");
  EXPECT_EQ(v["unicode"], "14.0.0");
}

TEST(MetricsFixture, NormalizeAnswerAndQaF1) {
  for (const auto& c : fixture()["normalize_answer"]) {
    EXPECT_EQ(normalize_answer(c["s"]), c["expected"].get<std::string>()) << c["s"];
  }
  for (const auto& c : fixture()["qa_f1"]) {
    EXPECT_NEAR(qa_f1(c["prediction"], c["reference"]), c["expected"].get<double>(), kTol)
        << c["prediction"] << " | " << c["reference"];
  }
  for (const auto& c : fixture()["qa_f1_multi"]) {  // LongBench: max over the gold answers
    double best = 0;
    for (const auto& r : c["references"]) best = std::max(best, qa_f1(c["prediction"], r));
    EXPECT_NEAR(best, c["expected"].get<double>(), kTol) << c["prediction"];
  }
}

TEST(MetricsFixture, ChineseCharacterLevel) {
  for (const auto& c : fixture()["qa_f1_zh"]) {
    EXPECT_NEAR(qa_f1_zh(c["prediction"], c["reference"]), c["expected"].get<double>(), kTol)
        << c["prediction"] << " | " << c["reference"];
  }
  for (const auto& c : fixture()["rouge_l_zh"]) {
    EXPECT_NEAR(rouge_l_zh(c["prediction"], c["reference"]), c["expected"].get<double>(), kTol)
        << c["prediction"] << " | " << c["reference"];
  }
}

TEST(MetricsFixture, RougeLLongBench) {
  for (const auto& c : fixture()["rouge_l_longbench"]) {
    EXPECT_NEAR(rouge_l_longbench(c["prediction"], c["reference"]), c["expected"].get<double>(),
                kTol)
        << c["prediction"] << " | " << c["reference"];
  }
  // The pair whose recursive LCS read-out makes LongBench return 0.0: we give the formula's value.
  const json& r = fixture()["rouge_l_longbench_recursion"];
  EXPECT_EQ(r["longbench"].get<double>(), 0.0);
  EXPECT_GT(r["expected"].get<double>(), 0.6);
  EXPECT_NEAR(rouge_l_longbench(r["prediction"], r["reference"]), r["expected"].get<double>(),
              kTol);
}

TEST(MetricsFixture, RougeScore) {
  for (const auto& c : fixture()["rouge_score"]) {
    const RougeScores s = rouge_score(c["prediction"], c["reference"]);
    EXPECT_NEAR(s.rouge_1, c["rouge_1"].get<double>(), kTol) << c["prediction"];
    EXPECT_NEAR(s.rouge_2, c["rouge_2"].get<double>(), kTol) << c["prediction"];
    EXPECT_NEAR(s.rouge_l, c["rouge_l"].get<double>(), kTol) << c["prediction"];
  }
}

TEST(MetricsFixture, ClassificationRetrievalCount) {
  for (const auto& c : fixture()["classification"]) {
    EXPECT_NEAR(classification(c["prediction"], c["reference"], c["all_classes"]),
                c["expected"].get<double>(), kTol)
        << c["prediction"] << " | " << c["reference"];
  }
  for (const auto& c : fixture()["retrieval"]) {
    EXPECT_NEAR(retrieval(c["prediction"], c["reference"]), c["expected"].get<double>(), kTol)
        << c["prediction"];
  }
  for (const auto& c : fixture()["retrieval_zh"]) {
    EXPECT_NEAR(retrieval_zh(c["prediction"], c["reference"]), c["expected"].get<double>(), kTol)
        << c["prediction"];
  }
  for (const auto& c : fixture()["count"]) {
    EXPECT_NEAR(count(c["prediction"], c["reference"]), c["expected"].get<double>(), kTol)
        << c["prediction"];
  }
}

TEST(MetricsFixture, FuzzRatioMatchesRapidfuzz) {
  int disagree = 0;
  for (const auto& c : fixture()["fuzz_ratio"]) {
    const double r = fuzz_ratio(c["a"], c["b"]);
    EXPECT_NEAR(r, c["rapidfuzz"].get<double>(), kTol) << c["a"] << " | " << c["b"];
    // fuzzywuzzy with python-Levenshtein is the rounded rapidfuzz value, always.
    EXPECT_EQ(std::nearbyint(r), c["fuzzywuzzy_levenshtein"].get<double>()) << c["a"];
    disagree += c["fuzzywuzzy_difflib"] != c["fuzzywuzzy_levenshtein"];
  }
  // The pairs where difflib's greedy blocks (and autojunk) fall short, listed in the notes:
  // Levenshtein/Lenvinsten and three strings of 200+ characters.
  EXPECT_EQ(disagree, 4);
}

TEST(MetricsFixture, CodeSimMatchesFuzzywuzzy) {
  int disagree = 0;
  for (const auto& c : fixture()["code_sim"]) {
    const double v = code_sim(c["prediction"], c["reference"]);
    EXPECT_NEAR(v, c["fuzzywuzzy_levenshtein"].get<double>(), kTol) << c["prediction"];
    if (c["fuzzywuzzy_difflib"] == c["fuzzywuzzy_levenshtein"]) {
      EXPECT_NEAR(v, c["fuzzywuzzy_difflib"].get<double>(), kTol) << c["prediction"];
    } else {
      ++disagree;  // difflib scores lower: listed in the fixture notes and in metrics.h
      EXPECT_LT(c["fuzzywuzzy_difflib"].get<double>(), v) << c["prediction"];
    }
  }
  EXPECT_EQ(disagree, 2);  // the logger.info pair and the 239-character list (autojunk)
}

TEST(MetricsFixture, StringMatchAndChoice) {
  for (const auto& c : fixture()["string_match"]) {
    const std::vector<std::string> refs = c["refs"];
    EXPECT_NEAR(string_match_all(c["prediction"], refs), c["all"].get<double>(), kTol)
        << c["prediction"];
    EXPECT_NEAR(string_match_part(c["prediction"], refs), c["part"].get<double>(), kTol)
        << c["prediction"];
  }
  for (const auto& c : fixture()["extract_choice"]) {
    const std::string want = c["expected"];
    const char got = extract_choice_letter(c["prediction"]);
    EXPECT_EQ(got == 0 ? std::string() : std::string(1, got), want) << c["prediction"];
  }
}

// ---- Python str semantics over every code point ------------------------------------------------

TEST(MetricsUnicode, WordDecimalSpaceTablesMatchPython) {
  const json& u = fixture()["unicode"];
  const std::vector<bool> word = membership(u["word_ranges"]);
  const std::vector<bool> decimal = membership(u["decimal_ranges"]);
  const std::vector<bool> space = membership(u["space_ranges"]);
  int wrong = 0;
  for (char32_t c = 0; c < 0x110000; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    const bool ascii_word = c < 0x80 && (std::isalnum(static_cast<int>(c)) || c == U'_');
    const bool ascii_digit = c < 0x80 && c >= U'0' && c <= U'9';
    const bool bad = py::is_word(c) != (c < 0x80 ? ascii_word : word[c]) ||
                     py::is_decimal(c) != (c < 0x80 ? ascii_digit : decimal[c]) ||
                     py::is_space(c) != space[c];
    if (bad && ++wrong <= 5) ADD_FAILURE() << "code point " << static_cast<uint32_t>(c);
  }
  EXPECT_EQ(wrong, 0);
}

TEST(MetricsUnicode, LowerMatchesPython) {
  const json& u = fixture()["unicode"];
  // Every code point that str.lower() changes, space-separated, and Python's lowercase of it.
  EXPECT_EQ(py::lower(u["lower_probe"]["s"]), u["lower_probe"]["lower"].get<std::string>());
  for (const auto& c : u["sigma"]) {  // final sigma contexts
    EXPECT_EQ(py::lower(c["s"]), c["lower"].get<std::string>()) << c["s"];
  }
}

TEST(MetricsUnicode, ArticleBoundariesFollowUnicodeWordCharacters) {
  // "\b(a|an|the)\b" sees Unicode \w: an article glued to a letter of any script stays.
  EXPECT_EQ(normalize_answer("ça"), "ça");
  EXPECT_EQ(normalize_answer("中a中"), "中a中");
  EXPECT_EQ(normalize_answer("\u201cthe\u201d"), "\u201c \u201d");  // curly quotes are not \w
  EXPECT_EQ(normalize_answer("—an—"), "— —");
  for (char32_t c : {U'é', U'ß', U'Ж', U'中', U'٣', U'²'}) {
    EXPECT_EQ(normalize_answer(utf8(c) + "a"), py::lower(utf8(c)) + "a") << utf8(c);
  }
}

// ---- hand-computed cases
// -------------------------------------------------------------------------

TEST(MetricsHand, QaF1) {
  // "cat sat" vs "cat sat down": overlap 2, P = 1, R = 2/3, F1 = 2 * (2/3) / (5/3) = 0.8.
  EXPECT_NEAR(qa_f1("The cat sat", "a cat sat down"), 0.8, 1e-12);
  EXPECT_EQ(normalize_answer("  The Cat, an ANIMAL!  "), "cat animal");
  EXPECT_EQ(qa_f1("Paris", "paris."), 1.0);
  EXPECT_EQ(qa_f1("", "paris"), 0.0);
  EXPECT_EQ(qa_f1("paris", ""), 0.0);
  EXPECT_EQ(qa_f1("", ""), 0.0);
  EXPECT_EQ(qa_f1("the a an", "the"), 0.0);  // both normalize to nothing
  // Multiset overlap: "dog dog dog cat" vs "dog cat cat": common {dog, cat} = 2; P = 2/4, R = 2/3.
  EXPECT_NEAR(qa_f1("dog dog dog cat", "dog cat cat"), 2 * 0.5 * (2.0 / 3) / (0.5 + 2.0 / 3),
              1e-12);
}

TEST(MetricsHand, ChineseQaF1ByCharacter) {
  // 首 都 北 京 vs 北 京: overlap 2, P = 2/4, R = 1, F1 = 2/3.
  EXPECT_NEAR(qa_f1_zh("首都北京", "北京"), 2.0 / 3, 1e-12);
  // Same eight characters in another order; the full stop is punctuation.
  EXPECT_NEAR(qa_f1_zh("北京是中国的首都。", "中国的首都是北京"), 1.0, 1e-12);
  // Latin letters are lowercased, fullwidth comma and spaces dropped: a b c 北 京 both sides.
  EXPECT_NEAR(qa_f1_zh("ABC，北 京", "abc北京"), 1.0, 1e-12);
  EXPECT_EQ(qa_f1_zh("。，！", "北京"), 0.0);
  EXPECT_EQ(qa_f1_zh("", ""), 0.0);
}

TEST(MetricsHand, RougeLLongBench) {
  // Words {a, b, c} vs {a, c}: LCS {a, c}; R = 2/2, P = 2/3.
  const double p = 2.0 / 3, r = 1.0;
  EXPECT_NEAR(rouge_l_longbench("a b c", "a c"), 2.0 * ((p * r) / (p + r + 1e-8)), 1e-12);
  EXPECT_NEAR(rouge_l_longbench("Same text.", "Same text."), 2.0 * (1.0 / (2.0 + 1e-8)), 1e-12);
  EXPECT_EQ(rouge_l_longbench("", "x"), 0.0);
  EXPECT_EQ(rouge_l_longbench("x", ""), 0.0);
  EXPECT_EQ(rouge_l_longbench("...", "x"), 0.0);    // no sentence at all
  EXPECT_EQ(rouge_l_longbench("Cat", "cat"), 0.0);  // case-sensitive
  // Word sets: repeating a word does not change the score.
  EXPECT_NEAR(rouge_l_longbench("x x x x", "x"), rouge_l_longbench("x", "x"), 1e-15);
}

TEST(MetricsHand, RougeScore) {
  // pred "the cat sat" vs ref "the cat sat on the mat".
  const RougeScores s = rouge_score("The cat sat.", "the cat sat on the mat");
  EXPECT_NEAR(s.rouge_1, 2 * 1.0 * 0.5 / 1.5, 1e-12);  // P = 3/3, R = 3/6
  EXPECT_NEAR(s.rouge_2, 2 * 1.0 * 0.4 / 1.4, 1e-12);  // P = 2/2, R = 2/5
  EXPECT_NEAR(s.rouge_l, 2 * 1.0 * 0.5 / 1.5, 1e-12);  // LCS 3
  const RougeScores e = rouge_score("", "");
  EXPECT_EQ(e.rouge_1, 0.0);
  EXPECT_EQ(e.rouge_2, 0.0);
  EXPECT_EQ(e.rouge_l, 0.0);
  EXPECT_EQ(rouge_score("!!!", "words").rouge_1, 0.0);
}

TEST(MetricsHand, ClassificationRetrievalCount) {
  EXPECT_EQ(classification("Location", "Location", {"Location", "Number"}), 1.0);
  EXPECT_EQ(classification("Location or Number", "Location", {"Location", "Number"}), 0.5);
  EXPECT_EQ(classification("none", "Location", {"Location", "Number"}), 0.0);
  EXPECT_EQ(classification("", "Location", {}), 0.0);
  // LongBench removes from the list it iterates: "ab" goes, "b" is skipped and stays.
  EXPECT_EQ(classification("abc", "abc", {"ab", "b", "abc"}), 0.5);
  EXPECT_EQ(retrieval("Paragraph 3 and Paragraph 12", "Paragraph 3"), 0.5);
  EXPECT_EQ(retrieval("none", "Paragraph 3"), 0.0);
  EXPECT_EQ(retrieval("", "Paragraph 3"), 0.0);
  EXPECT_EQ(retrieval_zh("段落12", "段落12"), 1.0);
  EXPECT_THROW(retrieval("Paragraph 3", "no id here"), kvb::Error);
  EXPECT_THROW(retrieval_zh("段落3", ""), kvb::Error);
  EXPECT_NEAR(count("7 of 30 or 7", "7"), 2.0 / 3, 1e-12);
  EXPECT_EQ(count("", "7"), 0.0);
  EXPECT_EQ(count("07", "7"), 0.0);  // compared as strings
}

TEST(MetricsHand, FuzzRatioAndCodeSim) {
  // kitten / sitting: LCS "ittn" = 4, Indel distance 6 + 7 - 8 = 5, ratio 100 * 8/13.
  EXPECT_NEAR(fuzz_ratio("kitten", "sitting"), 100.0 * 8 / 13, 1e-12);
  EXPECT_EQ(fuzz_ratio("", ""), 100.0);
  EXPECT_EQ(fuzz_ratio("", "abc"), 0.0);
  EXPECT_EQ(fuzz_ratio("中文", "中文"), 100.0);
  EXPECT_NEAR(fuzz_ratio("中文", "中国"), 50.0, 1e-12);  // code points, not bytes
  EXPECT_NEAR(code_sim("kitten", "sitting"), 0.62, 1e-12);
  // Python's round() is half-to-even: 87.5 -> 88, 62.5 -> 62.
  EXPECT_NEAR(code_sim("abcdefgh", "abcdefgx"), 0.88, 1e-12);
  EXPECT_NEAR(code_sim("abcdefgh", "abcdexyz"), 0.62, 1e-12);
  EXPECT_EQ(code_sim("\n\n```\n# note\n// c\nx = 1\ny", "x = 1"), 1.0);
  EXPECT_EQ(code_sim("# only comments", "x = 1"), 0.0);
  EXPECT_EQ(code_sim("# only comments", ""), 1.0);  // "" == "" is 100 in fuzzywuzzy
  EXPECT_EQ(code_sim("", ""), 1.0);
}

// The bit-parallel LCS against the plain dynamic programme, across 64-bit word boundaries.
TEST(MetricsHand, FuzzRatioMatchesDynamicProgramme) {
  std::mt19937 rng(20240611);
  for (int iter = 0; iter < 300; ++iter) {
    const int alphabet = 2 + iter % 5;
    std::string a(rng() % 200, 'a'), b(rng() % 200, 'a');
    for (char& ch : a) ch = static_cast<char>('a' + rng() % alphabet);
    for (char& ch : b) ch = static_cast<char>('a' + rng() % alphabet);
    std::vector<size_t> prev(b.size() + 1, 0), cur(b.size() + 1, 0);
    for (size_t i = 1; i <= a.size(); ++i) {
      for (size_t j = 1; j <= b.size(); ++j) {
        cur[j] = a[i - 1] == b[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
      }
      std::swap(prev, cur);
    }
    const size_t total = a.size() + b.size();
    const double want =
        total == 0 ? 100.0 : (1.0 - static_cast<double>(total - 2 * prev[b.size()]) / total) * 100;
    ASSERT_EQ(fuzz_ratio(a, b), want) << a << " | " << b;
  }
}

TEST(MetricsHand, StringMatch) {
  EXPECT_EQ(string_match_all("The number is 12345 and 678", {"12345", "678"}), 1.0);
  EXPECT_EQ(string_match_all("The number is 12345", {"12345", "999"}), 0.5);
  EXPECT_EQ(string_match_part("The number is 12345", {"12345", "999"}), 1.0);
  EXPECT_EQ(string_match_part("nothing", {"12345", "999"}), 0.0);
  EXPECT_EQ(string_match_all("UUID-ABC", {"uuid-abc"}), 1.0);
  EXPECT_EQ(string_match_all("x", {}), 0.0);
  EXPECT_EQ(string_match_part("x", {}), 0.0);
  EXPECT_EQ(string_match_all("", {"x"}), 0.0);
  EXPECT_EQ(string_match_all("", {""}), 1.0);  // "" is in every string
}

TEST(MetricsHand, NiahRecall) {
  const std::string needle = "eat a sandwich and sit in Dolores Park on a sunny day.";
  // Content words: eat sandwich sit dolores park sunny day; 4 of them are in the prediction.
  EXPECT_NEAR(niah_recall("The best thing is to eat a sandwich in Dolores Park.", needle), 4.0 / 7,
              1e-12);
  EXPECT_EQ(niah_recall(needle, needle), 1.0);
  EXPECT_EQ(niah_recall("EAT A SANDWICH, SIT IN DOLORES PARK ON A SUNNY DAY!", needle), 1.0);
  EXPECT_EQ(niah_recall("", needle), 0.0);
  EXPECT_EQ(niah_recall("anything", ""), 0.0);
  EXPECT_EQ(niah_recall("it is the one", "the"), 1.0);  // only stop words: they count
  EXPECT_EQ(niah_recall("parked", "park"), 0.0);        // whole words only
  EXPECT_NEAR(niah_recall("The magic number is 4821937", "The magic number is 4821937."), 1.0,
              1e-12);
}

TEST(MetricsHand, ExtractChoiceLetter) {
  EXPECT_EQ(extract_choice_letter("The correct answer is (B)"), 'B');
  EXPECT_EQ(extract_choice_letter("The correct answer is C."), 'C');
  EXPECT_EQ(extract_choice_letter("**The correct answer is (D)**"), 'D');
  EXPECT_EQ(extract_choice_letter("The correct answer is **A**"), 'A');
  // The parenthesised form wins even when the bare form comes first.
  EXPECT_EQ(extract_choice_letter("The correct answer is B; The correct answer is (C)"), 'C');
  EXPECT_EQ(extract_choice_letter("the correct answer is (B)"), 0);
  EXPECT_EQ(extract_choice_letter("The correct answer is (E)"), 0);
  EXPECT_EQ(extract_choice_letter("(A)"), 0);
  EXPECT_EQ(extract_choice_letter(""), 0);
}

TEST(MetricsHand, InvalidUtf8ReadsAsReplacementCharacter) {
  EXPECT_EQ(normalize_answer("ab\xff"
                             "cd"),
            "ab\xEF\xBF\xBD"
            "cd");
  EXPECT_NEAR(fuzz_ratio("\xff", "\xfe"), 100.0, 1e-12);  // both U+FFFD
}

}  // namespace
}  // namespace kvb::tasks::metrics
