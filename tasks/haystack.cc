// Haystacks, needles, budget fitting and deterministic draws for the synthetic tasks (TASKS.md
// "niah", "RULER-style"; gkamradt's insertion rule; RULER's needle parts). See haystack.h.
#include "tasks/haystack.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_set>

#include "common/error.h"
#include "common/file_io.h"
#include "tasks/metrics.h"

namespace kvb::tasks {

namespace {

uint64_t splitmix64(uint64_t x) {  // splitmix64's finalizer (Steele, Lea, Flood 2014)
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
bool is_sentence_end(char c) { return c == '.' || c == '!' || c == '?'; }

// `bible` prints "Book N" headers between blank lines and verses as "  V text" with wrapped
// continuation lines; keep the verse text only.
std::string read_kjv() {
  FILE* pipe = popen("bible \"Gen1:1-Rev22:21\" 2>/dev/null", "r");
  KVB_USAGE_CHECK(pipe != nullptr) << "cannot run `bible` for the kjv haystack; install bible-kjv: "
                                      "bash scripts/setup.sh";
  std::string raw;
  char buf[1 << 16];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) raw.append(buf, n);
  const int status = pclose(pipe);
  KVB_USAGE_CHECK(status == 0 && raw.size() > 1000000)
      << "the kjv haystack needs Debian's `bible` command (`bible \"Gen1:1-Rev22:21\"` exited with "
         "status "
      << status << " after " << raw.size()
      << " bytes); install bible-kjv: bash "
         "scripts/setup.sh";
  std::string out;
  out.reserve(raw.size());
  std::istringstream in(raw);
  std::string line;
  bool after_blank = true;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      after_blank = true;
      continue;
    }
    const bool indented = is_space(line[0]);
    if (after_blank && !indented) {  // "Genesis 1", "Song of Solomon 2": a header
      after_blank = false;
      continue;
    }
    after_blank = false;
    size_t i = 0;
    if (indented) {  // "  12 And ...": drop the verse number
      while (i < line.size() && is_space(line[i])) ++i;
      while (i < line.size() && std::isdigit(static_cast<unsigned char>(line[i]))) ++i;
    }
    while (i < line.size() && is_space(line[i])) ++i;
    size_t end = line.size();
    while (end > i && is_space(line[end - 1])) --end;
    if (end <= i) continue;
    if (!out.empty()) out += ' ';
    out.append(line, i, end - i);
  }
  return out;
}

std::string read_file_text(const std::string& path) {
  // Before the open: a FIFO would block it forever, a device (/dev/zero) never end.
  require_regular_file(path, "haystack file", "give a text file");
  std::ifstream in(path, std::ios::binary);
  KVB_USAGE_CHECK(in.good()) << "cannot read haystack file '" << path << "'";
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string read_essays(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  KVB_USAGE_CHECK(!files.empty()) << "haystack_dir '" << dir << "' holds no .txt files";
  std::string out;
  for (const auto& f : files) out += read_file_text(f.string());
  return out;
}

std::string source_key(const HaystackSource& s) {
  return s.kind + '\n' + (s.kind == "essays" ? s.dir : s.kind == "file" ? s.file : "");
}

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}

// Lists written out once; word_base() and friends drop any word contained in another.
const char* const kAdjectives[] = {
    "able",   "ancient",  "angry",  "brave",  "bright",  "broad",  "busy",   "calm",   "careful",
    "cheap",  "chilly",   "clever", "cloudy", "curly",   "damp",   "dark",   "deep",   "dizzy",
    "dusty",  "eager",    "early",  "empty",  "fancy",   "fierce", "flat",   "fluffy", "foggy",
    "fresh",  "friendly", "frozen", "gentle", "giant",   "glossy", "golden", "grumpy", "happy",
    "harsh",  "heavy",    "hollow", "honest", "humble",  "hungry", "icy",    "jolly",  "juicy",
    "kind",   "lazy",     "lively", "lonely", "loud",    "lucky",  "magic",  "mellow", "messy",
    "mighty", "modern",   "muddy",  "narrow", "nervous", "noble",  "noisy",  "odd",    "orange",
    "plain",  "polite",   "proud",  "purple", "quick",   "quiet",  "rapid",  "rare",   "rich",
    "rough",  "round",    "royal",  "rusty",  "sacred",  "salty",  "scary",  "sharp",  "shiny",
    "silent", "silly",    "silver", "simple", "sleepy",  "slow",   "smooth", "soft",   "solid",
    "sour",   "spicy",    "steep",  "sticky", "stormy",  "strict", "sturdy", "sunny",  "sweet",
    "swift",  "tall",     "tame",   "tender", "thick",   "tidy",   "tiny",   "tough",  "urban",
    "vast",   "violet",   "vivid",  "warm",   "weary",   "wicked", "wide",   "wild",   "windy",
    "wise",   "witty",    "young",
};
const char* const kNouns[] = {
    "acorn",   "anchor",  "apple",    "arrow",   "badge",   "bakery",   "balloon",   "banjo",
    "barrel",  "basket",  "beacon",   "bicycle", "blanket", "bottle",   "bridge",    "bucket",
    "button",  "cabin",   "cactus",   "camera",  "candle",  "canyon",   "carpet",    "castle",
    "cherry",  "chimney", "circus",   "cliff",   "clock",   "cobra",    "comet",     "compass",
    "cookie",  "copper",  "cottage",  "crayon",  "crystal", "cushion",  "dagger",    "desert",
    "diamond", "dolphin", "donkey",   "dragon",  "drum",    "eagle",    "elbow",     "engine",
    "falcon",  "feather", "fiddle",   "forest",  "fossil",  "fountain", "garden",    "geyser",
    "ginger",  "glacier", "goblet",   "gravel",  "guitar",  "hammer",   "harbor",    "helmet",
    "hermit",  "honey",   "island",   "jacket",  "jungle",  "kettle",   "kitten",    "ladder",
    "lantern", "lemon",   "lizard",   "lobster", "magnet",  "mango",    "marble",    "meadow",
    "mirror",  "monkey",  "mountain", "muffin",  "needle",  "nickel",   "noodle",    "ocean",
    "orchard", "otter",   "oyster",   "paddle",  "palace",  "panther",  "parrot",    "pebble",
    "pelican", "pepper",  "piano",    "pillow",  "pirate",  "planet",   "pocket",    "potato",
    "puzzle",  "pyramid", "quilt",    "rabbit",  "raccoon", "radish",   "record",    "ribbon",
    "river",   "rocket",  "saddle",   "sailor",  "salmon",  "sandal",   "satellite", "scarf",
    "shovel",  "skillet", "sparrow",  "spider",  "sponge",  "squirrel", "statue",    "stone",
    "sugar",   "summit",  "teapot",   "temple",  "thimble", "thunder",  "tiger",     "tomato",
    "tractor", "trumpet", "tulip",    "tunnel",  "turtle",  "umbrella", "valley",    "velvet",
    "violin",  "volcano", "wagon",    "walrus",  "whistle", "willow",   "window",    "wizard",
    "zebra",
};
const char* const kVerbs[] = {
    "admire",  "borrow", "breathe",  "build",   "carry",   "chase",   "climb",    "collect",
    "cook",    "crawl",  "dance",    "deliver", "dig",     "dream",   "drift",    "explore",
    "fetch",   "float",  "fold",     "gather",  "giggle",  "glide",   "grow",     "guess",
    "hike",    "hurry",  "imagine",  "juggle",  "jump",    "knit",    "laugh",    "listen",
    "march",   "melt",   "mumble",   "observe", "paint",   "polish",  "ponder",   "pour",
    "promise", "pull",   "question", "relax",   "rescue",  "ride",    "scribble", "search",
    "shiver",  "sing",   "sketch",   "sneeze",  "splash",  "stretch", "stumble",  "swim",
    "teach",   "travel", "tumble",   "wander",  "whisper", "wiggle",  "wonder",   "yawn",
};

// Drops words contained in another word of the same set (e.g. "art" in "party").
std::vector<std::string> substring_free(std::vector<std::string> words) {
  std::sort(words.begin(), words.end());
  words.erase(std::unique(words.begin(), words.end()), words.end());
  std::vector<std::string> out;
  for (const auto& w : words) {
    bool inside = false;
    for (const auto& o : words) inside = inside || (o != w && o.find(w) != std::string::npos);
    if (!inside) out.push_back(w);
  }
  return out;
}

template <size_t N>
std::vector<std::string> list_of(const char* const (&a)[N]) {
  return std::vector<std::string>(a, a + N);
}

}  // namespace

// ---- Rng ----------------------------------------------------------------------------------------
Rng::Rng(uint64_t seed, uint64_t stream) : state_(splitmix64(splitmix64(seed) ^ stream)) {}

uint64_t Rng::next() {
  state_ += 0x9E3779B97F4A7C15ull;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t Rng::below(uint64_t n) {
  KVB_ASSERT(n > 0);
  const uint64_t threshold = (0 - n) % n;  // 2^64 mod n: reject the short last bucket
  for (;;) {
    const uint64_t r = next();
    if (r >= threshold) return r % n;
  }
}

int64_t Rng::range(int64_t lo, int64_t hi) {
  KVB_ASSERT(lo <= hi);
  return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo) + 1));
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

std::vector<int64_t> Rng::sample(int64_t n, int64_t k) {
  KVB_ASSERT(k >= 0 && k <= n);
  std::vector<int64_t> out;
  out.reserve(k);
  if (n <= 4 * k || n <= 4096) {  // partial Fisher-Yates over [0, n)
    std::vector<int64_t> all(n);
    for (int64_t i = 0; i < n; ++i) all[i] = i;
    for (int64_t i = 0; i < k; ++i) {
      std::swap(all[i], all[i + static_cast<int64_t>(below(n - i))]);
      out.push_back(all[i]);
    }
    return out;
  }
  std::unordered_set<int64_t> seen;  // sparse: rejection of repeats
  while (static_cast<int64_t>(out.size()) < k) {
    const int64_t v = static_cast<int64_t>(below(n));
    if (seen.insert(v).second) out.push_back(v);
  }
  return out;
}

uint64_t mix_stream(std::initializer_list<int64_t> parts) {
  uint64_t h = 0x6b76626e696168ull;  // "kvbniah"
  for (int64_t p : parts) h = splitmix64(h ^ static_cast<uint64_t>(p));
  return h;
}

// ---- sources ------------------------------------------------------------------------------------
const std::vector<std::string>& haystack_kinds() {
  static const std::vector<std::string> kinds = {"kjv", "essays", "noise", "file"};
  return kinds;
}

void check_haystack_source(const HaystackSource& s) {
  namespace fs = std::filesystem;
  if (s.kind == "essays") {
    KVB_USAGE_CHECK(!s.dir.empty())
        << "haystack=essays needs haystack_dir=<a directory of .txt files> (e.g. the Paul Graham "
           "essays)";
    KVB_USAGE_CHECK(fs::is_directory(s.dir))
        << "haystack_dir '" << s.dir
        << "' is not a directory (haystack=essays reads its .txt "
           "files)";
  } else if (s.kind == "file") {
    KVB_USAGE_CHECK(!s.file.empty()) << "haystack=file needs haystack_file=<a text file>";
    require_regular_file(s.file, "haystack_file", "give a text file");
    KVB_USAGE_CHECK(fs::is_regular_file(s.file))
        << "haystack_file '" << s.file << "' does not exist or is not a file";
  } else {
    KVB_USAGE_CHECK(s.kind == "kjv" || s.kind == "noise")
        << "unknown haystack '" << s.kind << "'; choose one of: kjv, essays, noise, file";
  }
}

const std::string& haystack_text(const HaystackSource& s) {
  static std::map<std::string, std::unique_ptr<const std::string>> cache;
  check_haystack_source(s);
  const std::string key = source_key(s);
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  std::string text = s.kind == "kjv"      ? read_kjv()
                     : s.kind == "essays" ? read_essays(s.dir)
                     : s.kind == "file"   ? read_file_text(s.file)
                                          : std::string(kNoiseFiller);
  KVB_USAGE_CHECK(text.find_first_not_of(" \t\r\n") != std::string::npos)
      << "haystack " << s.kind << " " << (s.kind == "essays" ? s.dir : s.file) << " is empty";
  return *cache.emplace(key, std::make_unique<const std::string>(std::move(text))).first->second;
}

const std::vector<std::string>& haystack_words(const HaystackSource& s) {
  static std::map<std::string, std::unique_ptr<const std::vector<std::string>>> cache;
  const std::string& text = haystack_text(s);
  std::lock_guard<std::mutex> lock(cache_mutex());
  const std::string key = source_key(s);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  std::vector<std::string> words;
  std::istringstream in(text);
  std::string w;
  while (in >> w) words.push_back(std::move(w));
  return *cache.emplace(key, std::make_unique<const std::vector<std::string>>(std::move(words)))
              .first->second;
}

// ---- cutting and insertion ----------------------------------------------------------------------
int64_t fit_largest(int64_t lo, int64_t hi, int64_t guess,
                    const std::function<bool(int64_t)>& fits) {
  if (hi < lo || !fits(lo)) return lo - 1;
  int64_t good = lo, bad = hi + 1;  // fits(good) and !fits(bad); bad = hi + 1: none failed yet
  guess = std::clamp(guess, lo, hi);
  int64_t step = std::max<int64_t>(1, guess / 32);  // a guess is usually within a few percent
  if (guess > lo) {
    if (fits(guess)) {
      good = guess;
    } else {  // gallop down from the guess
      bad = guess;
      for (int64_t probe = bad - step; probe > good; probe = bad - step) {
        if (fits(probe)) {
          good = probe;
          break;
        }
        bad = probe;
        step *= 2;
      }
    }
  }
  if (bad == hi + 1) {  // gallop up from good
    for (;;) {
      if (good >= hi) return hi;
      const int64_t probe = std::min(hi, good + step);
      if (!fits(probe)) {
        bad = probe;
        break;
      }
      good = probe;
      step *= 2;
    }
  }
  while (bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    (fits(mid) ? good : bad) = mid;
  }
  return good;
}

std::string cut_to_token_budget(const std::string& source, size_t offset, int budget,
                                const CountTokens& count_tokens) {
  KVB_CHECK(!source.empty()) << "empty haystack";
  KVB_CHECK(budget >= 1) << "haystack token budget " << budget;
  KVB_CHECK(count_tokens) << "the task needs TaskContext.count_tokens";
  std::string text = source.substr(offset % source.size());
  auto ensure = [&](size_t n) {
    while (text.size() < n) text.append(" ").append(source);
  };
  // Characters of the prefix of at most c characters that ends at a word end.
  auto prefix_len = [&](size_t c) {
    ensure(c + 1);
    while (c > 0 && !is_space(text[c])) --c;
    while (c > 0 && is_space(text[c - 1])) --c;
    return c;
  };
  const int64_t max_chars = static_cast<int64_t>(budget) * 64 + 1024;  // > any chars per token
  const int64_t best = fit_largest(0, max_chars, static_cast<int64_t>(budget) * 4, [&](int64_t c) {
    return count_tokens(text.substr(0, prefix_len(static_cast<size_t>(c)))) <= budget;
  });
  return text.substr(0, prefix_len(static_cast<size_t>(best)));
}

size_t sentence_start_at_or_after(const std::string& text, size_t pos) {
  if (pos == 0) return 0;
  for (size_t i = std::max<size_t>(pos, 1); i < text.size(); ++i) {
    if (is_sentence_end(text[i - 1]) && is_space(text[i])) {
      while (i < text.size() && is_space(text[i])) ++i;
      return i;
    }
  }
  return text.size();
}

Insertion insert_at_depth(const std::string& haystack, const std::string& needle,
                          double depth_percent) {
  const size_t n = haystack.size();
  size_t target = depth_percent >= 100.0 ? n : static_cast<size_t>(n * (depth_percent / 100.0));
  target = std::min(target, n);
  size_t pos = target;
  if (pos < n) {
    while (pos > 0 && haystack[pos - 1] != '.') --pos;  // gkamradt: back off to the previous '.'
  }
  std::string left = haystack.substr(0, pos), right = haystack.substr(pos);
  while (!left.empty() && is_space(left.back())) left.pop_back();
  size_t r = 0;
  while (r < right.size() && is_space(right[r])) ++r;
  right.erase(0, r);
  Insertion ins;
  ins.target = target;
  ins.text = left;
  if (!left.empty()) ins.text += ' ';
  ins.needle_pos = ins.text.size();
  ins.text += needle;
  if (!right.empty()) ins.text += ' ' + right;
  return ins;
}

std::vector<std::string> split_sentences(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  auto push = [&](size_t end) {
    size_t b = start, e = end;
    while (b < e && is_space(text[b])) ++b;
    while (e > b && is_space(text[e - 1])) --e;
    if (e > b) out.push_back(text.substr(b, e - b));
  };
  for (size_t i = 1; i < text.size(); ++i) {
    if (is_sentence_end(text[i - 1]) && is_space(text[i])) {
      push(i);
      start = i;
    }
  }
  push(text.size());
  return out;
}

// ---- needles ------------------------------------------------------------------------------------
const std::vector<std::string>& word_adjectives() {
  static const std::vector<std::string> w = substring_free(list_of(kAdjectives));
  return w;
}
const std::vector<std::string>& word_nouns() {
  static const std::vector<std::string> w = substring_free(list_of(kNouns));
  return w;
}
const std::vector<std::string>& word_base() {
  static const std::vector<std::string> w = [] {
    std::vector<std::string> all = list_of(kAdjectives);
    for (const auto& x : list_of(kNouns)) all.push_back(x);
    for (const auto& x : list_of(kVerbs)) all.push_back(x);
    return substring_free(std::move(all));
  }();
  return w;
}

std::string random_word(Rng& rng) {
  const auto& a = word_adjectives();
  const auto& n = word_nouns();
  const std::string& adj = a[rng.below(a.size())];
  return adj + "-" + n[rng.below(n.size())];
}

std::string random_number(Rng& rng, int digits) {
  KVB_ASSERT(digits >= 1 && digits <= 18);
  int64_t lo = 1;
  for (int i = 1; i < digits; ++i) lo *= 10;
  return std::to_string(rng.range(digits == 1 ? 0 : lo, lo * 10 - 1));
}

std::string random_uuid(Rng& rng) {
  uint64_t hi = rng.next(), lo = rng.next();
  hi = (hi & ~0xF000ull) | 0x4000ull;                  // version 4
  lo = (lo & ~(0xC000ull << 48)) | (0x8000ull << 48);  // variant 10xx
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%08llx-%04llx-%04llx-%04llx-%012llx",
                static_cast<unsigned long long>(hi >> 32),
                static_cast<unsigned long long>((hi >> 16) & 0xFFFF),
                static_cast<unsigned long long>(hi & 0xFFFF),
                static_cast<unsigned long long>(lo >> 48),
                static_cast<unsigned long long>(lo & 0xFFFFFFFFFFFFull));
  return buf;
}

// ---- task shell ---------------------------------------------------------------------------------
int prompt_tokens(const TaskContext& ctx, const PromptParts& p, bool chat) {
  KVB_CHECK(ctx.count_tokens) << "the task needs TaskContext.count_tokens";
  return ctx.count_tokens(p.context) + ctx.count_tokens(p.question) +
         ctx.count_tokens(p.answer_prefix) + (chat ? kChatReserveTokens : 0);
}

RulerCommon read_ruler_common(const Options& o) {
  RulerCommon c;
  c.context_length = o.get_int("context_length", 4096, 64, 1 << 22);
  c.num_samples = o.get_int("num_samples", 10, 1, 1000000);
  c.seed = o.get_int("seed", 42, 0, INT_MAX);
  c.limit = o.get_int("limit", 0, 0, INT_MAX);
  c.chat = o.get_bool("chat", true);
  return c;
}

std::vector<ParamDoc> ruler_common_params() {
  return {
      {"context_length",
       "4096",
       "tokens of prompt + max_new_tokens (+32 reserved for chat markers), as RULER's "
       "max_seq_length",
       {}},
      {"num_samples", "10", "samples to generate", {}},
      {"seed", "42", "seed of every random draw", {}},
      {"limit", "0", "at most this many samples (0: num_samples)", {}},
      {"chat", "true", "wrap the prompt in the model's chat template", {}},
  };
}

std::vector<Sample> ruler_samples(const TaskContext& ctx, const RulerCommon& c,
                                  const std::string& task, int max_new_tokens, int64_t lo,
                                  const std::function<Generated(int, int64_t)>& build,
                                  int64_t step) {
  KVB_CHECK(ctx.count_tokens) << "task " << task << " needs TaskContext.count_tokens";
  const int budget = c.context_length - max_new_tokens;
  const int count = c.limit > 0 ? std::min(c.limit, c.num_samples) : c.num_samples;
  std::vector<Sample> out;
  // First guess: tokens grow about linearly in n; two small prompts give the slope.
  int64_t guess = lo;
  if (count > 0) {
    const int t1 = prompt_tokens(ctx, build(0, lo).parts, c.chat);
    const int t2 = prompt_tokens(ctx, build(0, 2 * lo).parts, c.chat);
    if (t2 > t1 && budget > t1) guess = lo + (budget - t1) * lo / (t2 - t1);
  }
  for (int i = 0; i < count; ++i) {
    auto fits = [&](int64_t n) { return prompt_tokens(ctx, build(i, n).parts, c.chat) <= budget; };
    // Every unit of haystack costs at least a token, give or take a tokenizer's merges.
    int64_t n = 0;
    if (step > 0 && i > 0) {
      n = guess;  // sample 0's size, stepped down (RULER qa.py's generate_samples)
      while (n > lo && !fits(n)) n = std::max(lo, n - step);
      if (!fits(n)) n = lo - 1;
    } else {
      n = fit_largest(lo, 4 * static_cast<int64_t>(budget) + 1024, guess, fits);
    }
    if (n < lo) {
      KVB_USAGE_FAIL() << "task " << task << ": context_length " << c.context_length
                       << " is too small; the shortest prompt takes "
                       << prompt_tokens(ctx, build(i, lo).parts, c.chat) << " tokens and "
                       << max_new_tokens << " more are generated";
    }
    if (step == 0 || i == 0) guess = n;
    Generated g = build(i, n);
    Sample s;
    s.id = "len" + std::to_string(c.context_length) + "_" + std::to_string(i);
    s.context = std::move(g.parts.context);
    s.question = std::move(g.parts.question);
    // RULER's answer prefixes start with a space that separates them from the raw prompt; after a
    // chat template's assistant header they start the turn.
    s.answer_prefix = (c.chat ? "" : " ") + g.parts.answer_prefix;
    s.chat = c.chat;
    s.max_new_tokens = max_new_tokens;
    s.references = std::move(g.answers);
    s.fields["context_length"] = std::to_string(c.context_length);
    // The task group of RULER's own files run as ruler_jsonl_* (configs/tasks/); these built-ins
    // keep data_dir '' and so form their own group rows (results/groups.h).
    s.fields["task_group"] = "ruler";
    out.push_back(std::move(s));
  }
  return out;
}

Scores StringMatchTask::score(const Sample& sample, const Prediction& prediction) const {
  return {{metric_, metric_ == "string_match_part"
                        ? metrics::string_match_part(prediction.text, sample.references)
                        : metrics::string_match_all(prediction.text, sample.references)}};
}

}  // namespace kvb::tasks
