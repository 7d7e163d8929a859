// RULER's needle-in-a-haystack family (NVIDIA/RULER scripts/data/synthetic/niah.py, templates in
// data/synthetic/constants.py, variants in scripts/synthetic.yaml; peers.md 2.3): key -> value
// needles "One of the special magic {values} for {key} is: {value}." in a noise, prose or
// distractor-needle haystack; the model names every value of the queried keys. Tasks
// ruler_niah_single / _multikey / _multivalue / _multiquery differ in their default knobs.
#include <algorithm>
#include <cmath>
#include <set>

#include "common/error.h"
#include "tasks/haystack.h"
#include "tasks/tasks.h"

namespace kvb::tasks {

namespace {

constexpr int kMaxNewTokens = 128;  // RULER's tokens_to_generate for niah

struct NiahConfig {
  RulerCommon common;
  HaystackSource source;             // kind: noise | needle | kjv | essays | file
  std::string key_type, value_type;  // words | numbers | uuids
  int num_needle_k = 1, num_needle_v = 1, num_needle_q = 1;
};

// RULER's needle depths: round(linspace(0, 100, 40)).
std::vector<int> ruler_depths() {
  std::vector<int> d;
  for (int i = 0; i < 40; ++i) d.push_back(static_cast<int>(std::lround(i * 100.0 / 39.0)));
  return d;
}

std::string random_of(const std::string& type, Rng& rng) {
  if (type == "numbers") return random_number(rng, 7);
  if (type == "uuids") return random_uuid(rng);
  return random_word(rng);
}

std::string needle_text(const std::string& value_type, const std::string& key,
                        const std::string& value) {
  return "One of the special magic " + value_type + " for " + key + " is: " + value + ".";
}

// The first n words of the prose source (repeated when it runs out), with the needles between
// sentences at depths drawn from RULER's 40 depths.
std::string prose_with_needles(const NiahConfig& c, int64_t n,
                               const std::vector<std::string>& needles, Rng& rng) {
  const std::vector<std::string>& words = haystack_words(c.source);
  KVB_CHECK(!words.empty()) << "empty haystack";
  std::string text;
  for (int64_t j = 0; j < n; ++j) {
    if (j) text += ' ';
    text += words[static_cast<size_t>(j) % words.size()];
  }
  const std::vector<std::string> sents = split_sentences(text);
  static const std::vector<int> depths = ruler_depths();
  const int64_t m = static_cast<int64_t>(needles.size());
  std::vector<int64_t> pos;
  if (m <= static_cast<int64_t>(depths.size())) {
    for (int64_t d : rng.sample(static_cast<int64_t>(depths.size()), m)) {
      pos.push_back(static_cast<int64_t>(sents.size() * (depths[d] / 100.0)));
    }
  } else {  // more needles than depths: RULER would fail; draw depths with replacement
    for (int64_t k = 0; k < m; ++k) {
      pos.push_back(
          static_cast<int64_t>(sents.size() * (depths[rng.below(depths.size())] / 100.0)));
    }
  }
  std::sort(pos.begin(), pos.end());
  std::string out;
  auto add = [&](const std::string& piece) {
    if (piece.empty()) return;
    if (!out.empty()) out += ' ';
    out += piece;
  };
  int64_t last = 0;
  for (int64_t k = 0; k <= m; ++k) {
    const int64_t next = k < m ? pos[k] : static_cast<int64_t>(sents.size());
    for (int64_t s = last; s < next; ++s) add(sents[s]);
    if (k < m) add(needles[k]);
    last = next;
  }
  return out;
}

Generated build_niah(const NiahConfig& c, int index, int64_t n) {
  Rng rng(c.common.seed, mix_stream({index}));
  std::set<std::string> used;  // keys and values are unique, so each query has one answer set
  auto fresh = [&](const std::string& type) {
    for (;;) {
      std::string s = random_of(type, rng);
      if (used.insert(s).second) return s;
    }
  };
  const int num_k = std::max(c.num_needle_k, c.num_needle_q);  // RULER: k = max(k, q)
  std::vector<std::string> keys;
  std::vector<std::vector<std::string>> values(num_k);
  std::vector<std::string> needles;
  for (int k = 0; k < num_k; ++k) {
    keys.push_back(fresh(c.key_type));
    for (int v = 0; v < c.num_needle_v; ++v) {
      values[k].push_back(fresh(c.value_type));
      needles.push_back(needle_text(c.value_type, keys[k], values[k].back()));
    }
  }
  rng.shuffle(needles);
  Generated g;
  std::vector<std::string> queries;
  for (int64_t k : rng.sample(num_k, c.num_needle_q)) {
    queries.push_back(keys[k]);
    for (const auto& v : values[k]) g.answers.push_back(v);
  }
  std::string query = queries.back();
  if (queries.size() > 1) {  // "a, b, and c"
    std::string head;
    for (size_t i = 0; i + 1 < queries.size(); ++i) head += (i ? ", " : "") + queries[i];
    query = head + ", and " + queries.back();
  }

  std::string haystack;
  const std::string& kind = c.source.kind;
  if (kind == "noise" || kind == "needle") {
    std::vector<std::string> lines;
    for (int64_t j = 0; j < n; ++j) {
      if (kind == "noise") {
        lines.push_back(kNoiseFiller);
      } else {  // multikey_2/3: distractor needles with keys and values of their own
        const std::string key = fresh(c.key_type);
        lines.push_back(needle_text(c.value_type, key, fresh(c.value_type)));
      }
    }
    std::vector<int64_t> at = rng.sample(n, static_cast<int64_t>(needles.size()));
    std::sort(at.rbegin(), at.rend());
    for (size_t k = 0; k < at.size(); ++k) lines.insert(lines.begin() + at[k], needles[k]);
    for (size_t j = 0; j < lines.size(); ++j) haystack += (j ? "\n" : "") + lines[j];
  } else {
    haystack = prose_with_needles(c, n, needles, rng);
  }

  // RULER writes the plural template and turns it singular when one value is asked for.
  const bool one = c.num_needle_q * c.num_needle_v == 1;
  const std::string type = one ? c.value_type.substr(0, c.value_type.size() - 1) : c.value_type;
  g.parts.context = std::string(one ? "A" : "Some") + " special magic " + type +
                    (one ? " is" : " are") +
                    " hidden within the following text. Make sure to memorize it. I will quiz you "
                    "about the " +
                    type + " afterwards.\n" + haystack;
  g.parts.question = std::string("\nWhat ") + (one ? "is" : "are all") + " the special magic " +
                     type + " for " + query + " mentioned in the provided text?";
  g.parts.answer_prefix = "The special magic " + type + " for " + query +
                          " mentioned in the provided text " + (one ? "is" : "are");
  return g;
}

struct Defaults {
  const char* haystack;
  int k, v, q;
};

TaskInfo niah_info(const std::string& name, const std::string& what, Defaults d) {
  const std::vector<std::string> kinds = {"noise", "needle", "kjv", "essays", "file"};
  const std::vector<std::string> types = {"words", "numbers", "uuids"};
  TaskInfo info;
  info.name = name;
  info.description = "RULER " + what + "; string_match_all";
  info.params = ruler_common_params();
  const std::vector<ParamDoc> own = {
      {"haystack", d.haystack,
       "noise: RULER's repeated filler; needle: distractor needles; kjv/essays/file: prose "
       "(RULER's essay haystack; kjv stands in where RULER uses the Paul Graham essays)",
       kinds},
      {"haystack_dir", "", "haystack=essays: a directory of .txt files", {}},
      {"haystack_file", "", "haystack=file: any text file", {}},
      {"key_type", "words", "needle keys", types},
      {"value_type", "numbers", "needle values", types},
      {"num_needle_k", std::to_string(d.k), "keys inserted (at least num_needle_q)", {}},
      {"num_needle_v", std::to_string(d.v), "values per key", {}},
      {"num_needle_q", std::to_string(d.q), "keys queried", {}},
  };
  info.params.insert(info.params.end(), own.begin(), own.end());
  info.make = [name, d, kinds, types](const Options& o) -> std::unique_ptr<Task> {
    NiahConfig c;
    c.common = read_ruler_common(o);
    c.source.kind = o.get_string("haystack", d.haystack, kinds);
    c.source.dir = o.get_string("haystack_dir", "");
    c.source.file = o.get_string("haystack_file", "");
    c.key_type = o.get_string("key_type", "words", types);
    c.value_type = o.get_string("value_type", "numbers", types);
    c.num_needle_k = o.get_int("num_needle_k", d.k, 1, 64);
    c.num_needle_v = o.get_int("num_needle_v", d.v, 1, 64);
    c.num_needle_q = o.get_int("num_needle_q", d.q, 1, 64);
    if (c.source.kind != "needle") check_haystack_source(c.source);
    const bool lines = c.source.kind == "noise" || c.source.kind == "needle";
    // Line haystacks need a line per needle; prose needs a word.
    const int64_t lo =
        lines ? static_cast<int64_t>(std::max(c.num_needle_k, c.num_needle_q)) * c.num_needle_v : 1;
    return std::make_unique<StringMatchTask>(name, 1, [c, name, lo](const TaskContext& ctx) {
      return ruler_samples(ctx, c.common, name, kMaxNewTokens, lo,
                           [&c](int i, int64_t n) { return build_niah(c, i, n); });
    });
  };
  return info;
}

}  // namespace

// Defaults are RULER's first variant of each (synthetic.yaml); kjv replaces the essay haystack.
TaskInfo ruler_niah_single_task_info() {
  return niah_info("ruler_niah_single", "single needle (niah_single_1: noise, word -> number)",
                   {"noise", 1, 1, 1});
}
TaskInfo ruler_niah_multikey_task_info() {
  return niah_info("ruler_niah_multikey",
                   "multi-key needles (niah_multikey_1: 4 keys, one queried; haystack=needle "
                   "gives multikey_2/3)",
                   {"kjv", 4, 1, 1});
}
TaskInfo ruler_niah_multivalue_task_info() {
  return niah_info("ruler_niah_multivalue", "multi-value needles (niah_multivalue: 4 values)",
                   {"kjv", 1, 4, 1});
}
TaskInfo ruler_niah_multiquery_task_info() {
  return niah_info("ruler_niah_multiquery", "multi-query needles (niah_multiquery: 4 keys asked)",
                   {"kjv", 1, 1, 4});
}

}  // namespace kvb::tasks
