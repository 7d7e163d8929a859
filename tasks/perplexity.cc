// `perplexity`: streaming language modelling (TASKS.md "perplexity"): one text file fed
// teacher-forced token by token through the policy, up to max_tokens. ppl = exp(mean NLL) over all
// predicted tokens and per position range [a, b) (Scissorhands reports 256-512, 512-1024, ...);
// the position of token_nll[t] is t + 1, the token it predicts. nll_sum_* and tokens_* ride along
// so that aggregate() over several samples weights by tokens instead of averaging perplexities.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/error.h"
#include "tasks/jsonl.h"
#include "tasks/tasks.h"

namespace kvb::tasks {

namespace {

struct Range {
  int begin, end;  // positions [begin, end)
  std::string suffix() const { return std::to_string(begin) + "_" + std::to_string(end); }
};

std::vector<Range> parse_ranges(const std::string& s) {
  std::vector<Range> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    const std::string item = s.substr(start, comma - start);
    const size_t dash = item.find('-');
    char* e1 = nullptr;
    char* e2 = nullptr;
    long a = -1, b = -1;
    if (dash != std::string::npos && dash > 0 && dash + 1 < item.size()) {
      const std::string as = item.substr(0, dash), bs = item.substr(dash + 1);
      a = std::strtol(as.c_str(), &e1, 10);
      b = std::strtol(bs.c_str(), &e2, 10);
      if (*e1 != '\0' || *e2 != '\0') a = b = -1;
    }
    KVB_USAGE_CHECK(a >= 0 && b > a && b <= (1L << 30))
        << "task option ranges=" << s << ": '" << item
        << "' is not a position range a-b with 0 <= a < b (e.g. 0-256,256-512)";
    out.push_back({static_cast<int>(a), static_cast<int>(b)});
    start = comma + 1;
  }
  return out;
}

class PerplexityTask : public Task {
 public:
  explicit PerplexityTask(const Options& o) {
    file_ = o.get_string("file", "");
    KVB_USAGE_CHECK(!file_.empty())
        << "task perplexity needs --task-opt file=PATH (a text file; WikiText-2 is in "
           "shared/data/wikitext-2/test.txt)";
    max_tokens_ = o.get_int("max_tokens", 2048, 2, 1 << 30);
    ranges_ = parse_ranges(o.get_string("ranges", "0-256,256-512,512-1024,1024-2048"));
    segments_ = o.get_int("segments", 1, 1, 100000);
  }

  std::string name() const override { return "perplexity"; }
  int version() const override { return 1; }
  std::vector<MetricInfo> metrics() const override {
    std::vector<MetricInfo> m = {{"ppl", false}};
    for (const Range& r : ranges_) m.push_back({"ppl_" + r.suffix(), false});
    m.push_back({"nll_sum", false});
    m.push_back({"tokens", true});
    for (const Range& r : ranges_) {
      m.push_back({"nll_sum_" + r.suffix(), false});
      m.push_back({"tokens_" + r.suffix(), true});
    }
    return m;
  }

  // One sample, the file's first max_tokens tokens; with segments: N, N samples: consecutive
  // disjoint pieces of the file, each starting at a line and holding max_tokens tokens (each the
  // shortest prefix of the rest that holds them, as enough_text cuts), ids "ppl-FILE#k".
  std::vector<Sample> samples(const TaskContext& ctx) override {
    std::string text = read_text_file(file_, "file",
                                      "WikiText-2 (tokenized, as PyTorch's word_language_model "
                                      "example) is in shared/data/wikitext-2/; any UTF-8 text "
                                      "file works",
                                      size_t{1} << 30);
    KVB_USAGE_CHECK(!text.empty()) << "task perplexity: " << file_ << " is empty";
    const std::string base = "ppl-" + std::filesystem::path(file_).filename().string();
    auto sample = [&](std::string piece, const std::string& id) {
      Sample s;
      s.text = std::move(piece);
      s.id = id;
      s.kind = SampleKind::kPerplexity;
      s.chat = false;
      s.max_tokens = max_tokens_;
      s.max_new_tokens = 0;
      s.fields["file"] = std::filesystem::path(file_).filename().string();
      s.fields["max_tokens"] = std::to_string(max_tokens_);
      return s;
    };
    if (segments_ == 1) return {sample(ctx.count_tokens ? enough_text(text, ctx) : text, base)};
    KVB_USAGE_CHECK(static_cast<bool>(ctx.count_tokens))
        << "task perplexity: segments=" << segments_ << " needs the model's tokenizer to cut "
        << file_ << " (run it in a sweep, eval or generate with a model)";
    std::vector<Sample> out;
    size_t start = 0;
    for (int k = 0; k < segments_; ++k) {
      while (start < text.size() && (text[start] == '\n' || text[start] == ' ')) ++start;
      const std::string rest = text.substr(start);
      const std::string piece = enough_text(rest, ctx);
      KVB_USAGE_CHECK(!rest.empty() &&
                      ctx.count_tokens(piece) >= max_tokens_ + 1)
          << "task perplexity: " << file_ << " holds " << k << " segments of max_tokens="
          << max_tokens_ << " tokens, not segments=" << segments_
          << "; lower segments or max_tokens, or give a longer file";
      out.push_back(sample(piece, base + "#" + std::to_string(k)));
      start += piece.size();
    }
    return out;
  }

  Scores score(const Sample&, const Prediction& p) const override {
    Scores s;
    double sum = 0;
    for (double v : p.token_nll) sum += v;
    s["nll_sum"] = sum;
    s["tokens"] = static_cast<double>(p.token_nll.size());
    for (const Range& r : ranges_) {
      double rs = 0;
      int n = 0;
      // token_nll[t] predicts position t + 1: positions [begin, end) are t in [begin-1, end-1).
      for (int pos = std::max(1, r.begin);
           pos < r.end && pos <= static_cast<int>(p.token_nll.size()); ++pos) {
        rs += p.token_nll[pos - 1];
        ++n;
      }
      s["nll_sum_" + r.suffix()] = rs;
      s["tokens_" + r.suffix()] = n;
    }
    add_ppl(s);
    return s;
  }

  // Token-weighted over samples: ppl = exp(sum of NLL sums / sum of token counts), per range too;
  // the helper sums and counts are summed.
  Scores aggregate(const std::vector<Scores>& per_sample) const override {
    Scores out;
    for (const Scores& s : per_sample) {
      for (const auto& [k, v] : s) {
        if (k.rfind("nll_sum", 0) == 0 || k.rfind("tokens", 0) == 0) out[k] += v;
      }
    }
    add_ppl(out);
    return out;
  }

 private:
  // The shortest prefix ending at a line break that holds max_tokens plus a margin of tokens, so
  // each unit tokenizes kilobytes instead of the whole corpus (WikiText-2 test is 1.2 MB). The
  // first max_tokens tokens are unchanged: tokenizers split at whitespace, and the margin keeps the
  // cut's neighbourhood out of the scored tokens.
  std::string enough_text(const std::string& text, const TaskContext& ctx) const {
    const size_t want = static_cast<size_t>(max_tokens_) + 64;
    for (size_t bytes = std::max<size_t>(4096, want * 8); bytes < text.size(); bytes *= 2) {
      const size_t nl = text.find('\n', bytes);
      if (nl == std::string::npos) break;
      std::string prefix = text.substr(0, nl + 1);
      if (static_cast<size_t>(ctx.count_tokens(prefix)) >= want) return prefix;
    }
    return text;
  }

  // ppl and ppl_<range> from the sums and counts present; a range without tokens has no ppl.
  void add_ppl(Scores& s) const {
    auto put = [&](const std::string& ppl, const std::string& nll, const std::string& n) {
      auto tn = s.find(n);
      if (tn != s.end() && tn->second > 0) s[ppl] = std::exp(s[nll] / tn->second);
    };
    put("ppl", "nll_sum", "tokens");
    for (const Range& r : ranges_) {
      put("ppl_" + r.suffix(), "nll_sum_" + r.suffix(), "tokens_" + r.suffix());
    }
  }

  std::string file_;
  int max_tokens_ = 2048;
  int segments_ = 1;
  std::vector<Range> ranges_;
};

}  // namespace

TaskInfo perplexity_task_info() {
  return {"perplexity",
          "Streaming perplexity of a text file, fed token by token through the policy up to "
          "max_tokens; ppl = exp(mean NLL) overall and per position range [a, b) (position of a "
          "predicted token = its index in the text); token-weighted over samples.",
          {{"file", "", "text file (required), e.g. WikiText-2 test.txt", {}},
           {"max_tokens", "2048", "score at most this many tokens of the text", {}},
           {"ranges", "0-256,256-512,512-1024,1024-2048", "position ranges a-b for ppl_a_b", {}},
           {"segments", "1",
            "samples: N consecutive disjoint pieces of the file of max_tokens tokens each, ids "
            "ppl-FILE#k (paired comparisons need several samples); 1: the file's start alone",
            {}}},
          [](const Options& o) { return std::make_unique<PerplexityTask>(o); }};
}

}  // namespace kvb::tasks
