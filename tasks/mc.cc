// `mc`: lm-evaluation-harness style multiple choice (TASKS.md "mc"): each choice's continuation
// log-likelihood after the prompt, no chat template. format=plain reads `context` (or `question`),
// `choices`, `gold`, optional `fewshot` (a ready prefix, or a list of rendered examples joined by
// blank lines) and appends " " + choice (lm-eval's target delimiter) unless the choice already
// starts with whitespace. format=mmlu builds lm-eval's MMLU default prompt (mmlu/default/
// _default_template_yaml): "The following are multiple choice questions (with answers) about
// {subject}.\n\n", the subject's first num_fewshot dev items, then "{question}\nA. ..\nD. ..\n
// Answer:", scored as " A".." D". acc = argmax loglik is gold; acc_norm divides each loglik by the
// choice's UTF-8 byte length first (lm-eval's acc_norm). Both are fractions.
#include <algorithm>
#include <climits>
#include <map>

#include "common/error.h"
#include "tasks/jsonl.h"
#include "tasks/tasks.h"

namespace kvb::tasks {

namespace {

bool starts_with_space(const std::string& s) {
  return !s.empty() && (s[0] == ' ' || s[0] == '\n' || s[0] == '\t' || s[0] == '\r');
}

// lm-eval's doc_to_text for MMLU: question.strip(), lettered choices, "Answer:".
std::string mmlu_question(const JsonlItem& it, const std::vector<std::string>& choices) {
  std::string q = py_strip(it.str("question"));
  for (size_t i = 0; i < choices.size(); ++i) {
    q += '\n';
    q += static_cast<char>('A' + i);
    q += ". ";
    q += choices[i];
  }
  return q + "\nAnswer:";
}

int gold_of(const JsonlItem& it, size_t num_choices) {
  const int64_t g = it.integer("gold");
  if (g < 0 || g >= static_cast<int64_t>(num_choices)) {
    it.fail("key 'gold' is " + std::to_string(g) + ", not an index into the " +
            std::to_string(num_choices) + " choices");
  }
  return static_cast<int>(g);
}

std::vector<std::string> choices_of(const JsonlItem& it, size_t exactly) {
  std::vector<std::string> c = it.str_list("choices");
  if (c.size() < 2) it.fail("key 'choices' needs at least 2 choices");
  if (c.size() > 26) it.fail("key 'choices' has more than 26 choices");
  if (exactly && c.size() != exactly) {
    it.fail("key 'choices' has " + std::to_string(c.size()) + " choices; format=mmlu needs " +
            std::to_string(exactly));
  }
  return c;
}

class McTask : public Task {
 public:
  explicit McTask(const Options& o) {
    path_ = o.get_string("data", "");
    KVB_USAGE_CHECK(!path_.empty())
        << "task mc needs --task-opt data=FILE (jsonl with context or question, choices, gold; "
           "MMLU is in shared/data/mmlu/)";
    mmlu_ = o.get_string("format", "plain", {"plain", "mmlu"}) == "mmlu";
    limit_ = o.get_int("limit", 0, 0, INT_MAX);
    fewshot_path_ = o.get_string("fewshot_data", "");
    num_fewshot_ = o.get_int("num_fewshot", 5, 0, 64);
    KVB_USAGE_CHECK(mmlu_ || (!o.has("fewshot_data") && !o.has("num_fewshot")))
        << "task mc: fewshot_data and num_fewshot apply to format=mmlu (plain items carry their "
           "own fewshot field)";
    KVB_USAGE_CHECK(!mmlu_ || num_fewshot_ == 0 || !fewshot_path_.empty())
        << "task mc format=mmlu with num_fewshot=" << num_fewshot_
        << " needs --task-opt fewshot_data=FILE (the dev split, e.g. shared/data/mmlu/dev.jsonl) "
           "or num_fewshot=0";
  }

  std::string name() const override { return "mc"; }
  int version() const override { return 1; }
  std::vector<MetricInfo> metrics() const override { return {{"acc", true}, {"acc_norm", true}}; }

  std::vector<Sample> samples(const TaskContext& ctx) override {
    JsonlReadOptions ro;
    ro.option = "data";
    ro.how_to_obtain =
        "MMLU as jsonl is in shared/data/mmlu/; other sets (COPA, PIQA, ...) are "
        "converted by the user to lines with context|question, choices, gold";
    ro.limit = static_cast<size_t>(limit_);
    const JsonlFile f = read_jsonl(path_, ro);
    if (mmlu_ && num_fewshot_ > 0) load_fewshot();

    std::vector<Sample> out;
    out.reserve(f.items.size());
    for (size_t i = 0; i < f.items.size(); ++i) {
      const JsonlItem& it = f.items[i];
      Sample s;
      s.kind = SampleKind::kChoice;
      s.chat = false;
      const std::string subject = it.str_or("subject", "");
      s.id = (subject.empty() ? "mc" : subject) + "-" + std::to_string(i);
      if (!subject.empty()) s.fields["subject"] = subject;
      std::vector<std::string> choices = choices_of(it, mmlu_ ? 4 : 0);
      s.gold = gold_of(it, choices.size());
      if (mmlu_) {
        if (subject.empty()) it.fail("required key 'subject' is missing (format=mmlu)");
        s.context = mmlu_prefix(subject, it);
        s.question = mmlu_question(it, choices);
        s.choices = {" A", " B", " C", " D"};
        s.references = {"A", "B", "C", "D"};  // the scored strings, for acc_norm's byte length
      } else {
        s.context = plain_fewshot(it);
        if (it.has("context")) {
          s.context += it.str("context");
        } else if (it.has("question")) {
          s.question = it.str("question");
        } else {
          it.fail("required key 'context' (or 'question') is missing");
        }
        for (const std::string& c : choices) {
          if (c.empty()) it.fail("key 'choices' has an empty choice");
          s.choices.push_back(starts_with_space(c) ? c : " " + c);
        }
        s.references = choices;
      }
      // Room after the prompt for the longest choice (the runner scores it token by token).
      int longest = 1;
      for (const std::string& c : s.choices) {
        longest =
            std::max(longest, ctx.count_tokens ? ctx.count_tokens(c) : static_cast<int>(c.size()));
      }
      s.max_new_tokens = longest + 1;
      out.push_back(std::move(s));
    }
    return out;
  }

  Scores score(const Sample& sample, const Prediction& p) const override {
    const auto& ll = p.choice_logliks;
    KVB_CHECK(ll.size() == sample.choices.size() && sample.references.size() == ll.size())
        << "sample " << sample.id << ": " << ll.size() << " log-likelihoods for "
        << sample.choices.size() << " choices";
    size_t best = 0, best_norm = 0;
    auto norm = [&](size_t i) { return ll[i] / std::max<size_t>(1, sample.references[i].size()); };
    for (size_t i = 1; i < ll.size(); ++i) {  // ties: the first, as numpy argmax
      if (ll[i] > ll[best]) best = i;
      if (norm(i) > norm(best_norm)) best_norm = i;
    }
    const size_t gold = static_cast<size_t>(sample.gold);
    return {{"acc", best == gold ? 1.0 : 0.0}, {"acc_norm", best_norm == gold ? 1.0 : 0.0}};
  }

 private:
  // lm-eval first_n few-shot sampler: the subject's first num_fewshot dev items, in file order.
  void load_fewshot() {
    if (!fewshot_.empty()) return;
    JsonlReadOptions ro;
    ro.option = "fewshot_data";
    ro.how_to_obtain = "MMLU's dev split is shared/data/mmlu/dev.jsonl";
    const JsonlFile f = read_jsonl(fewshot_path_, ro);
    for (const JsonlItem& it : f.items) {
      const std::string subject = it.str("subject");
      std::vector<std::string>& shots = fewshot_[subject];
      if (static_cast<int>(shots.size()) >= num_fewshot_) continue;
      const std::vector<std::string> choices = choices_of(it, 4);
      const int gold = gold_of(it, choices.size());
      shots.push_back(mmlu_question(it, choices) + " " + static_cast<char>('A' + gold));
    }
  }

  std::string mmlu_prefix(const std::string& subject, const JsonlItem& it) const {
    std::string pretty = subject;
    std::replace(pretty.begin(), pretty.end(), '_', ' ');
    std::string p =
        "The following are multiple choice questions (with answers) about " + pretty + ".\n\n";
    if (num_fewshot_ == 0) return p;
    auto shots = fewshot_.find(subject);
    const size_t have = shots == fewshot_.end() ? 0 : shots->second.size();
    if (have < static_cast<size_t>(num_fewshot_)) {
      it.fail("subject '" + subject + "' has " + std::to_string(have) + " examples in " +
              fewshot_path_ + ", fewer than num_fewshot=" + std::to_string(num_fewshot_));
    }
    for (const std::string& shot : shots->second) p += shot + "\n\n";
    return p;
  }

  static std::string plain_fewshot(const JsonlItem& it) {
    if (!it.has("fewshot")) return "";
    if (it.json().at("fewshot").is_string()) return it.str("fewshot");
    std::string p;
    for (const std::string& shot : it.str_list("fewshot")) p += shot + "\n\n";
    return p;
  }

  std::string path_, fewshot_path_;
  bool mmlu_ = false;
  int limit_ = 0, num_fewshot_ = 5;
  std::map<std::string, std::vector<std::string>> fewshot_;  // subject -> rendered examples
};

}  // namespace

TaskInfo mc_task_info() {
  return {"mc",
          "lm-eval style multiple choice by continuation log-likelihood (no chat template): "
          "format=plain reads context|question, choices, gold (optional subject, fewshot); "
          "format=mmlu builds the standard k-shot MMLU prompt from the subject's dev items and "
          "scores \" A\"..\" D\". Metrics acc and acc_norm (loglik / UTF-8 bytes of the choice).",
          {{"data", "", "jsonl file (required)", {}},
           {"format", "plain", "item format", {"plain", "mmlu"}},
           {"fewshot_data", "", "format=mmlu: dev split jsonl with the few-shot examples", {}},
           {"num_fewshot", "5", "format=mmlu: examples per prompt (lm-eval first_n)", {}},
           {"limit", "0", "use the first N items (0: all)", {}}},
          [](const Options& o) { return std::make_unique<McTask>(o); }};
}

}  // namespace kvb::tasks
