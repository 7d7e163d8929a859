// The `niah` task (TASKS.md "niah"; conventions in peers.md 2.2): a needle inserted at a depth of a
// haystack cut to a context length, over the grid context_lengths x depths x samples_per_cell.
// Insertion follows gkamradt/LLMTest_NeedleInAHaystack (back off to the previous '.'); scoring is
// word recall of the expected answer (KVCache-Factory's heatmap rescoring) and, for number needles,
// whether the number appears. No LLM judge.
#include <algorithm>
#include <climits>

#include "common/error.h"
#include "tasks/haystack.h"
#include "tasks/metrics.h"
#include "tasks/tasks.h"

namespace kvb::tasks {

namespace {

constexpr int kMaxNewTokens = 32;  // the longest answer (the default needle's) is ~15 tokens

struct Needle {
  std::string text;           // the sentence inserted into the haystack
  std::string question;       // asked after the haystack
  std::string answer_prefix;  // the start of the answer, so the model continues with the fact
  std::string answer;         // what recall is measured against
  std::string value;          // number needles: the number
};

Needle make_needle(const std::string& kind, Rng& rng) {
  Needle n;
  if (kind == "passkey") {  // longctx_bench's pass key, 5 to 7 digits
    n.value = random_number(rng, static_cast<int>(rng.range(5, 7)));
    n.text = "The pass key is " + n.value + ". Remember it. " + n.value + " is the pass key.";
    n.question = "What is the pass key?";
    n.answer_prefix = "The pass key is";
    n.answer = n.value;
  } else if (kind == "magic_number") {  // RULER's needle with a word key and a 7-digit value
    const std::string word = random_word(rng);
    n.value = random_number(rng, 7);
    n.text = "One of the special magic numbers for " + word + " is: " + n.value + ".";
    n.question =
        "What is the special magic number for " + word + " mentioned in the provided text?";
    n.answer_prefix = "The special magic number for " + word + " mentioned in the provided text is";
    n.answer = n.value;
  } else {  // gkamradt's needle; the answer prefix leaves the fact itself to the model
    n.text =
        "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a "
        "sunny day.";
    n.question = "What is the best thing to do in San Francisco?";
    n.answer_prefix = "The best thing to do in San Francisco is";
    n.answer = "eat a sandwich and sit in Dolores Park on a sunny day.";
  }
  return n;
}

// The number appears in the prediction with no digit right before or after it.
bool number_appears(const std::string& prediction, const std::string& number) {
  if (number.empty()) return false;
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  for (size_t p = prediction.find(number); p != std::string::npos;
       p = prediction.find(number, p + 1)) {
    const size_t end = p + number.size();
    if ((p == 0 || !digit(prediction[p - 1])) &&
        (end >= prediction.size() || !digit(prediction[end])))
      return true;
  }
  return false;
}

PromptParts parts_of(const Sample& s) { return {s.context, s.question, s.answer_prefix}; }

class NiahTask : public Task {
 public:
  explicit NiahTask(const Options& o) {
    lengths_ = o.get_int_list("context_lengths", {1024, 2048, 4096}, 64, 1 << 22);
    depths_ = o.get_int_list("depths", {0, 25, 50, 75, 100}, 0, 100);
    source_.kind = o.get_string("haystack", "kjv", haystack_kinds());
    source_.dir = o.get_string("haystack_dir", "");
    source_.file = o.get_string("haystack_file", "");
    needle_ = o.get_string("needle", "default", {"default", "passkey", "magic_number"});
    samples_per_cell_ = o.get_int("samples_per_cell", 1, 1, 1000000);
    seed_ = o.get_int("seed", 42, 0, INT_MAX);
    limit_ = o.get_int("limit", 0, 0, INT_MAX);
    chat_ = o.get_bool("chat", true);
    check_haystack_source(source_);
  }

  std::string name() const override { return "niah"; }
  int version() const override { return 1; }
  std::vector<MetricInfo> metrics() const override {
    if (needle_ == "default") return {{"recall", true}};
    return {{"recall", true}, {"exact", true}};
  }

  std::vector<Sample> samples(const TaskContext& ctx) override {
    KVB_CHECK(ctx.count_tokens) << "task niah needs TaskContext.count_tokens";
    const std::string& text = haystack_text(source_);
    std::vector<Sample> out;
    for (int length : lengths_) {
      // Cuts depend on (start offset, token budget) only, not on the depth: cache them per length.
      std::map<std::pair<size_t, int>, std::string> cuts;
      for (int depth : depths_) {
        for (int s = 0; s < samples_per_cell_; ++s) {
          if (limit_ > 0 && static_cast<int>(out.size()) >= limit_) return out;
          Rng rng(seed_, mix_stream({length, depth, s}));
          const Needle needle = make_needle(needle_, rng);
          Sample smp;
          smp.id = "len" + std::to_string(length) + "_depth" + std::to_string(depth) + "_s" +
                   std::to_string(s);
          // The runner concatenates context and question tokens: the question brings its own
          // paragraph break. Without a chat template the answer prefix follows the question.
          smp.question = "\n\n" + needle.question;
          smp.answer_prefix = chat_ ? needle.answer_prefix : " " + needle.answer_prefix;
          smp.chat = chat_;
          // Budget: the context length minus question, answer prefix, chat markers and needle.
          const int fixed = prompt_tokens(ctx, {"", smp.question, smp.answer_prefix}, chat_) +
                            ctx.count_tokens(needle.text);
          const int budget = length - fixed;
          KVB_USAGE_CHECK(budget >= 1)
              << "task niah: context length " << length << " leaves no room for the haystack "
              << "(needle, question and template take " << fixed << " tokens)";
          // Sample 0 of a cell starts the haystack at its beginning (the NIAH convention); others
          // start at a sentence drawn from (seed, s), the same at every length and depth.
          size_t offset = 0;
          if (s > 0) {
            Rng start_rng(seed_, mix_stream({-1, s}));
            offset = sentence_start_at_or_after(text, start_rng.below(text.size()));
            if (offset >= text.size()) offset = 0;
          }
          // Token counts are not additive at the needle's joins (it may split a word such as
          // "end.Next"): count the whole prompt and cut again with the excess removed.
          for (int cut_budget = budget;;) {
            auto key = std::make_pair(offset, cut_budget);
            auto it = cuts.find(key);
            if (it == cuts.end()) {
              it =
                  cuts.emplace(key, cut_to_token_budget(text, offset, cut_budget, ctx.count_tokens))
                      .first;
            }
            smp.context = insert_at_depth(it->second, needle.text, depth).text;
            const int excess = prompt_tokens(ctx, parts_of(smp), chat_) - length;
            if (excess <= 0 || cut_budget <= 1) break;
            cut_budget = std::max(1, cut_budget - excess);
          }
          smp.max_new_tokens = kMaxNewTokens;
          smp.references = {needle.answer};
          smp.fields["context_length"] = std::to_string(length);
          smp.fields["depth"] = std::to_string(depth);
          if (!needle.value.empty()) smp.fields["needle_value"] = needle.value;
          out.push_back(std::move(smp));
        }
      }
    }
    return out;
  }

  Scores score(const Sample& sample, const Prediction& prediction) const override {
    KVB_CHECK(!sample.references.empty()) << "niah sample " << sample.id << " has no reference";
    Scores s;
    s["recall"] = metrics::niah_recall(prediction.text, sample.references[0]);
    if (needle_ != "default") {
      auto it = sample.fields.find("needle_value");
      const std::string value = it == sample.fields.end() ? "" : it->second;
      s["exact"] = number_appears(prediction.text, value) ? 1.0 : 0.0;
    }
    return s;
  }

 private:
  std::vector<int> lengths_, depths_;
  HaystackSource source_;
  std::string needle_;
  int samples_per_cell_ = 1, seed_ = 42, limit_ = 0;
  bool chat_ = true;
};

}  // namespace

TaskInfo niah_task_info() {
  TaskInfo info;
  info.name = "niah";
  info.description =
      "needle in a haystack: a needle at a depth of a haystack cut to a context length; grid "
      "context_lengths x depths x samples_per_cell; recall (and exact for number needles)";
  info.params = {
      {"context_lengths",
       "1024,2048,4096",
       "prompt lengths in tokens (haystack + needle + question + template; 32 tokens are "
       "reserved for chat markers)",
       {}},
      {"depths", "0,25,50,75,100", "needle depths in percent of the haystack's characters", {}},
      {"haystack", "kjv", "haystack text", haystack_kinds()},
      {"haystack_dir",
       "",
       "haystack=essays: a directory of .txt files (e.g. Paul Graham essays)",
       {}},
      {"haystack_file", "", "haystack=file: any text file", {}},
      {"needle",
       "default",
       "default: the San Francisco sandwich; passkey: 5-7 digits; magic_number: RULER's "
       "word -> 7-digit number",
       {"default", "passkey", "magic_number"}},
      {"samples_per_cell",
       "1",
       "samples per (length, depth); sample s > 0 starts the haystack "
       "at a sentence drawn from the seed",
       {}},
      {"seed", "42", "seed of needles and haystack offsets", {}},
      {"limit", "0", "at most this many samples, in grid order (0: all)", {}},
      {"chat", "true", "wrap the prompt in the model's chat template", {}},
  };
  info.make = [](const Options& o) -> std::unique_ptr<Task> {
    return std::make_unique<NiahTask>(o);
  };
  return info;
}

}  // namespace kvb::tasks
