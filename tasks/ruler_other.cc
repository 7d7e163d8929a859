// RULER's multi-hop tracing and aggregation tasks (NVIDIA/RULER scripts/data/synthetic/
// variable_tracking.py, common_words_extraction.py, freq_words_extraction.py; templates in
// data/synthetic/constants.py; peers.md 2.3): ruler_vt (chains of "VAR X = VAR Y" in noise, with
// RULER's one-shot example), ruler_cwe (a numbered word list, name the num_cw most common words)
// and ruler_fwe (Zipf-distributed coded words, name the three most frequent).
#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <set>

#include "common/error.h"
#include "tasks/haystack.h"
#include "tasks/tasks.h"

namespace kvb::tasks {

namespace {

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::string collapse_spaces(const std::string& s) {  // ' '.join(s.split())
  std::string out;
  bool space = false;
  for (char ch : s) {
    if (std::isspace(static_cast<unsigned char>(ch))) {
      space = !out.empty();
    } else {
      if (space) out += ' ';
      space = false;
      out += ch;
    }
  }
  return out;
}

// ---- ruler_vt -----------------------------------------------------------------------------------
constexpr int kVtMaxNewTokens = 30;
constexpr int kVtExampleLength = 500;  // RULER builds its one-shot example at max_seq_length 500

struct VtConfig {
  RulerCommon common;
  int num_chains = 1, num_hops = 4;
  bool fewshot = true;
};

struct VtInstance {
  std::string context;            // noise lines with the chains
  std::string value;              // the first chain's value (the query)
  std::vector<std::string> vars;  // the first chain's variables (the answer)
  int num_v = 0;
};

// RULER's generate_chains + generate_input_output: variables of `letters` uppercase letters,
// chains "VAR A = 12345", "VAR B = VAR A ", ... at sorted random lines of n noise lines.
VtInstance vt_instance(int chains, int hops, int letters, Rng& rng, int64_t n) {
  std::set<std::string> used;
  std::vector<std::vector<std::string>> statements(chains);
  VtInstance inst;
  std::set<int64_t> values;
  for (int c = 0; c < chains; ++c) {
    std::vector<std::string> vars;
    while (static_cast<int>(vars.size()) < hops + 1) {
      std::string v;
      for (int i = 0; i < letters; ++i) v += static_cast<char>('A' + rng.below(26));
      if (used.insert(v).second) vars.push_back(v);
    }
    int64_t value = rng.range(10000, 99998);  // np.random.randint(10000, 99999)
    while (!values.insert(value).second) value = rng.range(10000, 99998);
    statements[c].push_back("VAR " + vars[0] + " = " + std::to_string(value));
    for (int j = 0; j < hops; ++j) {
      statements[c].push_back("VAR " + vars[j + 1] + " = VAR " + vars[j] + " ");
    }
    if (c == 0) {
      inst.vars = vars;
      inst.value = std::to_string(value);
      inst.num_v = hops + 1;
    }
  }
  std::vector<std::string> lines(n, std::string(kNoiseFiller) + "\n");
  for (const auto& chain : statements) {
    std::vector<int64_t> at =
        rng.sample(static_cast<int64_t>(lines.size()), static_cast<int64_t>(chain.size()));
    std::sort(at.begin(), at.end());
    for (size_t j = 0; j < chain.size(); ++j) lines.insert(lines.begin() + at[j] + j, chain[j]);
  }
  std::string ctx = join(lines, " ");
  for (size_t p = ctx.find(". \n"); p != std::string::npos; p = ctx.find(". \n", p)) {
    ctx.erase(p + 1, 1);
  }
  inst.context = std::move(ctx);
  return inst;
}

const char kVtIntro[] =
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";
std::string vt_question(const VtInstance& v) {
  return "\nQuestion: Find all variables that are assigned the value " + v.value +
         " in the text above.";
}
// RULER's prefix ends in "they are: "; the dangling space is dropped (a lone space token).
std::string vt_answer_prefix(const VtInstance& v) {
  return "Answer: According to the chain(s) of variable assignment in the text above, " +
         std::to_string(v.num_v) + " variables are assigned the value " + v.value + ", they are:";
}

// RULER's one-shot example: 3-letter variables, at most 10 hops, fitted to 500 tokens with the
// answer, whitespace collapsed to one line.
std::string vt_example(const VtConfig& c, const TaskContext& ctx) {
  const int hops = std::min(10, c.num_hops);
  auto text = [&](int64_t n) {
    Rng rng(c.common.seed, mix_stream({-1}));
    const VtInstance v = vt_instance(c.num_chains, hops, 3, rng, n);
    return collapse_spaces(kVtIntro + v.context + vt_question(v)) + " " + vt_answer_prefix(v) +
           " " + join(v.vars, " ");
  };
  const int budget = kVtExampleLength - kVtMaxNewTokens;
  const int64_t n = fit_largest(hops + 1, 4 * static_cast<int64_t>(budget), hops + 1,
                                [&](int64_t k) { return ctx.count_tokens(text(k)) <= budget; });
  return text(std::max<int64_t>(n, hops + 1));
}

std::vector<Sample> vt_samples(const VtConfig& c, const TaskContext& ctx) {
  KVB_CHECK(ctx.count_tokens) << "task ruler_vt needs TaskContext.count_tokens";
  const std::string example = c.fewshot ? vt_example(c, ctx) + "\n\n" : "";
  return ruler_samples(
      ctx, c.common, "ruler_vt", kVtMaxNewTokens, c.num_hops + 1, [&](int i, int64_t n) {
        Rng rng(c.common.seed, mix_stream({i}));
        const VtInstance v = vt_instance(c.num_chains, c.num_hops, 5, rng, n);
        Generated g;
        g.parts = {example + kVtIntro + v.context, vt_question(v), vt_answer_prefix(v)};
        g.answers = v.vars;
        return g;
      });
}

// ---- ruler_cwe ----------------------------------------------------------------------------------
constexpr int kCweMaxNewTokens = 120;

struct CweConfig {
  RulerCommon common;
  int freq_cw = 30, freq_ucw = 3, num_cw = 10, num_fewshot = 1;
};

// `count` distinct words: built-in words while they last, then hyphenated tuples of them
// (RULER's sample_unique_words), so any context length can be filled.
std::vector<std::string> unique_words(Rng& rng, int64_t count) {
  const std::vector<std::string>& base = word_base();
  const int64_t b = static_cast<int64_t>(base.size());
  int arity = 1;
  int64_t capacity = b;
  while (capacity < count) {
    ++arity;
    capacity *= b;
  }
  std::vector<std::string> out;
  for (int64_t idx : rng.sample(capacity, count)) {
    std::string w;
    for (int a = 0; a < arity; ++a, idx /= b) w += (a ? "-" : "") + base[idx % b];
    out.push_back(std::move(w));
  }
  return out;
}

// A numbered list "1. w 2. w ..." of the first num_cw words `common` times each and the rest
// `uncommon` times each, shuffled; returns the list and the common words.
std::pair<std::string, std::vector<std::string>> cwe_list(Rng& rng, int64_t words, int common,
                                                          int uncommon, int num_cw) {
  const std::vector<std::string> all = unique_words(rng, words);
  std::vector<std::string> list;
  for (int64_t w = 0; w < words; ++w) {
    for (int r = 0; r < (w < num_cw ? common : uncommon); ++r) list.push_back(all[w]);
  }
  rng.shuffle(list);
  std::string text;
  for (size_t i = 0; i < list.size(); ++i) {
    text += (i ? " " : "") + std::to_string(i + 1) + ". " + list[i];
  }
  return {text, std::vector<std::string>(all.begin(), all.begin() + num_cw)};
}

std::vector<Sample> cwe_samples(const CweConfig& c, const TaskContext& ctx) {
  // RULER: below 4096 tokens the lists repeat 6/1 times and the example is 20 words x 3/1; from
  // 4096 on, freq_cw/freq_ucw and an example of 40 words x 10/3.
  const bool small = c.common.context_length < 4096;
  const std::string intro =
      "Below is a numbered list of words. In these words, some appear more often than others. "
      "Memorize the ones that appear most often.\n";
  const std::string question = "\nQuestion: What are the " + std::to_string(c.num_cw) +
                               " most common words in the above "
                               "list?";
  const std::string prefix = "Answer: The top " + std::to_string(c.num_cw) +
                             " words that appear most often in the list are:";
  return ruler_samples(
      ctx, c.common, "ruler_cwe", kCweMaxNewTokens, c.num_cw + 1, [&](int i, int64_t n) {
        Rng rng(c.common.seed, mix_stream({i}));
        std::string shots;
        for (int e = 0; e < c.num_fewshot; ++e) {
          auto [list, answer] =
              small ? cwe_list(rng, 20, 3, 1, c.num_cw) : cwe_list(rng, 40, 10, 3, c.num_cw);
          std::vector<std::string> numbered;
          for (size_t k = 0; k < answer.size(); ++k) {
            numbered.push_back(std::to_string(k + 1) + ". " + answer[k]);
          }
          shots += intro + list + question + " " + prefix + " " + join(numbered, " ") + "\n";
        }
        auto [list, answer] = cwe_list(rng, n, c.freq_cw, c.freq_ucw, c.num_cw);
        Generated g;
        g.parts = {shots + intro + list, question, prefix};
        g.answers = answer;
        return g;
      });
}

// ---- ruler_fwe ----------------------------------------------------------------------------------
constexpr int kFweMaxNewTokens = 50;

struct FweConfig {
  RulerCommon common;
  double alpha = 2.0;
  int coded_wordlen = 6, vocab_size = -1;
};

// Riemann zeta(a), a > 1: partial sum plus the Euler-Maclaurin tail (error far below 1e-12).
double riemann_zeta(double a) {
  const int n = 1000;
  double s = 0;
  for (int k = 1; k < n; ++k) s += std::pow(k, -a);
  return s + std::pow(n, 1 - a) / (a - 1) + 0.5 * std::pow(n, -a) + a * std::pow(n, -a - 1) / 12;
}

std::vector<Sample> fwe_samples(const FweConfig& c, const TaskContext& ctx) {
  const int vocab_size = c.vocab_size > 0
                             ? c.vocab_size
                             : (c.common.context_length - kFweMaxNewTokens) / 50;  // RULER's rule
  KVB_USAGE_CHECK(vocab_size >= 4)
      << "task ruler_fwe: vocab_size " << vocab_size << " < 4 (context_length "
      << c.common.context_length << " too small, or set vocab_size)";
  KVB_USAGE_CHECK(std::pow(26.0, c.coded_wordlen) >= 4.0 * vocab_size)
      << "task ruler_fwe: vocab_size " << vocab_size << " needs longer coded words than "
      << c.coded_wordlen << " letters";
  const double zeta = riemann_zeta(c.alpha);
  // The smallest scale at which the answers' counts (ranks 2..4) are at least 2, 1, ... words.
  const int64_t lo = static_cast<int64_t>(std::ceil(2 * zeta * std::pow(4.0, c.alpha)));
  return ruler_samples(ctx, c.common, "ruler_fwe", kFweMaxNewTokens, lo, [&](int i, int64_t n) {
    Rng rng(c.common.seed, mix_stream({i}));
    std::set<std::string> seen;
    std::vector<std::string> vocab;
    while (static_cast<int>(vocab.size()) < vocab_size) {
      std::string w;
      for (int k = 0; k < c.coded_wordlen; ++k) w += static_cast<char>('a' + rng.below(26));
      if (seen.insert(w).second) vocab.push_back(w);
    }
    std::sort(vocab.begin(), vocab.end());
    rng.shuffle(vocab);
    vocab[0] = "...";  // the top rank is noise
    std::vector<std::string> words;
    for (int k = 1; k <= vocab_size; ++k) {
      const auto times = static_cast<int64_t>(n * std::pow(k, -c.alpha) / zeta);
      for (int64_t t = 0; t < times; ++t) words.push_back(vocab[k - 1]);
    }
    rng.shuffle(words);
    Generated g;
    g.parts.context =
        "Read the following coded text and track the frequency of each coded word. Find the three "
        "most frequently appeared coded words. " +
        join(words, " ");
    g.parts.question =
        "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the "
        "three most frequently appeared words in the above coded text?";
    g.parts.answer_prefix =
        "Answer: According to the coded text above, the three most frequently appeared words are:";
    g.answers = {vocab[1], vocab[2], vocab[3]};
    return g;
  });
}

template <typename Config>
std::unique_ptr<Task> make(const std::string& name, Config c,
                           std::vector<Sample> (*gen)(const Config&, const TaskContext&)) {
  return std::make_unique<StringMatchTask>(
      name, 1, [c, gen](const TaskContext& ctx) { return gen(c, ctx); });
}

TaskInfo info(const std::string& name, const std::string& description,
              const std::vector<ParamDoc>& own) {
  TaskInfo t;
  t.name = name;
  t.description = description;
  t.params = ruler_common_params();
  t.params.insert(t.params.end(), own.begin(), own.end());
  return t;
}

}  // namespace

TaskInfo ruler_vt_task_info() {
  TaskInfo t = info("ruler_vt",
                    "RULER variable tracking: name every variable of a chain; "
                    "string_match_all",
                    {{"num_chains", "1", "variable chains (one is queried)", {}},
                     {"num_hops", "4", "hops per chain (num_hops + 1 variables)", {}},
                     {"fewshot", "true", "prepend RULER's one-shot example (500 tokens)", {}}});
  t.make = [](const Options& o) {
    VtConfig c;
    c.common = read_ruler_common(o);
    c.num_chains = o.get_int("num_chains", 1, 1, 64);
    c.num_hops = o.get_int("num_hops", 4, 1, 64);
    c.fewshot = o.get_bool("fewshot", true);
    return make<VtConfig>("ruler_vt", c, vt_samples);
  };
  return t;
}

TaskInfo ruler_cwe_task_info() {
  TaskInfo t = info("ruler_cwe",
                    "RULER common words extraction: the num_cw most frequent words "
                    "of a numbered list; string_match_all",
                    {{"freq_cw", "30", "repeats of each common word (6 below 4096 tokens)", {}},
                     {"freq_ucw", "3", "repeats of each uncommon word (1 below 4096 tokens)", {}},
                     {"num_cw", "10", "common words", {}},
                     {"num_fewshot", "1", "worked examples before the list", {}}});
  t.make = [](const Options& o) {
    CweConfig c;
    c.common = read_ruler_common(o);
    const bool small = c.common.context_length < 4096;
    c.freq_cw = o.get_int("freq_cw", small ? 6 : 30, 2, 100000);
    c.freq_ucw = o.get_int("freq_ucw", small ? 1 : 3, 1, 100000);
    c.num_cw = o.get_int("num_cw", 10, 1, 1000);
    c.num_fewshot = o.get_int("num_fewshot", 1, 0, 16);
    KVB_USAGE_CHECK(c.freq_cw > c.freq_ucw) << "task ruler_cwe: freq_cw (" << c.freq_cw
                                            << ") must exceed freq_ucw (" << c.freq_ucw << ")";
    return make<CweConfig>("ruler_cwe", c, cwe_samples);
  };
  return t;
}

TaskInfo ruler_fwe_task_info() {
  TaskInfo t = info(
      "ruler_fwe",
      "RULER frequent words extraction: the three most frequent "
      "coded words of a Zipf-distributed text; string_match_all",
      {{"alpha", "2.0", "Zipf exponent (> 1)", {}},
       {"coded_wordlen", "6", "letters per coded word", {}},
       {"vocab_size", "-1", "coded words (-1 or 0: (context_length - 50) / 50, as RULER)", {}}});
  t.make = [](const Options& o) {
    FweConfig c;
    c.common = read_ruler_common(o);
    c.alpha = o.get_double("alpha", 2.0, 1.05, 8.0);
    c.coded_wordlen = o.get_int("coded_wordlen", 6, 3, 16);
    c.vocab_size = o.get_int("vocab_size", -1, -1, 1000000);
    return make<FweConfig>("ruler_fwe", c, fwe_samples);
  };
  return t;
}

}  // namespace kvb::tasks
