// Metrics as pure functions (TASKS.md; peers.md section 2). Each matches the implementation users
// already trust and is tested against values that implementation computed
// (scripts/make_metric_fixture.py): LongBench's metrics.py, the `rouge` / `rouge-score`
// packages, rapidfuzz/fuzzywuzzy ratios, RULER's string matching.
#pragma once

#include <string>
#include <vector>

namespace kvb::tasks::metrics {

// LongBench normalize_answer: lowercase, remove punctuation, remove articles (a, an, the),
// collapse whitespace.
std::string normalize_answer(const std::string& s);
// LongBench qa_f1_score: token F1 of the normalized, whitespace-split prediction vs reference.
double qa_f1(const std::string& prediction, const std::string& reference);
// Chinese QA F1 with character-level tokens (LongBench uses jieba words; documented difference):
// punctuation (ASCII and CJK) and whitespace removed, then each code point is a token.
double qa_f1_zh(const std::string& prediction, const std::string& reference);
// ROUGE-L F as LongBench's rouge_score (the `rouge` package: whitespace tokens, LCS-based
// F-measure with beta 1; empty prediction or reference gives 0).
double rouge_l_longbench(const std::string& prediction, const std::string& reference);
// Character-level Chinese ROUGE-L (LongBench uses jieba; documented difference).
double rouge_l_zh(const std::string& prediction, const std::string& reference);
// ROUGE-1/2/L F-measure as Google's `rouge-score` package with its default tokenizer
// (lowercase, non-alphanumeric -> space, tokens of [a-z0-9]+; no stemming).
struct RougeScores {
  double rouge_1 = 0, rouge_2 = 0, rouge_l = 0;
};
RougeScores rouge_score(const std::string& prediction, const std::string& reference);
// LongBench classification_score (with all_classes).
double classification(const std::string& prediction, const std::string& reference,
                      const std::vector<std::string>& all_classes);
// LongBench retrieval_score / retrieval_zh_score (the "Paragraph N" / "段落N" id) and count_score.
double retrieval(const std::string& prediction, const std::string& reference);
double retrieval_zh(const std::string& prediction, const std::string& reference);
double count(const std::string& prediction, const std::string& reference);
// LongBench code_sim_score: fuzz.ratio / 100 of the first prediction line that is not a comment
// or code fence, against the reference.
double code_sim(const std::string& prediction, const std::string& reference);
// fuzzywuzzy / rapidfuzz fuzz.ratio in [0, 100]: normalized Indel similarity of two strings.
double fuzz_ratio(const std::string& a, const std::string& b);
// RULER string_match_all: fraction of references found (case-insensitive substring) in the
// prediction; string_match_part: 1 if any reference is found.
double string_match_all(const std::string& prediction, const std::vector<std::string>& refs);
double string_match_part(const std::string& prediction, const std::vector<std::string>& refs);
// NIAH recall: fraction of the expected answer's content words (lowercased, stop words removed)
// present in the prediction.
double niah_recall(const std::string& prediction, const std::string& expected_answer);
// The answer letter of a LongBench-v2 generation ("The correct answer is (B)" etc.); 0 if none.
char extract_choice_letter(const std::string& prediction);

}  // namespace kvb::tasks::metrics
