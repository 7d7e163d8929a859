// `xsum`: one-sentence summarization on the XSum file H2O used (TASKS.md "xsum";
// FMInference/H2O h2o_hf/data/summarization_data/xsum_0shot.jsonl). Each line is a ready HELM
// request: `article` is the whole prompt ("###\nArticle: ...\n\nSummarize the above article in 1
// sentence.\n"), `summary_gt` the reference, `stop` the stop strings (["###"]), `max_tokens` 64.
// The prompt goes to the model as is (no chat template, as H2O's base-model runs). Metrics:
// ROUGE-1/2/L F-measure (Google's rouge-score, metrics::rouge_score), as fractions.
#include <climits>

#include "common/error.h"
#include "tasks/jsonl.h"
#include "tasks/metrics.h"
#include "tasks/tasks.h"

namespace kvb::tasks {

namespace {

class XsumTask : public Task {
 public:
  explicit XsumTask(const Options& o) {
    path_ = o.get_string("data", "");
    KVB_USAGE_CHECK(!path_.empty())
        << "task xsum needs --task-opt data=FILE (H2O's xsum_0shot.jsonl is in "
           "shared/data/xsum_h2o/)";
    limit_ = o.get_int("limit", 0, 0, INT_MAX);
    max_new_tokens_ = o.get_int("max_new_tokens", 64, 1, 1 << 20);
  }

  std::string name() const override { return "xsum"; }
  int version() const override { return 1; }
  std::vector<MetricInfo> metrics() const override {
    return {{"rouge_1", true}, {"rouge_2", true}, {"rouge_l", true}};
  }

  std::vector<Sample> samples(const TaskContext&) override {
    JsonlReadOptions ro;
    ro.option = "data";
    ro.how_to_obtain =
        "the file is FMInference/H2O's h2o_hf/data/summarization_data/xsum_0shot.jsonl (lines "
        "with article, summary_gt)";
    ro.limit = static_cast<size_t>(limit_);
    const JsonlFile f = read_jsonl(path_, ro);
    std::vector<Sample> out;
    out.reserve(f.items.size());
    for (size_t i = 0; i < f.items.size(); ++i) {
      const JsonlItem& it = f.items[i];
      Sample s;
      s.id = "xsum-" + std::to_string(i);
      s.kind = SampleKind::kGenerate;
      const std::string prompt = it.str("article");
      // The instruction after the last blank line is the question; the article is the context.
      const size_t cut = prompt.rfind("\n\n");
      s.context = cut == std::string::npos ? prompt : prompt.substr(0, cut);
      s.question = cut == std::string::npos ? "" : prompt.substr(cut);
      s.references = {it.str("summary_gt")};
      if (const auto stop = it.str_list_opt("stop")) {
        for (const std::string& st : *stop) {
          if (!st.empty()) s.stop_strings.push_back(st);
        }
      }
      s.chat = false;
      s.max_new_tokens = max_new_tokens_;
      out.push_back(std::move(s));
    }
    return out;
  }

  Scores score(const Sample& sample, const Prediction& prediction) const override {
    KVB_CHECK(!sample.references.empty()) << "sample " << sample.id << " has no reference";
    const metrics::RougeScores r = metrics::rouge_score(prediction.text, sample.references[0]);
    return {{"rouge_1", r.rouge_1}, {"rouge_2", r.rouge_2}, {"rouge_l", r.rouge_l}};
  }

 private:
  std::string path_;
  int limit_ = 0, max_new_tokens_ = 64;
};

}  // namespace

TaskInfo xsum_task_info() {
  return {"xsum",
          "XSum one-sentence summaries as H2O evaluated them: the file's ready prompt (article "
          "field) without chat template, its stop strings, greedy by default; ROUGE-1/2/L F "
          "(rouge-score tokenizer, no stemming) against summary_gt.",
          {{"data", "", "jsonl with article (the prompt) and summary_gt (required)", {}},
           {"limit", "0", "use the first N items (0: all)", {}},
           {"max_new_tokens", "64", "generation length (H2O's max_tokens)", {}}},
          [](const Options& o) { return std::make_unique<XsumTask>(o); }};
}

}  // namespace kvb::tasks
