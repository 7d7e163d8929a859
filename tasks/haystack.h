// Building blocks of the synthetic tasks (TASKS.md "niah" and "RULER-style"): haystack sources
// (kjv, essays, noise, file), cutting a haystack to a token budget, needle insertion at a depth
// at a sentence boundary (gkamradt/LLMTest_NeedleInAHaystack: back off to the previous '.'),
// counter-based random draws, built-in word lists, and the string_match_all task shell that the
// RULER generators (NVIDIA/RULER scripts/data/synthetic/*.py) share.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tasks/task.h"

namespace kvb::tasks {

// Tokens reserved for the chat template's markers (role headers, BOS, end-of-turn) when a sample
// is wrapped in a chat template: the task sees token counts of plain text only (TaskContext), and
// the templates of the models we run (Llama-3, Qwen2, SmolLM2) add 10 to 30 tokens.
inline constexpr int kChatReserveTokens = 32;

// RULER's repeated filler (RULER niah.py `repeat` haystack and variable_tracking.py noise).
inline constexpr char kNoiseFiller[] =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

// Deterministic draws from (seed, stream): a splitmix64 sequence, identical on every platform and
// standard library (std:: distributions are implementation-defined). Streams separate samples.
class Rng {
 public:
  explicit Rng(uint64_t seed, uint64_t stream = 0);
  uint64_t next();
  uint64_t below(uint64_t n);  // uniform in [0, n), n > 0 (rejection sampling: no modulo bias)
  int64_t range(int64_t lo, int64_t hi);  // uniform in [lo, hi]
  double uniform();                       // uniform in [0, 1)
  // k distinct values of [0, n) in draw order (random.sample); k <= n.
  std::vector<int64_t> sample(int64_t n, int64_t k);
  template <typename T>
  void shuffle(std::vector<T>& v) {  // Fisher-Yates
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

 private:
  uint64_t state_;
};
// A stream id from several integers (e.g. context length, depth, sample index).
uint64_t mix_stream(std::initializer_list<int64_t> parts);

// ---- haystack sources ---------------------------------------------------------------------------
struct HaystackSource {
  std::string kind;  // kjv | essays | noise | file
  std::string dir;   // essays: a directory of .txt files
  std::string file;  // file: any text file
};
// The names a `haystack` option accepts for niah (RULER tasks add `needle`).
const std::vector<std::string>& haystack_kinds();
// Usage-checks that the source's directory or file exists (names the path if not); cheap, so
// task constructors call it and `kvbench validate` reports a bad path before anything runs.
void check_haystack_source(const HaystackSource& source);
// The source's text, read once per process and cached (thread-safe):
//   kjv: Debian's `bible-kjv` (`bible "Gen1:1-Rev22:21"`) with book/chapter headers and verse
//        numbers removed, verses joined into prose with single spaces;
//   essays: every *.txt in `dir`, sorted by name, concatenated as gkamradt does (no separator);
//   noise: kNoiseFiller; file: the file as is.
const std::string& haystack_text(const HaystackSource& source);
// The text split on whitespace runs (RULER: re.sub(r'\s+', ' ', essay).split(' ')), cached.
const std::vector<std::string>& haystack_words(const HaystackSource& source);

// ---- cutting and insertion ----------------------------------------------------------------------
using CountTokens = std::function<int(const std::string&)>;
// The longest prefix of the endless text source[offset:] + " " + source + " " + source ..., cut at
// a word boundary, with count_tokens(prefix) <= budget (gkamradt repeats the essays until the
// length is reached). Galloping then binary search on characters: O(log n) token counts.
// Throws if budget < 1 or the source is empty.
std::string cut_to_token_budget(const std::string& source, size_t offset, int budget,
                                const CountTokens& count_tokens);
// The start of the first sentence at or after `pos` (just after a '.', '!' or '?' and spaces).
size_t sentence_start_at_or_after(const std::string& text, size_t pos);

struct Insertion {
  std::string text;   // haystack with the needle
  size_t needle_pos;  // where the needle starts in `text`
  size_t target;      // the depth's character position in the haystack, before backing off
};
// Inserts `needle` at depth_percent of the haystack's characters, backed off to just after the
// previous '.' (gkamradt's rule, by characters instead of tokens): 0 puts it first, 100 last.
// Single spaces separate it from the neighbouring text.
Insertion insert_at_depth(const std::string& haystack, const std::string& needle,
                          double depth_percent);
// Sentences of a text (RULER uses nltk's sent_tokenize): split after '.', '!' or '?' followed by
// whitespace; the pieces, trimmed, rejoined with single spaces give back the text's words.
std::vector<std::string> split_sentences(const std::string& text);

// Largest n in [lo, hi] with fits(n), for fits monotone (true then false); `guess` seeds a
// galloping search. Returns lo - 1 when not even fits(lo).
int64_t fit_largest(int64_t lo, int64_t hi, int64_t guess,
                    const std::function<bool(int64_t)>& fits);

// ---- needles ------------------------------------------------------------------------------------
// Built-in word lists (common English adjectives, nouns, verbs; no word is a substring of another,
// so substring matching in string_match_all cannot confuse two of them).
const std::vector<std::string>& word_adjectives();
const std::vector<std::string>& word_nouns();
const std::vector<std::string>& word_base();  // all three lists, sorted
// RULER's random needle parts: an "adjective-noun" word, a number of `digits` digits (no leading
// zero), a version-4 UUID in 8-4-4-4-12 lowercase hex.
std::string random_word(Rng& rng);
std::string random_number(Rng& rng, int digits);
std::string random_uuid(Rng& rng);

// ---- the shared task shell ----------------------------------------------------------------------
// Prompt pieces of one sample; tokens() counts what the model will see (plus the chat reserve).
struct PromptParts {
  std::string context, question, answer_prefix;
};
int prompt_tokens(const TaskContext& ctx, const PromptParts& parts, bool chat);

// ---- RULER-style generation ---------------------------------------------------------------------
// Options every ruler_* task takes (RULER's defaults: 4096 tokens, seed 42).
struct RulerCommon {
  int context_length = 4096, num_samples = 10, seed = 42, limit = 0;
  bool chat = true;
};
RulerCommon read_ruler_common(const Options& o);
std::vector<ParamDoc> ruler_common_params();
struct Generated {
  PromptParts parts;
  std::vector<std::string> answers;  // the gold strings (Sample.references)
};
// Samples 0 .. min(num_samples, limit) - 1. Sample i is build(i, n) with the largest haystack size
// n >= lo (noise repeats, words, ...) whose prompt tokens plus max_new_tokens fit context_length
// (RULER counts tokens_to_generate in the length). build must be deterministic in (i, n).
// step > 0 sizes as RULER's qa.py: sample 0's largest n for every sample, stepped down by `step`
// (not below lo) while a sample does not fit.
std::vector<Sample> ruler_samples(const TaskContext& ctx, const RulerCommon& common,
                                  const std::string& task, int max_new_tokens, int64_t lo,
                                  const std::function<Generated(int, int64_t)>& build,
                                  int64_t step = 0);

// A generated task scored with RULER's string_match_all (string_match_part with match_part: the
// QA tasks) against Sample.references: the ruler_* tasks. `generate` makes all samples (it owns
// seeds, limits and budgets).
class StringMatchTask : public Task {
 public:
  using Generator = std::function<std::vector<Sample>(const TaskContext&)>;
  StringMatchTask(std::string name, int version, Generator generate, bool match_part = false)
      : name_(std::move(name)),
        version_(version),
        generate_(std::move(generate)),
        metric_(match_part ? "string_match_part" : "string_match_all") {}
  std::string name() const override { return name_; }
  int version() const override { return version_; }
  std::vector<MetricInfo> metrics() const override { return {{metric_, true}}; }
  std::vector<Sample> samples(const TaskContext& ctx) override { return generate_(ctx); }
  Scores score(const Sample& sample, const Prediction& prediction) const override;

 private:
  std::string name_;
  int version_;
  Generator generate_;
  std::string metric_;
};

}  // namespace kvb::tasks
