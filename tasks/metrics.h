// Metrics as pure functions (TASKS.md; peers.md section 2). Each matches the implementation users
// already trust and is tested against values that implementation computed
// (scripts/make_metric_fixture.py -> tests/fixtures/metrics/metrics.json): LongBench's metrics.py
// (THUDM/LongBench f6227eb), the `rouge` 1.0.1 / `rouge-score` 0.1.2 packages, rapidfuzz 3.10.1 /
// fuzzywuzzy 0.18.0 ratios, RULER's string matching, LongBench-v2's answer extraction.
//
// Text is UTF-8 and handled as Python handles `str`: code points, str.lower() (full Unicode
// mapping, final sigma), str.split() whitespace, re's Unicode \w and \d (tables generated from
// Python 3.11's Unicode 14.0.0; see namespace py below). An invalid UTF-8 byte reads as U+FFFD.
// Per-sample scores are fractions in [0, 1]; callers take the max over gold answers and report
// 100 x mean, as LongBench and RULER do.
#pragma once

#include <string>
#include <vector>

namespace kvb::tasks::metrics {

// LongBench normalize_answer: lowercase, remove ASCII punctuation (Python's string.punctuation;
// curly quotes, dashes and CJK punctuation stay), remove the articles a/an/the where they stand
// between \b word boundaries (Unicode \w), collapse whitespace.
std::string normalize_answer(const std::string& s);
// LongBench qa_f1_score: token F1 of the normalized, whitespace-split prediction vs reference
// (multiset overlap; 0 when nothing overlaps, including empty inputs).
double qa_f1(const std::string& prediction, const std::string& reference);
// Chinese QA F1 with character-level tokens (LongBench uses jieba words; documented difference):
// LongBench's qa_f1_zh_score with jieba.cut replaced by one token per code point; each token is
// lowercased, ASCII punctuation, LongBench's CJK punctuation list and whitespace are removed, and
// tokens left empty are dropped.
double qa_f1_zh(const std::string& prediction, const std::string& reference);
// ROUGE-L F as LongBench's rouge_score (the `rouge` package, case-sensitive): text is split into
// sentences at '.', sentences into whitespace tokens; summary-level union-LCS over the *sets* of
// words, F = 2PR / (P + R + 1e-8); an empty prediction or reference (no sentence) gives 0.
// One documented difference: `rouge` reads its LCS out recursively, so a sentence pair whose
// read-out takes more than about 1000 steps raises RecursionError in Python, which LongBench
// turns into 0.0; we return the value the formula gives.
double rouge_l_longbench(const std::string& prediction, const std::string& reference);
// Character-level Chinese ROUGE-L (LongBench uses jieba; documented difference): rouge_l_longbench
// of the texts with a space between every two code points (" ".join(list(text))).
double rouge_l_zh(const std::string& prediction, const std::string& reference);
// ROUGE-1/2/L F-measure as Google's `rouge-score` package with its default tokenizer
// (lowercase, non-alphanumeric -> space, tokens of [a-z0-9]+; no stemming).
struct RougeScores {
  double rouge_1 = 0, rouge_2 = 0, rouge_l = 0;
};
RougeScores rouge_score(const std::string& prediction, const std::string& reference);
// LongBench classification_score (with all_classes), quirks included: classes found as substrings
// of the prediction; those that are proper substrings of the reference are dropped by removing
// from the list while iterating it (so the element after a removed one is not examined); score
// 1/len(matches) if the reference is among the matches, else 0.
double classification(const std::string& prediction, const std::string& reference,
                      const std::vector<std::string>& all_classes);
// LongBench retrieval_score / retrieval_zh_score (the "Paragraph N" / "段落N" id) and count_score:
// the fraction of the digit runs (re \d+, Unicode digits) in the prediction equal to the id or
// count as strings; 0 when the prediction has none. retrieval* throw kvb::Error when the
// reference holds no id (LongBench raises IndexError).
double retrieval(const std::string& prediction, const std::string& reference);
double retrieval_zh(const std::string& prediction, const std::string& reference);
double count(const std::string& prediction, const std::string& reference);
// LongBench code_sim_score: fuzz.ratio / 100 of the first prediction line (after stripping leading
// newlines) that contains no '`', '#' or "//" (the empty string if none), against the reference.
// fuzzywuzzy's ratio is an integer, so this is round_half_even(fuzz_ratio(line, reference)) / 100:
// identical to fuzzywuzzy with python-Levenshtein; fuzzywuzzy without it (plain difflib, which
// LongBench's requirements imply) can score lower on reordered or long repetitive lines (the
// fixture lists such pairs).
double code_sim(const std::string& prediction, const std::string& reference);
// rapidfuzz fuzz.ratio in [0, 100], unrounded: normalized Indel similarity of the two code-point
// sequences, 100 * (1 - (|a| + |b| - 2 LCS) / (|a| + |b|)); 100 for two empty strings.
double fuzz_ratio(const std::string& a, const std::string& b);
// RULER string_match_all: fraction of references found (case-insensitive substring, str.lower())
// in the prediction; string_match_part: 1 if any reference is found. An empty refs list gives 0
// (RULER would divide by zero).
double string_match_all(const std::string& prediction, const std::vector<std::string>& refs);
double string_match_part(const std::string& prediction, const std::vector<std::string>& refs);
// NIAH recall: fraction of the expected answer's content words present as words in the
// prediction. Words are rouge-score's tokens (lowercased [a-z0-9]+ runs); content words are the
// distinct words minus the stop words a an the and or of to in on at for from by with as is are
// was were be it its this that (all words if only stop words remain); 0 if there are no words.
double niah_recall(const std::string& prediction, const std::string& expected_answer);
// The answer letter of a LongBench-v2 generation as its pred.py extract_answer: '*' removed, then
// the first "The correct answer is (X)", else the first "The correct answer is X" (X in A-D,
// case-sensitive); 0 if none.
char extract_choice_letter(const std::string& prediction);

// Python `str` semantics the metrics are built on (Python 3.11, Unicode 14.0.0), exposed for tests.
namespace py {
std::string lower(const std::string& s);  // str.lower(): full mapping, U+0130, final sigma
bool is_space(char32_t c);                // str.isspace() (what str.split() splits on)
bool is_word(char32_t c);                 // re \w: str.isalnum() or '_'
bool is_decimal(char32_t c);              // re \d: general category Nd
}  // namespace py

}  // namespace kvb::tasks::metrics
